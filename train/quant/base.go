// Base: a model's block matrices quantized on the device (model.Base),
// and the streams that load, save and export them as the full layout.

package quant

import (
	"fmt"
	"math"
	"sort"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// fetchChunk is the most elements Fetch dequantizes at once: the size of
// Base's device scratch (in the model dtype).
const fetchChunk = 1 << 20

// Base holds every block matrix of a model quantized, each stored as the
// model stores it (in x out, row-major: blocks run along a row, so for
// LLaMA along the output dimension, where bitsandbytes' Linear4bit, which
// quantizes torch's out x in, runs along the input; the same block size
// and statistics). It is the model's model.Base in lora mode with
// --base-dtype nf4|int8: frozen, read by the GemmQ op, never written after
// the load. docs/DESIGN.md, "Quantized base".
type Base struct {
	be     backend.Backend
	Format backend.QFormat
	dt     backend.DType // the model's: what Fetch rounds the values to
	idx    *model.Index
	offs   []int // the model's Params offsets (Storage.ParamOffsets)
	params backend.Tensor

	words, floats, scratch backend.Tensor
	mats                   map[int]backend.Quant // by layout index

	pending map[int]*pending // Store: matrices not yet whole
}

// pending is a matrix being loaded: its values as they arrive.
type pending struct {
	vals []float32
	got  int
}

// sizes is where each matrix's tensors sit in Base's two allocations.
type sizes struct {
	words, floats int // elements of each allocation
	at            map[int][2]int
}

func layoutSizes(idx *model.Index, f backend.QFormat) sizes {
	sz := sizes{floats: backend.QBookLen, at: map[int][2]int{}}
	for _, row := range idx.MatParam {
		for _, i := range row {
			n := idx.Layout[i].Len()
			sz.at[i] = [2]int{sz.words, sz.floats}
			sz.words += backend.Words(f.CodeBytes(n)) + backend.Words(backend.QBlocks(n))
			sz.floats += backend.QGroups(n) + 1
		}
	}
	return sz
}

// scratchLen is the elements of Fetch's device scratch.
func scratchLen(idx *model.Index) int {
	n := 0
	for _, row := range idx.MatParam {
		for _, i := range row {
			n = max(n, idx.Layout[i].Len())
		}
	}
	return min(n, fetchChunk)
}

// Bytes is the device memory NewBase allocates for idx's matrices in
// format f with a model of dtype dt: codes, absmax codes, scales, the
// codebook and Fetch's scratch.
func Bytes(idx *model.Index, f backend.QFormat, dt backend.DType) int64 {
	sz := layoutSizes(idx, f)
	return 4*int64(sz.words+sz.floats) + int64(scratchLen(idx))*int64(dt.Size())
}

// LoadBytes is the most host memory Store holds: one matrix as it
// arrives, and its codes.
func LoadBytes(idx *model.Index, f backend.QFormat) int64 {
	var most int64
	for _, row := range idx.MatParam {
		for _, i := range row {
			n := idx.Layout[i].Len()
			most = max(most, 4*int64(n)+backend.QuantBytes(f, n))
		}
	}
	return most
}

// NewBase allocates the quantized matrices of idx on be, zero until
// Store fills them; dt is the model's dtype.
func NewBase(be backend.Backend, idx *model.Index, f backend.QFormat, dt backend.DType) (*Base, error) {
	if f != backend.NF4 && f != backend.Int8 {
		return nil, fmt.Errorf("quant: unknown format %v", f)
	}
	b := &Base{be: be, Format: f, dt: dt, idx: idx, mats: map[int]backend.Quant{}, pending: map[int]*pending{}}
	sz := layoutSizes(idx, f)
	var err error
	if b.words, err = be.Alloc("quantized base codes", sz.words, backend.I32); err != nil {
		return nil, fmt.Errorf("quantized base: %w", err)
	}
	if b.floats, err = be.Alloc("quantized base scales", sz.floats, backend.F32); err != nil {
		b.Free()
		return nil, fmt.Errorf("quantized base: %w", err)
	}
	if b.scratch, err = be.Alloc("quantized base scratch", max(1, scratchLen(idx)), dt); err != nil {
		b.Free()
		return nil, fmt.Errorf("quantized base: %w", err)
	}
	book := b.floats.Slice(0, backend.QBookLen)
	for i, at := range sz.at {
		p := idx.Layout[i]
		n := p.Len()
		cw, aw := backend.Words(f.CodeBytes(n)), backend.Words(backend.QBlocks(n))
		b.mats[i] = backend.Quant{Format: f, Rows: p.Shape[0], Cols: p.Shape[1],
			Codes: b.words.Slice(at[0], cw), Absmax: b.words.Slice(at[0]+cw, aw),
			Scale: b.floats.Slice(at[1], backend.QGroups(n)+1), Book: book}
	}
	if err := backend.Upload(be, be.DefaultStream(), book, Book()); err != nil {
		b.Free()
		return nil, fmt.Errorf("quantized base: codebook: %w", err)
	}
	return b, nil
}

// Bind tells b where the model keeps the other parameters (its Params
// and Storage.ParamOffsets), which Store and Fetch read and write.
func (b *Base) Bind(params backend.Tensor, offs []int) { b.params, b.offs = params, offs }

// Free releases b's device memory.
func (b *Base) Free() {
	for _, t := range []*backend.Tensor{&b.words, &b.floats, &b.scratch} {
		if t.Buf != nil {
			b.be.Free(*t)
			*t = backend.Tensor{}
		}
	}
}

// Matrix is the quantized matrix k of block l.
func (b *Base) Matrix(l, k int) backend.Quant { return b.mats[b.idx.MatParam[l][k]] }

// Forward implements model.Base: Y = X W, W stored m x n.
func (b *Base) Forward(s backend.Stream, l, k, rows int, X, Y backend.Tensor) error {
	mt := b.idx.Mats[k]
	return b.be.GemmQ(s, false, rows, mt.N, mt.M, 1, X, b.Matrix(l, k), 0, Y)
}

// InputGrad implements model.Base: dX = dY W^T + beta dX.
func (b *Base) InputGrad(s backend.Stream, l, k, rows int, dY, dX backend.Tensor, beta float32) error {
	mt := b.idx.Mats[k]
	return b.be.GemmQ(s, true, rows, mt.M, mt.N, 1, dY, b.Matrix(l, k), beta, dX)
}

// span is the part of [off, off+n) of the layout inside parameter i,
// as offsets within the parameter and within the chunk.
type span struct{ i, lo, hi, at int }

// spans splits [off, off+n) of the layout by parameter.
func (b *Base) spans(off, n int) ([]span, error) {
	lay := b.idx.Layout
	last := lay[len(lay)-1]
	if off < 0 || n < 0 || off+n > last.Offset+last.Len() {
		return nil, fmt.Errorf("quantized base: elements [%d, %d) of a layout of %d", off, off+n, last.Offset+last.Len())
	}
	i := sort.Search(len(lay), func(i int) bool { return lay[i].Offset+lay[i].Len() > off })
	var out []span
	for end := off + n; i < len(lay) && lay[i].Offset < end; i++ {
		p := lay[i]
		lo, hi := max(off, p.Offset), min(end, p.Offset+p.Len())
		if lo < hi {
			out = append(out, span{i, lo - p.Offset, hi - p.Offset, lo - off})
		}
	}
	return out, nil
}

// Store writes vals, elements off.. of the full layout, on stream s: the
// other parameters straight into Params, each block matrix into a host
// buffer until it is whole, when it is quantized and uploaded. Loaders
// hand it a parameter at a time, so the host holds one matrix (LoadBytes).
func (b *Base) Store(s backend.Stream, off int, vals []float32) error {
	sp, err := b.spans(off, len(vals))
	if err != nil {
		return err
	}
	for _, x := range sp {
		v := vals[x.at : x.at+x.hi-x.lo]
		if !b.idx.IsMat[x.i] {
			if err := backend.Upload(b.be, s, b.params.Slice(b.offs[x.i]+x.lo, len(v)), v); err != nil {
				return fmt.Errorf("%s: %w", b.idx.Layout[x.i].Name, err)
			}
			continue
		}
		if err := b.storeMatrix(s, x, v); err != nil {
			return err
		}
	}
	return nil
}

// storeMatrix adds v to matrix x.i's buffer and uploads the matrix,
// quantized, when it is whole.
func (b *Base) storeMatrix(s backend.Stream, x span, v []float32) error {
	p := b.idx.Layout[x.i]
	pd := b.pending[x.i]
	if pd == nil {
		pd = &pending{vals: make([]float32, p.Len())}
		b.pending[x.i] = pd
	}
	copy(pd.vals[x.lo:], v)
	pd.got += len(v)
	if pd.got < p.Len() {
		return nil
	}
	delete(b.pending, x.i)
	q, err := Quantize(b.Format, p.Shape[0], p.Shape[1], pd.vals)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	return b.upload(s, b.mats[x.i], q)
}

// upload writes host matrix q into the device's d.
func (b *Base) upload(s backend.Stream, d backend.Quant, q *Matrix) error {
	if err := backend.UploadInt32(b.be, s, d.Codes, words(q.Codes, d.Codes.Len())); err != nil {
		return err
	}
	if err := backend.UploadInt32(b.be, s, d.Absmax, words(q.Absmax, d.Absmax.Len())); err != nil {
		return err
	}
	return backend.Upload(b.be, s, d.Scale, q.Scale)
}

// words packs bytes into n little-endian words, as the device reads them.
func words(p []byte, n int) []int32 {
	w := make([]int32, n)
	for i, c := range p {
		w[i/4] |= int32(uint32(c) << (8 * (i % 4)))
	}
	return w
}

// Loaded reports a block matrix that Store has not had whole.
func (b *Base) Loaded() error {
	for i, pd := range b.pending {
		p := b.idx.Layout[i]
		return fmt.Errorf("quantized base: %s got %d of its %d elements", p.Name, pd.got, p.Len())
	}
	return nil
}

// Fetch reads elements off..off+len(dst) of the full layout on stream s:
// the other parameters from Params, the block matrices dequantized on the
// device (Dequantize, rounded to the model dtype: the values GemmQ
// computes with) a chunk at a time. It is what checkpoints and the export
// read (hf.Fetch).
func (b *Base) Fetch(s backend.Stream, off int, dst []float32) error {
	sp, err := b.spans(off, len(dst))
	if err != nil {
		return err
	}
	st := b.be.Staging()
	for _, x := range sp {
		d := dst[x.at : x.at+x.hi-x.lo]
		if !b.idx.IsMat[x.i] {
			if err := st.DownloadInto(s, d, b.params.Slice(b.offs[x.i]+x.lo, len(d))); err != nil {
				return fmt.Errorf("%s: %w", b.idx.Layout[x.i].Name, err)
			}
			continue
		}
		for c := 0; c < len(d); c += b.scratch.Len() {
			n := min(b.scratch.Len(), len(d)-c)
			out := b.scratch.Slice(0, n)
			if err := b.be.Dequantize(s, b.mats[x.i], x.lo+c, out); err != nil {
				return fmt.Errorf("%s: %w", b.idx.Layout[x.i].Name, err)
			}
			if err := st.DownloadInto(s, d[c:c+n], out); err != nil {
				return fmt.Errorf("%s: %w", b.idx.Layout[x.i].Name, err)
			}
		}
	}
	return nil
}

// ChangedError is Verify's error: the base quantized now is not the one
// the checkpoint was trained on; Detail names the first element that
// differs.
type ChangedError struct{ Detail string }

func (e *ChangedError) Error() string {
	return "the quantized base differs from the checkpoint's: " + e.Detail
}

// Verify is Store for a resume: the other parameters are written, and
// each block matrix's values are compared with what the device holds
// (Fetch), bit for bit, since the base is quantized again from --model
// rather than saved: a difference means the weights the run started
// from have changed.
func (b *Base) Verify(s backend.Stream, off int, vals []float32) error {
	sp, err := b.spans(off, len(vals))
	if err != nil {
		return err
	}
	var have []float32
	for _, x := range sp {
		v := vals[x.at : x.at+x.hi-x.lo]
		p := b.idx.Layout[x.i]
		if !b.idx.IsMat[x.i] {
			if err := backend.Upload(b.be, s, b.params.Slice(b.offs[x.i]+x.lo, len(v)), v); err != nil {
				return fmt.Errorf("%s: %w", p.Name, err)
			}
			continue
		}
		have = append(have[:0], make([]float32, len(v))...)
		if err := b.Fetch(s, p.Offset+x.lo, have); err != nil {
			return err
		}
		for j := range v {
			if math.Float32bits(v[j]) != math.Float32bits(have[j]) {
				e := x.lo + j
				return &ChangedError{fmt.Sprintf("%s element %d (row %d, column %d) is %v in the checkpoint, %v quantized from the model now",
					p.Name, e, e/p.Shape[1], e%p.Shape[1], v[j], have[j])}
			}
		}
	}
	return nil
}
