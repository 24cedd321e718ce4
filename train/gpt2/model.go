// The GPT-2 forward and backward passes on the Backend, after llm.c's
// structure: all parameters in one allocation, all activations in another,
// all gradients in a third, each carved into named views.
//
//	x0 = wte[inp] + wpe                      (B,T,C)
//	per layer: ln1 = LN(x); qkv = ln1 Wqkv + b; atty = attn(qkv)
//	           x2 = x + atty Wproj + b; ln2 = LN(x2)
//	           fch = ln2 Wfc + b; fchg = gelu(fch); x3 = x2 + fchg Wfcp + b
//	lnf = LN(x_L); logits = lnf wte^T         (B,T,V)
//
// Limits: T <= MaxT; activations are kept for the backward (no
// recomputation); the attention op saves only its log-sum-exp.

package gpt2

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// layerActs are one block's saved activations.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd backend.Tensor
	qkv, atty, lse        backend.Tensor
	res2                  backend.Tensor
	ln2, ln2Mean, ln2Rstd backend.Tensor
	fch, fchg             backend.Tensor
	res3                  backend.Tensor
}

// layerParams are one block's parameter (or gradient) views.
type layerParams struct {
	ln1w, ln1b, qkvw, qkvb, projw, projb backend.Tensor
	ln2w, ln2b, fcw, fcb, fcpw, fcpb     backend.Tensor
}

type modelParams struct {
	wte, wpe, lnfw, lnfb backend.Tensor
	layers               []layerParams
}

// Model is a GPT-2 on a backend, with buffers for batches of B rows of T.
type Model struct {
	Cfg   Config
	B, T  int
	DType backend.DType // parameter and activation storage

	be     backend.Backend
	layout []Param

	// Params holds every parameter; Grads every gradient (fp32), same layout.
	Params, Grads backend.Tensor
	// Inputs and Targets (I32, B*T) are filled by the caller before Forward
	// and CrossEntropy; targets < 0 are ignored.
	Inputs, Targets backend.Tensor
	// Losses (F32, B*T) holds the per-position losses after CrossEntropy.
	Losses backend.Tensor
	// Logits (B*T*V) holds the logits after Forward, and dlogits after
	// CrossEntropy with a non-zero scale.
	Logits backend.Tensor

	p, g       modelParams
	acts       backend.Tensor // the single activation allocation
	encoded    backend.Tensor
	layers     []layerActs
	lnf        backend.Tensor
	lnfMean    backend.Tensor
	lnfRstd    backend.Tensor
	scratch    backend.Tensor // (B,T,C) output of the projections before the residual add
	grad       backend.Tensor // the single allocation of activation gradients (fp32)
	dres, dbuf backend.Tensor // (B,T,C)
	dqkv, dfch backend.Tensor // (B,T,3C), (B,T,4C)
	statsBuf   backend.Tensor
}

// carver hands out consecutive views of one allocation.
type carver struct {
	t   backend.Tensor
	off int
}

func (c *carver) next(shape ...int) backend.Tensor {
	n := 1
	for _, s := range shape {
		n *= s
	}
	v := c.t.Slice(c.off, n, shape...)
	c.off += n
	return v
}

// actSizes lists the activation views in allocation order: the float ones
// stored in the model dtype, then the fp32 statistics.
func (c Config) actSizes(B, T int) (data, stats int) {
	BT, C := B*T, c.C
	perLayerData := BT*C*2 + BT*3*C + BT*C + BT*C + BT*4*C*2 + BT*C // ln1, atty, qkv, res2, ln2, fch, fchg, res3
	data = BT*C + c.L*perLayerData + BT*C + BT*C + BT*c.V           // encoded, layers, lnf, scratch, logits
	stats = c.L*(4*BT+B*c.NH*T) + 2*BT + BT                         // ln means/rstds, lse; lnf stats; losses
	return data, stats
}

// MemoryPlan is the device memory a model needs, by part, in bytes.
type MemoryPlan struct {
	Params, Grads, Activations, ActGrads, Batch int64
}

// Total is the sum of the parts.
func (m MemoryPlan) Total() int64 {
	return m.Params + m.Grads + m.Activations + m.ActGrads + m.Batch
}

// Plan predicts the device bytes New allocates for a batch of B x T.
func (c Config) Plan(B, T int, dt backend.DType) MemoryPlan {
	data, stats := c.actSizes(B, T)
	BT := int64(B * T)
	return MemoryPlan{
		Params:      int64(c.NumParams()) * int64(dt.Size()),
		Grads:       int64(c.NumParams()) * 4,
		Activations: int64(data)*int64(dt.Size()) + int64(stats)*4,
		ActGrads:    BT * int64(c.C*2+3*c.C+4*c.C) * 4,
		Batch:       2 * BT * 4,
	}
}

// New allocates a model for batches of B x T on be. Parameters start at
// zero; load or initialise them before use.
func New(be backend.Backend, cfg Config, B, T int, dt backend.DType) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 {
		return nil, fmt.Errorf("gpt2: batch %d x %d must be positive", B, T)
	}
	if T > cfg.MaxT {
		return nil, fmt.Errorf("gpt2: sequence length %d exceeds the model context n_positions=%d", T, cfg.MaxT)
	}
	if dt != backend.F32 && dt != backend.BF16 {
		return nil, fmt.Errorf("gpt2: unsupported dtype %v", dt)
	}
	m := &Model{Cfg: cfg, B: B, T: T, DType: dt, be: be, layout: cfg.Layout()}
	n := cfg.NumParams()
	var err error
	free := func() { m.Free() }
	if m.Params, err = be.Alloc("params", n, dt); err != nil {
		return nil, fmt.Errorf("gpt2: parameters: %w", err)
	}
	if m.Grads, err = be.Alloc("grads", n, backend.F32); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: gradients: %w", err)
	}
	m.p, m.g = m.views(m.Params), m.views(m.Grads)

	data, stats := cfg.actSizes(B, T)
	if m.acts, err = be.Alloc("activations", data, dt); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: activations: %w", err)
	}
	statsBuf, err := be.Alloc("activation stats", stats, backend.F32)
	if err != nil {
		free()
		return nil, fmt.Errorf("gpt2: activations: %w", err)
	}
	BT, C := B*T, cfg.C
	a, st := &carver{t: m.acts}, &carver{t: statsBuf}
	m.encoded = a.next(BT, C)
	m.layers = make([]layerActs, cfg.L)
	for l := range m.layers {
		la := &m.layers[l]
		la.ln1, la.ln1Mean, la.ln1Rstd = a.next(BT, C), st.next(BT), st.next(BT)
		la.qkv, la.atty, la.lse = a.next(BT, 3*C), a.next(BT, C), st.next(B, cfg.NH, T)
		la.res2 = a.next(BT, C)
		la.ln2, la.ln2Mean, la.ln2Rstd = a.next(BT, C), st.next(BT), st.next(BT)
		la.fch, la.fchg = a.next(BT, 4*C), a.next(BT, 4*C)
		la.res3 = a.next(BT, C)
	}
	m.lnf, m.lnfMean, m.lnfRstd = a.next(BT, C), st.next(BT), st.next(BT)
	m.scratch = a.next(BT, C)
	m.Logits = a.next(BT, cfg.V)
	m.Losses = st.next(BT)

	if m.grad, err = be.Alloc("activation grads", BT*(2*C+3*C+4*C), backend.F32); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: activation gradients: %w", err)
	}
	gc := &carver{t: m.grad}
	m.dres, m.dbuf, m.dqkv, m.dfch = gc.next(BT, C), gc.next(BT, C), gc.next(BT, 3*C), gc.next(BT, 4*C)

	batch, err := be.Alloc("batch", 2*BT, backend.I32)
	if err != nil {
		free()
		return nil, fmt.Errorf("gpt2: batch: %w", err)
	}
	m.Inputs, m.Targets = batch.Slice(0, BT), batch.Slice(BT, BT)
	m.statsBuf = statsBuf
	return m, nil
}

func (m *Model) views(t backend.Tensor) modelParams {
	v := func(i int) backend.Tensor {
		p := m.layout[i]
		return t.Slice(p.Offset, p.Len(), p.Shape...)
	}
	mp := modelParams{wte: v(0), wpe: v(1)}
	for l := 0; l < m.Cfg.L; l++ {
		i := 2 + l*perLayer
		mp.layers = append(mp.layers, layerParams{
			ln1w: v(i), ln1b: v(i + 1), qkvw: v(i + 2), qkvb: v(i + 3), projw: v(i + 4), projb: v(i + 5),
			ln2w: v(i + 6), ln2b: v(i + 7), fcw: v(i + 8), fcb: v(i + 9), fcpw: v(i + 10), fcpb: v(i + 11),
		})
	}
	n := len(m.layout)
	mp.lnfw, mp.lnfb = v(n-2), v(n-1)
	return mp
}

// Layout is the parameter layout of Params and Grads.
func (m *Model) Layout() []Param { return m.layout }

// ParamView returns parameter i of t (Params, Grads, or a tensor of the
// same layout such as an optimizer moment).
func (m *Model) ParamView(t backend.Tensor, i int) backend.Tensor {
	p := m.layout[i]
	return t.Slice(p.Offset, p.Len(), p.Shape...)
}

// Free releases every buffer of the model.
func (m *Model) Free() {
	for _, t := range []backend.Tensor{m.Params, m.Grads, m.acts, m.statsBuf, m.grad, m.Inputs} {
		if t.Buf != nil {
			m.be.Free(t)
		}
	}
}

// chain runs steps in order and stops at the first error.
func chain(steps ...func() error) error {
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// Forward enqueues the forward pass on s, from Inputs to Logits.
func (m *Model) Forward(s backend.Stream) error {
	be, c := m.be, m.Cfg
	B, T, C, BT := m.B, m.T, c.C, m.B*m.T
	if err := be.EncoderForward(s, m.encoded, m.Inputs, m.p.wte, m.p.wpe, B, T, C); err != nil {
		return fmt.Errorf("gpt2 forward: %w", err)
	}
	x := m.encoded
	for l := range m.layers {
		a, p := &m.layers[l], &m.p.layers[l]
		err := chain(
			func() error {
				return be.LayerNormForward(s, a.ln1, a.ln1Mean, a.ln1Rstd, x, p.ln1w, p.ln1b, BT, C, c.Eps)
			},
			func() error { return m.linear(s, a.qkv, a.ln1, p.qkvw, p.qkvb, BT, C, 3*C) },
			func() error { return be.AttentionForward(s, a.atty, a.lse, a.qkv, B, T, C, c.NH) },
			func() error { return m.linear(s, m.scratch, a.atty, p.projw, p.projb, BT, C, C) },
			func() error { return be.Add(s, a.res2, x, m.scratch) },
			func() error {
				return be.LayerNormForward(s, a.ln2, a.ln2Mean, a.ln2Rstd, a.res2, p.ln2w, p.ln2b, BT, C, c.Eps)
			},
			func() error { return m.linear(s, a.fch, a.ln2, p.fcw, p.fcb, BT, C, 4*C) },
			func() error { return be.GeluForward(s, a.fchg, a.fch) },
			func() error { return m.linear(s, m.scratch, a.fchg, p.fcpw, p.fcpb, BT, 4*C, C) },
			func() error { return be.Add(s, a.res3, a.res2, m.scratch) },
		)
		if err != nil {
			return fmt.Errorf("gpt2 forward, layer %d: %w", l, err)
		}
		x = a.res3
	}
	err := chain(
		func() error {
			return be.LayerNormForward(s, m.lnf, m.lnfMean, m.lnfRstd, x, m.p.lnfw, m.p.lnfb, BT, C, c.Eps)
		},
		// logits = lnf wte^T: the tied head.
		func() error { return be.Gemm(s, false, true, BT, c.V, C, 1, m.lnf, m.p.wte, 0, m.Logits) },
	)
	if err != nil {
		return fmt.Errorf("gpt2 forward, head: %w", err)
	}
	return nil
}

// linear computes out[N,OC] = inp[N,IC] W[IC,OC] + bias.
func (m *Model) linear(s backend.Stream, out, inp, w, bias backend.Tensor, N, IC, OC int) error {
	if err := m.be.Gemm(s, false, false, N, OC, IC, 1, inp, w, 0, out); err != nil {
		return err
	}
	return m.be.AddBias(s, out, bias, N, OC)
}

// linearBackward: dinp = dout W^T (written), dW += inp^T dout, db += colsum(dout).
func (m *Model) linearBackward(s backend.Stream, dinp, dw, db, dout, inp, w backend.Tensor, N, IC, OC int) error {
	return chain(
		func() error { return m.be.Gemm(s, true, false, IC, OC, N, 1, inp, dout, 1, dw) },
		func() error { return m.be.BiasBackward(s, db, dout, N, OC) },
		func() error { return m.be.Gemm(s, false, true, N, IC, OC, 1, dout, w, 0, dinp) },
	)
}

// CrossEntropy enqueues the fused softmax cross-entropy on the logits of the
// last Forward: Losses gets the per-position losses, and with scale != 0
// Logits is replaced by scale * dloss/dlogits, ready for Backward. Use
// scale = 1 / (targets counted over the whole accumulated batch).
func (m *Model) CrossEntropy(s backend.Stream, scale float32) error {
	if err := m.be.CrossEntropyForwardBackward(s, m.Losses, m.Logits, m.Targets, m.B*m.T, m.Cfg.V, scale); err != nil {
		return fmt.Errorf("gpt2 loss: %w", err)
	}
	return nil
}

// ZeroGrads enqueues clearing of every parameter gradient.
func (m *Model) ZeroGrads(s backend.Stream) error { return m.be.Fill(s, m.Grads, 0) }

// Backward enqueues the backward pass: from the dlogits left by
// CrossEntropy, accumulates every parameter gradient into Grads.
func (m *Model) Backward(s backend.Stream) error {
	be, c := m.be, m.Cfg
	B, T, C, BT := m.B, m.T, c.C, m.B*m.T
	last := m.encoded
	if c.L > 0 {
		last = m.layers[c.L-1].res3
	}
	err := chain(
		// Head: dlnf = dlogits wte; dwte += dlogits^T lnf.
		func() error { return be.Gemm(s, false, false, BT, C, c.V, 1, m.Logits, m.p.wte, 0, m.dbuf) },
		func() error { return be.Gemm(s, true, false, c.V, C, BT, 1, m.Logits, m.lnf, 1, m.g.wte) },
		func() error { return be.Fill(s, m.dres, 0) },
		func() error {
			return be.LayerNormBackward(s, m.dres, m.g.lnfw, m.g.lnfb, m.dbuf, last, m.p.lnfw, m.lnfMean, m.lnfRstd, BT, C)
		},
	)
	if err != nil {
		return fmt.Errorf("gpt2 backward, head: %w", err)
	}
	// dres holds dL/dx3 of the current layer; the residual stream passes it
	// through and each LayerNorm backward adds its branch to it.
	for l := c.L - 1; l >= 0; l-- {
		a, p, g := &m.layers[l], &m.p.layers[l], &m.g.layers[l]
		x := m.encoded
		if l > 0 {
			x = m.layers[l-1].res3
		}
		err := chain(
			func() error {
				return m.linearBackward(s, m.dfch, g.fcpw, g.fcpb, m.dres, a.fchg, p.fcpw, BT, 4*C, C)
			},
			func() error { return be.GeluBackward(s, m.dfch, a.fch, m.dfch) },
			func() error { return m.linearBackward(s, m.dbuf, g.fcw, g.fcb, m.dfch, a.ln2, p.fcw, BT, C, 4*C) },
			func() error {
				return be.LayerNormBackward(s, m.dres, g.ln2w, g.ln2b, m.dbuf, a.res2, p.ln2w, a.ln2Mean, a.ln2Rstd, BT, C)
			},
			func() error { return m.linearBackward(s, m.dbuf, g.projw, g.projb, m.dres, a.atty, p.projw, BT, C, C) },
			func() error { return be.AttentionBackward(s, m.dqkv, m.dbuf, a.qkv, a.atty, a.lse, B, T, C, c.NH) },
			func() error { return m.linearBackward(s, m.dbuf, g.qkvw, g.qkvb, m.dqkv, a.ln1, p.qkvw, BT, C, 3*C) },
			func() error {
				return be.LayerNormBackward(s, m.dres, g.ln1w, g.ln1b, m.dbuf, x, p.ln1w, a.ln1Mean, a.ln1Rstd, BT, C)
			},
		)
		if err != nil {
			return fmt.Errorf("gpt2 backward, layer %d: %w", l, err)
		}
	}
	if err := be.EncoderBackward(s, m.g.wte, m.g.wpe, m.dres, m.Inputs, B, T, C); err != nil {
		return fmt.Errorf("gpt2 backward, embeddings: %w", err)
	}
	return nil
}
