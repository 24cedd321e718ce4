// Generation with a KV cache: the forward pass of one position at a time,
// the same ops as Forward's on one row, with attention over the cached
// keys and values (train/kvcache).
//
//	x = embed[tok]
//	per layer: ln = RMSNorm(x); q, k, v = ln Wq, ln Wk, ln Wv (+ Qwen2's biases)
//	           RoPE(q), RoPE(k) at pos; store k, v; atty = attend(q)
//	           res2 = x + atty Wo; ln = RMSNorm(res2)
//	           x = res2 + (silu(ln Wgate) * ln Wup) Wdown
//	logits = RMSNorm(x) head^T
//
// RoPE at position pos uses the RoPE op on two rows (positions 0 and 1)
// with a frequency table whose row pos holds float32(pos) * inv_freq[i]:
// the op's angle at position 1 is then exactly the fp32 product the whole
// sequence's pass computes at pos, on every backend, and row 0 (angle 0)
// is left as it is. The table, [MaxT, HS/2], is uploaded once.
//
// Limits: one sequence; positions below MaxT and the model's context.

package llama

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/kvcache"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Decoder is a LLaMA's KV-cache decoder (model.Decoder), reading the
// parameters of the Model it came from.
type Decoder struct {
	kvcache.Buffers
	m *Model

	x, ln, res2, scr backend.Tensor // [1, C]
	q, k             backend.Tensor // [2, NH*HS], [2, KVH*HS]: row 1 is the position's
	v, atty          backend.Tensor // [1, KVH*HS], [1, NH*HS]
	gate, up, swi    backend.Tensor // [1, I]
	rstd, freqs      backend.Tensor // F32 [1]; F32 [MaxT, HS/2]
}

var (
	_ model.Cached  = (*Model)(nil)
	_ model.Decoder = (*Decoder)(nil)
)

// NewDecoder allocates a decoder for up to maxT positions on m's backend,
// in m's dtype, and uploads its rotary table (a blocking transfer on the
// default stream).
func (m *Model) NewDecoder(maxT int) (model.Decoder, error) {
	c := m.Cfg
	if maxT < 1 {
		return nil, fmt.Errorf("llama decoder: %d positions, want at least 1", maxT)
	}
	if err := c.CheckSeqLen(maxT); err != nil {
		return nil, fmt.Errorf("llama decoder: %w", err)
	}
	d := &Decoder{m: m, Buffers: kvcache.Buffers{Be: m.be, Positions: maxT}}
	fail := func(what string, err error) (model.Decoder, error) {
		d.Free()
		return nil, fmt.Errorf("llama decoder: %s: %w", what, err)
	}
	var err error
	C, I, HS, qw, kw := c.Hidden, c.Intermediate, c.HS(), c.qWidth(), c.kvWidth()
	if d.Cache, err = kvcache.New(m.be, c.cacheShape(maxT), m.DType); err != nil {
		return fail("cache", err)
	}
	if d.Acts, err = m.be.Alloc("decoder activations", c.decoderActs(), m.DType); err != nil {
		return fail("activations", err)
	}
	if d.Stats, err = m.be.Alloc("decoder stats", c.decoderStats(maxT), backend.F32); err != nil {
		return fail("activations", err)
	}
	if d.Tok, err = m.be.Alloc("decoder token", 1, backend.I32); err != nil {
		return fail("token", err)
	}
	a := &backend.Carver{T: d.Acts}
	d.x, d.ln, d.res2, d.scr = a.Next(1, C), a.Next(1, C), a.Next(1, C), a.Next(1, C)
	d.q, d.k, d.v, d.atty = a.Next(2, qw), a.Next(2, kw), a.Next(1, kw), a.Next(1, qw)
	d.gate, d.up, d.swi, d.Lgts = a.Next(1, I), a.Next(1, I), a.Next(1, I), a.Next(1, c.Vocab)
	d.rstd, d.freqs = d.Stats.Slice(0, 1), d.Stats.Slice(1, maxT*HS/2, maxT, HS/2)
	inv := c.InvFreq()
	table := make([]float32, maxT*len(inv))
	for t := range maxT {
		for i, f := range inv {
			table[t*len(inv)+i] = float32(t) * f // the op's fp32 angle at position t
		}
	}
	if err := backend.Upload(m.be, m.be.DefaultStream(), d.freqs, table); err != nil {
		return fail("rotary table", err)
	}
	return d, nil
}

// cacheShape is the KV cache of a decoder for maxT positions.
func (c Config) cacheShape(maxT int) kvcache.Shape {
	return kvcache.Shape{L: c.NumLayers, NH: c.Heads, KVH: c.KVHeads, HS: c.HS(), MaxT: maxT}
}

// decoderActs is the elements of a decoder's activations, as NewDecoder
// carves them: x, ln, res2, scr [C]; q [2 qw], k [2 kw], v [kw], atty
// [qw]; gate, up, swi [I]; the logits [Vocab].
func (c Config) decoderActs() int {
	qw, kw := c.qWidth(), c.kvWidth()
	return 4*c.Hidden + 2*qw + 2*kw + kw + qw + 3*c.Intermediate + c.Vocab
}

// decoderStats is the fp32 elements of a decoder's rstd and rotary table.
func (c Config) decoderStats(maxT int) int { return 1 + maxT*c.HS()/2 }

// DecoderBytes implements model.DecoderSpec: NewDecoder's cache and
// activations in dt, its fp32 statistics and rotary table, and its token.
func (c Config) DecoderBytes(maxT int, dt backend.DType) int64 {
	return kvcache.Bytes(c.cacheShape(maxT), dt) + int64(c.decoderActs())*int64(dt.Size()) + 4*int64(c.decoderStats(maxT)) + 4
}

// Step implements model.Decoder.
func (d *Decoder) Step(s backend.Stream, pos int) error {
	if pos < 0 || pos >= d.Positions {
		return fmt.Errorf("llama decoder: position %d outside 0..%d", pos, d.Positions-1)
	}
	m, be, c := d.m, d.m.be, d.m.Cfg
	C, HS, qw, kw := c.Hidden, c.HS(), c.qWidth(), c.kvWidth()
	q, k := d.q.Slice(qw, qw, 1, qw), d.k.Slice(kw, kw, 1, kw) // row 1: the position's
	freqs := d.freqs.Slice(pos*HS/2, HS/2)
	if err := be.EncoderForward(s, d.x, d.Tok, backend.Tensor{}, m.p.embed, backend.Tensor{}, 1, 1, C); err != nil {
		return fmt.Errorf("llama decoder: %w", err)
	}
	for l := range c.NumLayers {
		p := &m.p.layers[l]
		err := model.Chain(
			func() error { return be.RMSNormForward(s, d.ln, d.rstd, d.x, p[slotInNorm], 1, C, c.Eps) },
			// The model's linear, so lora's adapters apply here too.
			m.linear(s, l, MatQ, q, d.ln, 1),
			m.linear(s, l, MatK, k, d.ln, 1),
			m.linear(s, l, MatV, d.v, d.ln, 1),
			func() error { return be.RoPEForward(s, d.q, d.q, backend.Tensor{}, freqs, 1, 2, c.Heads, HS) },
			func() error { return be.RoPEForward(s, d.k, d.k, backend.Tensor{}, freqs, 1, 2, c.KVHeads, HS) },
			func() error { return d.Cache.Store(s, l, pos, k, d.v) },
			func() error { return d.Cache.Attend(s, l, pos, q, d.atty) },
			m.linear(s, l, MatO, d.scr, d.atty, 1),
			func() error { return be.Add(s, d.res2, d.x, d.scr) },
			func() error { return be.RMSNormForward(s, d.ln, d.rstd, d.res2, p[slotPostNorm], 1, C, c.Eps) },
			m.linear(s, l, MatGate, d.gate, d.ln, 1),
			m.linear(s, l, MatUp, d.up, d.ln, 1),
			func() error { return be.SwiGLUForward(s, d.swi, d.gate, d.up) },
			m.linear(s, l, MatDown, d.scr, d.swi, 1),
			func() error { return be.Add(s, d.x, d.res2, d.scr) },
		)
		if err != nil {
			return fmt.Errorf("llama decoder, layer %d: %w", l, err)
		}
	}
	err := model.Chain(
		func() error { return be.RMSNormForward(s, d.ln, d.rstd, d.x, m.p.norm, 1, C, c.Eps) },
		func() error { return be.Gemm(s, false, true, 1, c.Vocab, C, 1, d.ln, m.p.head, 0, d.Lgts) },
	)
	if err != nil {
		return fmt.Errorf("llama decoder, head: %w", err)
	}
	return nil
}
