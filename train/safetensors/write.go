// write.go: builds tensors from Go slices and writes safetensors files
// atomically.
//
// Limits: the whole header is built in memory; tensor data is streamed from
// the given slices (Write) or from a callback, tensor by tensor
// (WriteStream), so that an export needs no copy of the whole file in
// memory; metadata known only after the data (checksums) is written into
// the header in place at the end (WriteStreamMeta). Tensors are laid out
// in the order given, back to back.

package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
)

// Tensor is one tensor to write: its bytes are little-endian, row-major, of
// exactly (element size x product of Shape) bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// F32Tensor encodes v as an F32 tensor. A length that does not match shape is
// reported by Write.
func F32Tensor(name string, shape []int, v []float32) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Tensor{Name: name, DType: F32, Shape: slices.Clone(shape), Data: b}
}

// BF16Tensor encodes v (bfloat16 bit patterns) as a BF16 tensor.
func BF16Tensor(name string, shape []int, v []uint16) Tensor {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return Tensor{Name: name, DType: BF16, Shape: slices.Clone(shape), Data: b}
}

// I64Tensor encodes v as an I64 tensor.
func I64Tensor(name string, shape []int, v []int64) Tensor {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return Tensor{Name: name, DType: I64, Shape: slices.Clone(shape), Data: b}
}

// Write writes tensors and metadata to path atomically (via atomicfile):
// the data of the tensors in the given order, the JSON header listing
// "__metadata__" first (when non-empty) and then the tensors in that order,
// padded with spaces to a multiple of 8 bytes as Hugging Face does so the
// data section is 8-byte aligned.
func Write(path string, tensors []Tensor, metadata map[string]string) error {
	specs := make([]Spec, len(tensors))
	sizes := make([]int64, len(tensors))
	for i, t := range tensors {
		specs[i] = Spec{Name: t.Name, DType: t.DType, Shape: t.Shape}
		sizes[i] = int64(len(t.Data))
	}
	header, err := buildHeader(specs, sizes, metadata)
	if err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	err = atomicfile.WriteFile(path, 0o644, func(w io.Writer) error {
		if err := writeHeader(w, header); err != nil {
			return err
		}
		for _, t := range tensors {
			if _, err := w.Write(t.Data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// Spec describes a tensor that WriteStream writes: its bytes come from the
// callback.
type Spec struct {
	Name  string
	DType DType
	Shape []int
}

// Bytes is the size of the tensor's data, or -1 for an unknown dtype or a
// shape that is negative or not a whole number of bytes.
func (s Spec) Bytes() int64 {
	bits, ok := dtypeBits[s.DType]
	if !ok {
		return -1
	}
	numel := int64(1)
	for _, d := range s.Shape {
		if d < 0 || d != 0 && numel > math.MaxInt64/8/int64(d) {
			return -1
		}
		numel *= int64(d)
	}
	if numel*bits%8 != 0 {
		return -1
	}
	return numel * bits / 8
}

// WriteStream writes a safetensors file of the tensors specs describes to
// path atomically, as Write does, taking each tensor's bytes from fill:
// fill(i, w) must write exactly specs[i].Bytes() bytes to w, and is called
// once per tensor, in order. The file holds only what fill writes, so a
// caller converting from a device tensor chunk by chunk never holds more
// than its chunk. Any error (from fill, or a wrong byte count) leaves path
// untouched.
func WriteStream(path string, specs []Spec, metadata map[string]string, fill func(i int, w io.Writer) error) error {
	return WriteStreamMeta(path, specs, metadata, fill, nil)
}

// WriteStreamMeta is WriteStream for metadata known only once every
// tensor is written (the checksums of their bytes): the header is written
// first with draft as its metadata, and once fill has written the last
// tensor, rewritten in place with final()'s, which must encode to the
// same length (checksums of a fixed number of hex digits in the draft's
// keys). A nil final keeps the draft. The file is renamed into place only
// after the rewrite, so no reader sees the draft.
func WriteStreamMeta(path string, specs []Spec, draft map[string]string, fill func(i int, w io.Writer) error, final func() map[string]string) error {
	sizes := make([]int64, len(specs))
	for i, sp := range specs {
		sizes[i] = sp.Bytes()
	}
	header, err := buildHeader(specs, sizes, draft)
	if err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	err = atomicfile.WritePatched(path, 0o644, func(w io.Writer, patch atomicfile.Patch) error {
		if err := writeHeader(w, header); err != nil {
			return err
		}
		for i, sp := range specs {
			cw := &countWriter{w: w, left: sizes[i]}
			if err := fill(i, cw); err != nil {
				return fmt.Errorf("%s: tensor %q: %w", path, sp.Name, err)
			}
			if cw.left != 0 {
				return fmt.Errorf("%s: tensor %q: %d bytes written, want %d", path, sp.Name, sizes[i]-cw.left, sizes[i])
			}
		}
		if final == nil {
			return nil
		}
		h, err := buildHeader(specs, sizes, final())
		if err != nil {
			return err
		}
		if len(h) != len(header) {
			return fmt.Errorf("%s: the final metadata makes a header of %d bytes, the draft's has %d", path, len(h), len(header))
		}
		return patch(8, h)
	})
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// countWriter passes at most left bytes on and refuses more, so that a
// callback writing too much fails before it corrupts the next tensor.
type countWriter struct {
	w    io.Writer
	left int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	if int64(len(b)) > c.left {
		return 0, fmt.Errorf("%d bytes more than the tensor holds", int64(len(b))-c.left)
	}
	n, err := c.w.Write(b)
	c.left -= int64(n)
	return n, err
}

func writeHeader(w io.Writer, header []byte) error {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err := w.Write(header)
	return err
}

// buildHeader validates the tensors (sizes[i]: the bytes of tensor i's
// data) and returns the padded JSON header.
func buildHeader(specs []Spec, sizes []int64, metadata map[string]string) ([]byte, error) {
	var sb strings.Builder
	sb.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			sb.WriteByte(',')
		}
		first = false
	}
	if len(metadata) > 0 {
		m, err := json.Marshal(metadata) // keys sorted: deterministic output
		if err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		sep()
		sb.WriteString(`"` + metaKey + `":`)
		sb.Write(m)
	}
	seen := map[string]bool{}
	var off int64
	for i, t := range specs {
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("tensor %d has an empty name", i)
		case t.Name == metaKey:
			return nil, fmt.Errorf("tensor %d: name %q is reserved", i, metaKey)
		case seen[t.Name]:
			return nil, fmt.Errorf("duplicate tensor name %q", t.Name)
		}
		seen[t.Name] = true
		bits, ok := dtypeBits[t.DType]
		if !ok {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		numel := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			numel *= int64(d)
		}
		if numel*bits%8 != 0 || numel*bits/8 != sizes[i] {
			return nil, fmt.Errorf("tensor %q: %d bytes of data, but %s %v needs %d bits",
				t.Name, sizes[i], t.DType, t.Shape, numel*bits)
		}
		name, _ := json.Marshal(t.Name)
		sep()
		sb.Write(name)
		sb.WriteString(`:{"dtype":"` + string(t.DType) + `","shape":` + shapeString(t.Shape) +
			`,"data_offsets":[` + strconv.FormatInt(off, 10) + "," + strconv.FormatInt(off+sizes[i], 10) + "]}")
		off += sizes[i]
	}
	sb.WriteByte('}')
	for sb.Len()%8 != 0 {
		sb.WriteByte(' ')
	}
	return []byte(sb.String()), nil
}
