// Generation with a KV cache: the forward pass of one position at a time,
// the same ops as Forward's on one row, with attention over the cached
// keys and values (train/kvcache).
//
//	x = wte[tok] + wpe[pos]
//	per layer: ln = LN(x); qkv = ln Wqkv + b; store k, v; atty = attend(q)
//	           res2 = x + atty Wproj + b; ln = LN(res2)
//	           x = res2 + gelu(ln Wfc + b) Wfcp + b
//	logits = LN(x) wte^T
//
// Limits: one sequence; positions below MaxT and the model's n_positions.

package gpt2

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/kvcache"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Decoder is a GPT-2's KV-cache decoder (model.Decoder), reading the
// parameters of the Model it came from.
type Decoder struct {
	kvcache.Buffers
	m *Model

	x, ln, qkv, atty, res2 backend.Tensor // [1, C], [1, 3C] for qkv
	fch, fchg, scratch     backend.Tensor // [1, 4C] x2, [1, C]
	mean, rstd             backend.Tensor // F32 [1]
}

var (
	_ model.Cached  = (*Model)(nil)
	_ model.Decoder = (*Decoder)(nil)
)

// NewDecoder allocates a decoder for up to maxT positions on m's backend,
// in m's dtype.
func (m *Model) NewDecoder(maxT int) (model.Decoder, error) {
	c := m.Cfg
	if maxT < 1 || maxT > c.MaxT {
		return nil, fmt.Errorf("gpt2 decoder: %d positions, want 1..n_positions=%d", maxT, c.MaxT)
	}
	d := &Decoder{m: m, Buffers: kvcache.Buffers{Be: m.be, Positions: maxT}}
	fail := func(what string, err error) (model.Decoder, error) {
		d.Free()
		return nil, fmt.Errorf("gpt2 decoder: %s: %w", what, err)
	}
	var err error
	C := c.C
	if d.Cache, err = kvcache.New(m.be, c.cacheShape(maxT), m.DType); err != nil {
		return fail("cache", err)
	}
	if d.Acts, err = m.be.Alloc("decoder activations", c.decoderActs(), m.DType); err != nil {
		return fail("activations", err)
	}
	if d.Stats, err = m.be.Alloc("decoder stats", 2, backend.F32); err != nil {
		return fail("activations", err)
	}
	if d.Tok, err = m.be.Alloc("decoder token", 1, backend.I32); err != nil {
		return fail("token", err)
	}
	a := &backend.Carver{T: d.Acts}
	d.x, d.ln, d.atty, d.res2, d.scratch = a.Next(1, C), a.Next(1, C), a.Next(1, C), a.Next(1, C), a.Next(1, C)
	d.qkv, d.fch, d.fchg, d.Lgts = a.Next(1, 3*C), a.Next(1, 4*C), a.Next(1, 4*C), a.Next(1, c.V)
	d.mean, d.rstd = d.Stats.Slice(0, 1), d.Stats.Slice(1, 1)
	return d, nil
}

// cacheShape is the KV cache of a decoder for maxT positions.
func (c Config) cacheShape(maxT int) kvcache.Shape {
	return kvcache.Shape{L: c.L, NH: c.NH, KVH: c.NH, HS: c.C / c.NH, MaxT: maxT}
}

// decoderActs is the elements of a decoder's activations, as NewDecoder
// carves them: x, ln, atty, res2, scratch [C]; qkv [3C]; fch, fchg [4C];
// the logits [V].
func (c Config) decoderActs() int { return 5*c.C + 3*c.C + 2*4*c.C + c.V }

// DecoderBytes implements model.DecoderSpec: NewDecoder's cache and
// activations in dt, its two fp32 statistics and its token.
func (c Config) DecoderBytes(maxT int, dt backend.DType) int64 {
	return kvcache.Bytes(c.cacheShape(maxT), dt) + int64(c.decoderActs())*int64(dt.Size()) + 2*4 + 4
}

// Step implements model.Decoder.
func (d *Decoder) Step(s backend.Stream, pos int) error {
	if pos < 0 || pos >= d.Positions {
		return fmt.Errorf("gpt2 decoder: position %d outside 0..%d", pos, d.Positions-1)
	}
	m, be, c := d.m, d.m.be, d.m.Cfg
	C := c.C
	ln := func(out, inp, w, b backend.Tensor) func() error {
		return func() error { return be.LayerNormForward(s, out, d.mean, d.rstd, inp, w, b, 1, C, c.Eps) }
	}
	// linear is the model's, so lora's adapters apply here too.
	linear := func(l int, k Matrix, out, inp, w, b backend.Tensor, IC, OC int) func() error {
		return func() error { return m.linear(s, l, k, out, inp, w, b, 1, IC, OC) }
	}
	// The position's row of wpe, as a one-row table: the encoder adds row
	// 0 of the table it is given.
	wpe := m.p.wpe.Slice(pos*C, C, 1, C)
	if err := be.EncoderForward(s, d.x, d.Tok, backend.Tensor{}, m.p.wte, wpe, 1, 1, C); err != nil {
		return fmt.Errorf("gpt2 decoder: %w", err)
	}
	for l := range c.L {
		p := &m.p.layers[l]
		err := model.Chain(
			ln(d.ln, d.x, p.ln1w, p.ln1b),
			linear(l, MatQKV, d.qkv, d.ln, p.qkvw, p.qkvb, C, 3*C),
			func() error { return d.Cache.Store(s, l, pos, d.qkv.Slice(C, C), d.qkv.Slice(2*C, C)) },
			func() error { return d.Cache.Attend(s, l, pos, d.qkv.Slice(0, C), d.atty) },
			linear(l, MatProj, d.scratch, d.atty, p.projw, p.projb, C, C),
			func() error { return be.Add(s, d.res2, d.x, d.scratch) },
			ln(d.ln, d.res2, p.ln2w, p.ln2b),
			linear(l, MatFC, d.fch, d.ln, p.fcw, p.fcb, C, 4*C),
			func() error { return be.GeluForward(s, d.fchg, d.fch) },
			linear(l, MatFCProj, d.scratch, d.fchg, p.fcpw, p.fcpb, 4*C, C),
			func() error { return be.Add(s, d.x, d.res2, d.scratch) },
		)
		if err != nil {
			return fmt.Errorf("gpt2 decoder, layer %d: %w", l, err)
		}
	}
	err := model.Chain(
		ln(d.ln, d.x, m.p.lnfw, m.p.lnfb),
		func() error { return be.Gemm(s, false, true, 1, c.V, C, 1, d.ln, m.p.wte, 0, d.Lgts) },
	)
	if err != nil {
		return fmt.Errorf("gpt2 decoder, head: %w", err)
	}
	return nil
}
