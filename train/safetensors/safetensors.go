// Package safetensors reads and writes the Hugging Face safetensors format:
// an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the data section; offsets are relative to the
// start of the data section, and data is little-endian, row-major.
//
// Limits: Open reads the whole file into memory; OpenMapped maps it
// instead (Linux; elsewhere it reads too), so a multi-gigabyte shard costs
// no heap and Release returns a consumed tensor's pages. Validation is as strict as the reference implementation:
// tensors must tile the data section exactly (no overlap, gap or trailing
// bytes). Conversions exist for F32/BF16/F16 to float32 and I64/I32 to int64.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// maxHeader bounds the JSON header (the reference implementation uses 100 MB)
// so a corrupt length cannot make us allocate or scan absurd amounts.
const maxHeader = 100 << 20

// TensorInfo describes one tensor in a file. Begin and End are byte offsets
// into the data section (as in the header), End exclusive.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	Begin int64
	End   int64
}

// NumElements returns the product of the shape (1 for a scalar).
func (ti TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range ti.Shape {
		n *= int64(d)
	}
	return n
}

// File is an opened, fully validated safetensors file held in memory.
type File struct {
	Path     string            // the path it was opened from
	Metadata map[string]string // the "__metadata__" entry; empty map if absent

	data   []byte // the data section
	mapped []byte // the whole mapping, for OpenMapped files; nil otherwise
	// fd and dataOff: an OpenStream file, read by Chunks (data is nil).
	fd      *os.File
	dataOff int64
	chunk   []byte
	closed  bool
	infos   map[string]TensorInfo
	names   []string // sorted
}

// Open reads the file at path and validates its header and layout. Every
// error names the file and, where one is at fault, the tensor.
func Open(path string) (*File, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	f, err := parse(path, buf)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return f, nil
}

// headerEntry is one tensor's JSON record; pointers detect missing fields.
type headerEntry struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

func parse(path string, buf []byte) (*File, error) {
	hlen, err := headerLen(buf, int64(len(buf)))
	if err != nil {
		return nil, err
	}
	f, err := parseHeader(path, buf[8:8+hlen], int64(len(buf))-8-hlen)
	if err != nil {
		return nil, err
	}
	f.data = buf[8+hlen:]
	return f, nil
}

// headerLen reads the header's length from the first bytes of a file of
// size bytes (at least 8 of them in b) and checks it against the file.
func headerLen(b []byte, size int64) (int64, error) {
	if size < 8 || len(b) < 8 {
		return 0, fmt.Errorf("file is %d bytes, shorter than the 8-byte header length", size)
	}
	hlen := binary.LittleEndian.Uint64(b[:8])
	if hlen > uint64(size-8) {
		return 0, fmt.Errorf("header length %d is larger than the %d bytes after it", hlen, size-8)
	}
	if hlen > maxHeader {
		return 0, fmt.Errorf("header length %d exceeds the %d-byte limit", hlen, maxHeader)
	}
	return int64(hlen), nil
}

// parseHeader validates the JSON header and the layout of a data section
// of dataLen bytes.
func parseHeader(path string, header []byte, dataLen int64) (*File, error) {
	raw, err := decodeObject(header)
	if err != nil {
		return nil, fmt.Errorf("bad JSON header: %w", err)
	}
	f := &File{Path: path, Metadata: map[string]string{}, infos: map[string]TensorInfo{}}
	for _, kv := range raw {
		if kv.key == metaKey {
			if f.Metadata, err = decodeMetadata(kv.val); err != nil {
				return nil, fmt.Errorf("bad JSON header: %s: %w", metaKey, err)
			}
			continue
		}
		ti, err := parseEntry(kv.key, kv.val)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", kv.key, err)
		}
		f.infos[kv.key] = ti
		f.names = append(f.names, kv.key)
	}
	sort.Strings(f.names)
	if err := checkLayout(f, dataLen); err != nil {
		return nil, err
	}
	return f, nil
}

// OpenStream opens path for reading its tensors a chunk at a time
// (Chunks, with pread into one buffer of the chunk's size), reading and
// validating only its header: nothing of the data is held or mapped, so
// a reader's resident memory is its chunk whatever the file's size (a
// mapped file's pages count as resident until given back, and the
// kernel maps more than it is asked to). Raw and Float32 are refused;
// Close closes the file.
func OpenStream(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	f, err := openStream(path, fd)
	if err != nil {
		fd.Close()
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return f, nil
}

func openStream(path string, fd *os.File) (*File, error) {
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	size := st.Size()
	var n [8]byte
	if size >= 8 {
		if _, err := fd.ReadAt(n[:], 0); err != nil {
			return nil, err
		}
	}
	hlen, err := headerLen(n[:], size)
	if err != nil {
		return nil, err
	}
	header := make([]byte, hlen)
	if _, err := fd.ReadAt(header, 8); err != nil {
		return nil, err
	}
	f, err := parseHeader(path, header, size-8-hlen)
	if err != nil {
		return nil, err
	}
	f.fd, f.dataOff = fd, 8+hlen
	return f, nil
}

// parseEntry validates one tensor record on its own (dtype, shape, size).
func parseEntry(name string, val json.RawMessage) (TensorInfo, error) {
	if name == "" {
		return TensorInfo{}, errors.New("empty tensor name")
	}
	var e headerEntry
	if err := json.Unmarshal(val, &e); err != nil {
		return TensorInfo{}, fmt.Errorf("bad JSON: %w", err)
	}
	switch {
	case e.DType == nil:
		return TensorInfo{}, errors.New(`missing "dtype"`)
	case e.Shape == nil:
		return TensorInfo{}, errors.New(`missing "shape"`)
	case e.DataOffsets == nil:
		return TensorInfo{}, errors.New(`missing "data_offsets"`)
	}
	dt := DType(*e.DType)
	bits, ok := dtypeBits[dt]
	if !ok {
		return TensorInfo{}, fmt.Errorf("unknown dtype %q", *e.DType)
	}
	ti := TensorInfo{Name: name, DType: dt, Shape: make([]int, len(*e.Shape))}
	numel := int64(1)
	for i, d := range *e.Shape {
		if d < 0 || d > math.MaxInt {
			return TensorInfo{}, fmt.Errorf("shape %v: dimension %d is out of range", *e.Shape, d)
		}
		if d != 0 && numel > math.MaxInt64/8/d {
			return TensorInfo{}, fmt.Errorf("shape %v: element count overflows", *e.Shape)
		}
		numel *= d
		ti.Shape[i] = int(d)
	}
	off := *e.DataOffsets
	if len(off) != 2 {
		return TensorInfo{}, fmt.Errorf("data_offsets has %d entries, want 2", len(off))
	}
	ti.Begin, ti.End = off[0], off[1]
	if ti.Begin < 0 || ti.End < ti.Begin {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] out of range", ti.Begin, ti.End)
	}
	if numel*bits%8 != 0 {
		return TensorInfo{}, fmt.Errorf("shape %v of %s is not a whole number of bytes", ti.Shape, dt)
	}
	if want := numel * bits / 8; ti.End-ti.Begin != want {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] span %d bytes, but %s %v needs %d",
			ti.Begin, ti.End, ti.End-ti.Begin, dt, ti.Shape, want)
	}
	return ti, nil
}

// checkLayout verifies that the tensors tile the data section: sorted by
// offset, each begins where the previous ended, and the last ends at the end
// of the file. Truncation is reported first because it is the common failure
// (an interrupted copy or download).
func checkLayout(f *File, dataLen int64) error {
	byOff := make([]TensorInfo, 0, len(f.infos))
	var maxEnd int64
	for _, n := range f.names {
		ti := f.infos[n]
		byOff = append(byOff, ti)
		maxEnd = max(maxEnd, ti.End)
	}
	if maxEnd > dataLen {
		return fmt.Errorf("truncated: header says %d bytes of data, file has %d", maxEnd, dataLen)
	}
	slices.SortFunc(byOff, func(a, b TensorInfo) int {
		if a.Begin != b.Begin {
			return cmpInt64(a.Begin, b.Begin)
		}
		return cmpInt64(a.End, b.End)
	})
	var pos int64
	prev := ""
	for _, ti := range byOff {
		switch {
		case ti.Begin < pos:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q, which ends at %d",
				ti.Name, ti.Begin, ti.End, prev, pos)
		case ti.Begin > pos:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a gap of %d bytes after offset %d",
				ti.Name, ti.Begin, ti.End, ti.Begin-pos, pos)
		}
		pos, prev = ti.End, ti.Name
	}
	if pos != dataLen {
		return fmt.Errorf("%d trailing bytes after the last tensor (data section is %d bytes, tensors cover %d)",
			dataLen-pos, dataLen, pos)
	}
	return nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

type keyVal struct {
	key string
	val json.RawMessage
}

// decodeObject decodes a JSON object keeping its keys in order and rejecting
// duplicate keys, which encoding/json would silently collapse. Anything but
// whitespace after the object is an error.
func decodeObject(b []byte) ([]keyVal, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want a JSON object, found %v", tok)
	}
	var out []keyVal
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("want an object key, found %v", tok)
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate name %q", key)
		}
		seen[key] = true
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, err)
		}
		out = append(out, keyVal{key, val})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the JSON object")
	}
	return out, nil
}

// decodeMetadata decodes "__metadata__": a flat object of strings.
func decodeMetadata(b json.RawMessage) (map[string]string, error) {
	kvs, err := decodeObject(b)
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		var s string
		if err := json.Unmarshal(kv.val, &s); err != nil {
			return nil, fmt.Errorf("value of %q is not a string", kv.key)
		}
		m[kv.key] = s
	}
	return m, nil
}

// Close releases the file's memory: it unmaps a mapped file. The bytes Raw
// returned must not be used afterwards. Closing twice is harmless.
func (f *File) Close() error {
	f.closed = true
	if f.fd != nil {
		err := f.fd.Close()
		f.fd, f.chunk = nil, nil
		if err != nil {
			return fmt.Errorf("safetensors: %w", err)
		}
		return nil
	}
	return f.unmap()
}

// Mapped says whether the file's bytes are a memory mapping (OpenMapped).
func (f *File) Mapped() bool { return f.mapped != nil }

// Release tells a mapped file that the named tensor's bytes are consumed:
// their pages leave this process's resident memory (the kernel's page
// cache may keep them, and a later read pages them back in). Loading a
// model tensor by tensor and releasing each keeps its resident memory near
// one tensor's size instead of the file's. For a file read into memory it
// does nothing.
func (f *File) Release(name string) {
	ti, ok := f.infos[name]
	if !ok || f.mapped == nil {
		return
	}
	base := len(f.mapped) - len(f.data)
	f.release(base+int(ti.Begin), base+int(ti.End))
}

// Chunks hands the named tensor's bytes to fn in order, chunk bytes at a
// time (the last chunk shorter), and for a mapped file releases each
// chunk's pages once fn returns, so that a reader of a tensor larger
// than its buffers (a checkpoint's whole parameters in one tensor) keeps
// a chunk resident, not the tensor. chunk must be a positive multiple of
// 8, so that no element of any dtype straddles two chunks. The bytes
// alias the file's buffer and are valid only during the call.
func (f *File) Chunks(name string, chunk int, fn func(b []byte) error) error {
	if chunk <= 0 || chunk%8 != 0 {
		return fmt.Errorf("safetensors: %s: tensor %q read in chunks of %d bytes, want a positive multiple of 8", f.Path, name, chunk)
	}
	if f.dataOff > 0 {
		return f.streamChunks(name, chunk, fn)
	}
	raw, ti, err := f.Raw(name)
	if err != nil {
		return err
	}
	for off := 0; off < len(raw); off += chunk {
		n := min(chunk, len(raw)-off)
		err := fn(raw[off : off+n : off+n])
		f.ReleaseBytes(ti, off, off+n)
		if err != nil {
			return err
		}
	}
	return nil
}

// streamChunks is Chunks of an OpenStream file: each chunk read with
// pread into the file's one buffer.
func (f *File) streamChunks(name string, chunk int, fn func(b []byte) error) error {
	ti, ok := f.infos[name]
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", f.Path, name)
	}
	if f.closed {
		return fmt.Errorf("safetensors: %s: tensor %q read after Close", f.Path, name)
	}
	n := ti.End - ti.Begin
	if int64(len(f.chunk)) < min(int64(chunk), n) {
		f.chunk = make([]byte, min(int64(chunk), n))
	}
	for off := int64(0); off < n; off += int64(chunk) {
		b := f.chunk[:min(int64(chunk), n-off)]
		if _, err := f.fd.ReadAt(b, f.dataOff+ti.Begin+off); err != nil {
			return fmt.Errorf("safetensors: %s: tensor %q: %w", f.Path, name, err)
		}
		if err := fn(b); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseBytes is Release of the bytes [lo, hi) of the tensor ti (as
// Info or Raw describe it) alone: for a reader that walks a tensor, or
// two at once, a chunk at a time.
func (f *File) ReleaseBytes(ti TensorInfo, lo, hi int) {
	if f.mapped == nil {
		return
	}
	base := len(f.mapped) - len(f.data) + int(ti.Begin)
	f.release(base+lo, base+hi)
}

// Names returns the tensor names, sorted.
func (f *File) Names() []string { return slices.Clone(f.names) }

// Info returns the description of the named tensor.
func (f *File) Info(name string) (TensorInfo, bool) {
	ti, ok := f.infos[name]
	if ok {
		ti.Shape = slices.Clone(ti.Shape)
	}
	return ti, ok
}

// Raw returns the named tensor's bytes (little-endian, row-major) and its
// description. The bytes alias the file's buffer: callers must not modify them.
func (f *File) Raw(name string) ([]byte, TensorInfo, error) {
	ti, ok := f.Info(name)
	if !ok {
		return nil, TensorInfo{}, fmt.Errorf("safetensors: %s: no tensor %q", f.Path, name)
	}
	if f.dataOff > 0 {
		return nil, TensorInfo{}, fmt.Errorf("safetensors: %s: tensor %q: the file is open for streaming (OpenStream): read it with Chunks", f.Path, name)
	}
	if f.closed {
		return nil, TensorInfo{}, fmt.Errorf("safetensors: %s: tensor %q read after Close", f.Path, name)
	}
	return f.data[ti.Begin:ti.End:ti.End], ti, nil
}

// Float32 returns the named tensor converted to float32, and its shape.
// F32, BF16 and F16 are accepted (the widening is exact); other dtypes are
// an error.
func (f *File) Float32(name string) ([]float32, []int, error) {
	b, ti, err := f.Raw(name)
	if err != nil {
		return nil, nil, err
	}
	// The dtype is checked before allocating: a U8 or F4 tensor would
	// otherwise cost 4 or 8 bytes of float32 per byte of file for nothing.
	switch ti.DType {
	case F32, BF16, F16:
	default:
		return nil, nil, fmt.Errorf("safetensors: %s: tensor %q has dtype %s, want F32, BF16 or F16", f.Path, name, ti.DType)
	}
	out := make([]float32, ti.NumElements())
	Decode(out, b, ti.DType)
	return out, ti.Shape, nil
}

// Decode widens raw, len(dst) little-endian elements of dt (F32, BF16 or
// F16; any other leaves dst as it is), into dst exactly.
func Decode(dst []float32, raw []byte, dt DType) {
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = bf16.ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = f16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	}
}

// Int64 returns the named tensor converted to int64, and its shape. I64 and
// I32 are accepted; other dtypes are an error.
func (f *File) Int64(name string) ([]int64, []int, error) {
	b, ti, err := f.Raw(name)
	if err != nil {
		return nil, nil, err
	}
	if ti.DType != I64 && ti.DType != I32 {
		return nil, nil, fmt.Errorf("safetensors: %s: tensor %q has dtype %s, want I64 or I32", f.Path, name, ti.DType)
	}
	out := make([]int64, ti.NumElements())
	switch ti.DType {
	case I64:
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
	case I32:
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
	}
	return out, ti.Shape, nil
}

// shapeString formats a shape as JSON ("[2,3]"; "[]" for a scalar).
func shapeString(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = strconv.Itoa(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}
