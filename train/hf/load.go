// load.go: a checkpoint's tensors into a model's parameter layout, on a
// backend tensor (Load) or in host memory (LoadFloat32).
//
// Two passes: the first checks every parameter's tensor (present, shape,
// dtype, every value finite) and every tensor of the checkpoint (read by a
// parameter, or known to be harmless), touching nothing; only then does the
// second convert and upload, in chunks of chunkElems, so a refused
// checkpoint leaves the destination as it was. The mapped pages of a
// tensor read in order are released chunk by chunk; a transposed one is
// read across all its rows for every chunk, so its pages go once it is
// converted. The host holds LoadBytes: a chunk, or a transposed tensor's
// file bytes, besides the conversion buffers.

package hf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// chunkElems is the size of one conversion chunk (4 MB of float32; tests
// make it tiny to cross every boundary); the backend's staging moves it in
// pieces of its own.
var chunkElems = 1 << 20

// readElems is the elements of one chunk read in order from a mapped
// tensor: chunkElems rounded up to a multiple of 4, so that a chunk of
// 2- or 4-byte elements is whole 8 bytes (safetensors.File.Chunks).
func readElems() int { return (chunkElems + 3) &^ 3 }

// maxElemBytes is the widest element a checkpoint's weights may have
// (F32): LoadBytes, planned before the files are opened, assumes it.
const maxElemBytes = 4

// LoadBytes is the most host memory Load of layout holds, the backend's
// staging aside: the mapped pages of a chunk, or those of a transposed
// tensor (all of it, in the widest dtype), and the float32 chunk (or
// the rows of a transposed tensor that make one) and column converted
// from them.
func LoadBytes(layout []model.Param) int64 {
	var mapped, buf, col int64
	for _, p := range layout {
		n := int64(p.Len())
		if !p.Transposed {
			k := min(n, int64(readElems()))
			mapped, buf = max(mapped, maxElemBytes*k), max(buf, k)
			continue
		}
		in, out := p.Shape[0], p.Shape[1]
		rows := int64(transposeFetchRows(in, out))
		mapped, buf, col = max(mapped, maxElemBytes*n), max(buf, rows*int64(out)), max(col, rows)
	}
	return mapped + 4*(buf+col)
}

// LoadOptions adapt loading to a model family's names.
type LoadOptions struct {
	// Alt returns other names a parameter may be stored under, tried in
	// order after its own (GPT-2's hub files lack the "transformer."
	// prefix). Nil: none.
	Alt func(name string) []string
	// Tied maps a parameter that a checkpoint with tied embeddings does
	// not store (lm_head.weight) to the tensor it is then read from
	// (model.embed_tokens.weight, of the same Hugging Face shape). A
	// stored one is read as itself.
	Tied map[string]string
	// Extra accepts a checkpoint tensor that no parameter reads, beyond
	// the buffers Harmless names. Any other unread tensor is refused: it
	// means the layout and the checkpoint disagree (a bias the family
	// does not model, a different architecture), and ignoring it would
	// load a different model than the file holds.
	Extra func(name string) bool
}

// Harmless says whether an unread tensor is a buffer that transformers
// recomputes and older versions saved: the rotary inverse frequencies
// (LLaMA), the causal-mask buffers of GPT-2's attention.
func Harmless(name string) bool {
	for _, suf := range []string{".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"} {
		if strings.HasSuffix(name, suf) {
			return true
		}
	}
	return false
}

// source is where one parameter comes from, checked.
type source struct {
	p    model.Param
	name string // the tensor's name in the checkpoint
	f    *safetensors.File
	ti   safetensors.TensorInfo
}

// Load checks the checkpoint against layout, then writes every parameter
// into dst (F32, or BF16 rounded to nearest even; dst.Len() is the
// layout's element count) on stream s of be, in chunks, waiting for the
// uploads. Nothing is written unless every parameter checks out.
func (c *Checkpoint) Load(be backend.Backend, s backend.Stream, dst backend.Tensor, layout []model.Param, opt LoadOptions) error {
	if dst.DType != backend.F32 && dst.DType != backend.BF16 {
		return fmt.Errorf("hf: load of %s into %v: the destination must be F32 or BF16", c.Dir, dst)
	}
	n, err := layoutLen(layout)
	if err != nil {
		return err
	}
	if dst.Len() != n {
		return fmt.Errorf("hf: load of %s into %v: %d elements, the layout has %d", c.Dir, dst, dst.Len(), n)
	}
	return c.LoadEach(layout, opt, func(off int, vals []float32) error {
		return backend.Upload(be, s, dst.Slice(off, len(vals)), vals)
	})
}

// LoadEach checks the checkpoint against layout, then hands every
// parameter to sink in chunks (off: the chunk's layout offset, a chunk
// never crossing a parameter's end), a parameter after another in layout
// order. Nothing reaches sink unless every parameter checks out.
func (c *Checkpoint) LoadEach(layout []model.Param, opt LoadOptions, sink func(off int, vals []float32) error) error {
	srcs, err := c.check(layout, opt)
	if err != nil {
		return err
	}
	return c.convert(srcs, sink)
}

// LoadFloat32 is Load into host memory: every parameter as float32, in
// layout order, for small models and tests.
func (c *Checkpoint) LoadFloat32(layout []model.Param, opt LoadOptions) ([]float32, error) {
	n, err := layoutLen(layout)
	if err != nil {
		return nil, err
	}
	srcs, err := c.check(layout, opt) // before allocating: shapes bound n by the files' sizes
	if err != nil {
		return nil, err
	}
	out := make([]float32, n)
	err = c.convert(srcs, func(off int, vals []float32) error {
		copy(out[off:], vals)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// layoutLen is the element count of a layout, checking that its
// parameters are disjoint and back to back as train/model requires.
func layoutLen(layout []model.Param) (int, error) {
	off := 0
	for _, p := range layout {
		if p.Offset != off {
			return 0, fmt.Errorf("hf: layout: %s at offset %d, want %d", p.Name, p.Offset, off)
		}
		if p.Transposed && len(p.Shape) != 2 {
			return 0, fmt.Errorf("hf: layout: %s is transposed but has shape %v", p.Name, p.Shape)
		}
		off += p.Len()
	}
	return off, nil
}

// hfShape is the shape Hugging Face stores p in.
func hfShape(p model.Param) []int {
	if p.Transposed {
		return []int{p.Shape[1], p.Shape[0]}
	}
	return p.Shape
}

// check finds and checks every parameter's tensor and every unread
// tensor; it reads the values (for NaN and Inf) but writes nothing.
func (c *Checkpoint) check(layout []model.Param, opt LoadOptions) ([]source, error) {
	used := map[string]bool{}
	srcs := make([]source, 0, len(layout))
	for _, p := range layout {
		cands := []string{p.Name}
		if opt.Alt != nil {
			cands = append(cands, opt.Alt(p.Name)...)
		}
		name := ""
		for _, cand := range cands {
			if _, ok := c.where[cand]; ok {
				name = cand
				break
			}
		}
		if name == "" {
			if t, ok := opt.Tied[p.Name]; ok {
				if _, ok := c.where[t]; !ok {
					return nil, fmt.Errorf("hf: %s: tensor %q is missing, and so is %q it is tied to", c.where0(), p.Name, t)
				}
				name = t
			} else {
				return nil, fmt.Errorf("hf: %s: tensor %q is missing", c.where0(), p.Name)
			}
		}
		f := c.where[name]
		ti, _ := f.Info(name)
		if want := hfShape(p); !slices.Equal(ti.Shape, want) {
			return nil, fmt.Errorf("hf: %s: tensor %q: shape %v, the model needs %v", f.Path, name, ti.Shape, want)
		}
		switch ti.DType {
		case safetensors.F32, safetensors.BF16, safetensors.F16:
		default:
			return nil, fmt.Errorf("hf: %s: tensor %q: dtype %s, want F32, BF16 or F16", f.Path, name, ti.DType)
		}
		used[name] = true
		srcs = append(srcs, source{p: p, name: name, f: f, ti: ti})
	}
	var extra []string
	for _, n := range c.names {
		if !used[n] && !Harmless(n) && (opt.Extra == nil || !opt.Extra(n)) {
			extra = append(extra, n)
		}
	}
	if len(extra) > 0 {
		_, file, _ := c.Info(extra[0])
		more := ""
		if len(extra) > 1 {
			more = fmt.Sprintf(" (and %d more: %s)", len(extra)-1, strings.Join(extra[1:min(len(extra), 6)], ", "))
		}
		return nil, fmt.Errorf("hf: %s: tensor %q is not a parameter of this model%s", file, extra[0], more)
	}
	checked := map[string]bool{}
	for _, sc := range srcs {
		if checked[sc.name] {
			continue
		}
		checked[sc.name] = true
		bits, _ := sc.ti.DType.Bits()
		es := bits / 8
		i, bad, base := -1, float32(0), 0
		err := sc.f.Chunks(sc.name, readElems()*es, func(b []byte) error {
			if i, bad = firstNonFinite(b, sc.ti.DType); i >= 0 {
				i += base
				return errNonFinite
			}
			base += len(b) / es
			return nil
		})
		if i >= 0 {
			// The wording of checkpoint.NonFinite, which callers checked
			// before this package did (element: of the file's tensor).
			return nil, fmt.Errorf("hf: %s: tensor %s holds %v at element %d; refusing weights that are not finite", sc.f.Path, sc.name, bad, i)
		}
		if err != nil {
			return nil, fmt.Errorf("hf: %w", err)
		}
	}
	return srcs, nil
}

// where0 names the checkpoint for errors about a tensor it lacks: the
// index, or the single file.
func (c *Checkpoint) where0() string {
	if c.Index != "" {
		return c.Index
	}
	if len(c.files) == 1 {
		return c.files[0].Path
	}
	return c.Dir
}

// errNonFinite stops check's reading at a non-finite value (reported
// with its element, not as this error).
var errNonFinite = errors.New("not finite")

// firstNonFinite returns the index and value of the first NaN or Inf in
// raw (of dtype dt), or -1.
func firstNonFinite(raw []byte, dt safetensors.DType) (int, float32) {
	switch dt {
	case safetensors.F32:
		for i := 0; i+4 <= len(raw); i += 4 {
			if b := binary.LittleEndian.Uint32(raw[i:]); b&0x7f800000 == 0x7f800000 {
				return i / 4, math.Float32frombits(b)
			}
		}
	case safetensors.BF16:
		for i := 0; i+2 <= len(raw); i += 2 {
			if b := binary.LittleEndian.Uint16(raw[i:]); b&0x7f80 == 0x7f80 {
				return i / 2, bf16.ToFloat32(b)
			}
		}
	case safetensors.F16:
		for i := 0; i+2 <= len(raw); i += 2 {
			if b := binary.LittleEndian.Uint16(raw[i:]); b&0x7c00 == 0x7c00 {
				return i / 2, safetensors.F16ToFloat32(b)
			}
		}
	}
	return -1, 0
}

// convert reads every source into float32 chunks, transposing where the
// layout says, and hands each chunk to sink with its element offset.
func (c *Checkpoint) convert(srcs []source, sink func(off int, vals []float32) error) error {
	// Buffers as large as needed, up to a chunk: a tiny model (the fuzz
	// tests' few-kilobyte files) allocates tiny ones.
	var buf, col []float32
	grow := func(b []float32, n int) []float32 {
		if len(b) < n {
			return make([]float32, n)
		}
		return b
	}
	for _, sc := range srcs {
		bits, _ := sc.ti.DType.Bits()
		es := bits / 8
		if !sc.p.Transposed {
			// In order, a chunk at a time: each chunk's mapped pages go
			// as soon as it is converted.
			buf = grow(buf, min(sc.p.Len(), readElems()))
			off := 0
			err := sc.f.Chunks(sc.name, readElems()*es, func(b []byte) error {
				k := len(b) / es
				safetensors.Decode(buf[:k], b, sc.ti.DType)
				if err := sink(sc.p.Offset+off, buf[:k]); err != nil {
					return err
				}
				off += k
				return nil
			})
			if err != nil {
				return fmt.Errorf("hf: %s: tensor %q: %w", sc.f.Path, sc.name, err)
			}
			continue
		}
		raw, _, err := sc.f.Raw(sc.name)
		if err != nil {
			return fmt.Errorf("hf: %w", err)
		}
		// Ours is in x out, the file's out x in: rows [i0, i1) of ours
		// are columns [i0, i1) of the file, read row by row of the file
		// (contiguous runs of i1-i0 elements) and scattered.
		in, out := sc.p.Shape[0], sc.p.Shape[1]
		rows := transposeFetchRows(in, out)
		buf = grow(buf, rows*out)
		col = grow(col, rows)
		for i0 := 0; i0 < in; i0 += rows {
			k := min(rows, in-i0)
			for j := range out {
				safetensors.Decode(col[:k], raw[(j*in+i0)*es:(j*in+i0+k)*es], sc.ti.DType)
				for r, v := range col[:k] {
					buf[r*out+j] = v
				}
			}
			if err := sink(sc.p.Offset+i0*out, buf[:k*out]); err != nil {
				return fmt.Errorf("hf: %s: tensor %q: %w", sc.f.Path, sc.name, err)
			}
		}
		sc.f.Release(sc.name)
	}
	return nil
}

// SameValuesBytes is the most host memory SameValues holds for tensors
// of n elements: a decoded chunk of each and its mapped pages (in the
// widest dtype).
func SameValuesBytes(n int) int64 {
	k := int64(min(chunkElems, n))
	return 2 * (4*k + maxElemBytes*k)
}

// SameValues reports whether the tensors a and b hold the same values
// (as float32, == element by element, in storage order), reading both a
// chunk at a time and releasing each chunk's pages: a tied head stored
// beside its embedding is checked without either in memory whole.
func (c *Checkpoint) SameValues(a, b string) (bool, error) {
	fa, okA := c.where[a]
	fb, okB := c.where[b]
	if !okA || !okB {
		return false, fmt.Errorf("hf: %s: no tensor %q or %q", c.Dir, a, b)
	}
	ra, ta, err := fa.Raw(a)
	if err != nil {
		return false, fmt.Errorf("hf: %w", err)
	}
	rb, tb, err := fb.Raw(b)
	if err != nil {
		return false, fmt.Errorf("hf: %w", err)
	}
	for _, ti := range []safetensors.TensorInfo{ta, tb} {
		switch ti.DType {
		case safetensors.F32, safetensors.BF16, safetensors.F16:
		default:
			return false, fmt.Errorf("hf: %s: tensor %q has dtype %s, want F32, BF16 or F16", c.Dir, ti.Name, ti.DType)
		}
	}
	n := ta.NumElements()
	if n != tb.NumElements() {
		return false, nil
	}
	bitsA, _ := ta.DType.Bits()
	bitsB, _ := tb.DType.Bits()
	ea, eb := int(bitsA/8), int(bitsB/8)
	va, vb := make([]float32, min(int64(chunkElems), n)), make([]float32, min(int64(chunkElems), n))
	for off := 0; off < int(n); off += chunkElems {
		k := min(chunkElems, int(n)-off)
		safetensors.Decode(va[:k], ra[off*ea:(off+k)*ea], ta.DType)
		safetensors.Decode(vb[:k], rb[off*eb:(off+k)*eb], tb.DType)
		fa.ReleaseBytes(ta, off*ea, (off+k)*ea)
		fb.ReleaseBytes(tb, off*eb, (off+k)*eb)
		if !slices.Equal(va[:k], vb[:k]) {
			return false, nil
		}
	}
	return true, nil
}
