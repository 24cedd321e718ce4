// The LLaMA forward and backward passes on the Backend, after gpt2's
// structure: all parameters in one allocation, all activations in
// another, all gradients in a third, each carved into named views.
//
//	x0 = embed[inp]                                    (B,T,C)
//	per layer: ln1 = RMSNorm(x); q|k|v = ln1 Wq|Wk|Wv   planar (B,T,NH*HS), (B,T,KVH*HS) x2
//	           (+ bq|bk|bv: Qwen2's biases, QKVBias)
//	           RoPE(q), RoPE(k) in place; atty = attn(q,k,v)   (GQA)
//	           res2 = x + atty Wo; ln2 = RMSNorm(res2)
//	           gate = ln2 Wgate; up = ln2 Wup; swi = silu(gate)*up
//	           res3 = res2 + swi Wdown
//	lnf = RMSNorm(x_L); logits = lnf head^T            (B,T,V); head = lm_head or embed (tied)
//
// With MatrixGrads hooks the seven matrices of every block get no dense
// gradient: the hooks see each of the four block inputs once in the
// forward (ln1 for q, k and v; atty for o; ln2 for gate and up; swi for
// down) and each matrix's output gradient in the backward.
//
// Storage: as gpt2: parameters, activations and activation gradients in
// the model dtype, parameter gradients in Options.GradDType, the norm and
// attention statistics, the rotary frequencies and the backward's
// scratch in fp32.
//
// Activations: every block keeps its own for the backward, except the
// matrix inputs ln1, ln2 and swi under hooks and what Options.Recompute
// drops (attn: ln1 to the attention output; layer: all but the block's
// output), which live in one buffer shared by the blocks and are computed
// again at the start of each block's backward.
//
// Limits: T <= max_position_embeddings (and Mistral's sliding_window).
// The activation gradients of
// the MLP (dgate, dup) and of the attention (dqkv) share one buffer: they
// are never live together.

package llama

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// layerActs are one block's activations (blockActs in the same order).
// Under hooks ln1, ln2 and swi are shared buffers (only the hooks read
// them after the forward); so are the ones Recompute drops.
type layerActs struct {
	ln1, rstd1     backend.Tensor
	qkv, atty, lse backend.Tensor // qkv planar, after RoPE
	res2           backend.Tensor
	ln2, rstd2     backend.Tensor
	gate, up, swi  backend.Tensor
	res3           backend.Tensor
}

// layerParams are one block's parameter (or gradient) views, by slot. A
// gradient view with a nil Buf does not exist (a matrix under hooks).
type layerParams [maxSlots]backend.Tensor

type modelParams struct {
	embed, norm, head backend.Tensor // head: lm_head, or embed when tied
	layers            []layerParams
}

// Model is a LLaMA on a backend, with buffers for batches of B rows of T.
type Model struct {
	Cfg   Config
	B, T  int
	DType backend.DType // parameter and activation storage

	// Storage: the layout, the dense gradients' offsets and the buffers
	// the engine reads (Params, Grads, Inputs, Targets, Losses, Logits).
	model.Storage

	be    backend.Backend
	hooks model.MatrixGrads
	// adapters add lora's terms to the frozen matrices (Options.Adapters).
	adapters model.Adapters
	base     model.Base // the frozen block matrices when not in Params (Options.Base)
	rc       model.Recompute
	// hooksInRecompute: the input hooks run in the backward's recompute,
	// not in the forward (model.Options.HooksInRecompute).
	hooksInRecompute bool
	// frozen: no dense parameter has a gradient (model.Options.FrozenDense).
	frozen bool

	p, g       modelParams
	acts       backend.Tensor // the single activation allocation (DType)
	statsBuf   backend.Tensor // the statistics and the rotary frequencies (F32)
	invFreq    backend.Tensor // F32 [HS/2]
	encoded    backend.Tensor
	layers     []layerActs
	actViews   [][]backend.Tensor // layers' views, by blockActs index
	lnf, rstdf backend.Tensor
	scratch    backend.Tensor // (B,T,C) output of o and down before the residual add
	grad       backend.Tensor // the single allocation of activation gradients (DType)
	dres, dbuf backend.Tensor // (B,T,C); (B,T,max(C,NH*HS))
	dwide      backend.Tensor // dqkv, or dgate|dup
	bwdScratch backend.Tensor // the norm and attention backwards' scratch (F32)
}

// blockActs lists one block's activations in layerActs order, for
// model.CarveActs: which the backward reads only as a matrix input (not
// kept under hooks) and which part of the block each belongs to (not kept
// when --recompute computes that part again).
func (c Config) blockActs(B, T int) []model.Act {
	BT, C, I := B*T, c.Hidden, c.Intermediate
	attn, mlp := model.Attention, model.MLP
	return []model.Act{
		{Shape: []int{BT, C}, Block: attn, MatrixInput: true}, // ln1
		{Shape: []int{BT}, F32: true, Block: attn},            // rstd1
		{Shape: []int{BT * c.qkvWidth()}, Block: attn},        // qkv
		{Shape: []int{BT, c.qWidth()}, Block: attn},           // atty
		{Shape: []int{B, c.Heads, T}, F32: true, Block: attn}, // lse
		{Shape: []int{BT, C}, Block: mlp},                     // res2
		{Shape: []int{BT, C}, Block: mlp, MatrixInput: true},  // ln2
		{Shape: []int{BT}, F32: true, Block: mlp},             // rstd2
		{Shape: []int{BT, I}, Block: mlp},                     // gate
		{Shape: []int{BT, I}, Block: mlp},                     // up
		{Shape: []int{BT, I}, Block: mlp, MatrixInput: true},  // swi
		{Shape: []int{BT, C}, Block: model.Output},            // res3
	}
}

// actSizes are the activation allocations' elements: data in the model
// dtype, stats in fp32.
func (c Config) actSizes(B, T int, hooked bool, rc model.Recompute) (data, stats int) {
	BT, C := B*T, c.Hidden
	data, stats = model.ActSizes(c.blockActs(B, T), c.NumLayers, rc, hooked)
	data += BT*C + BT*C + BT*C + BT*c.Vocab // encoded, lnf, scratch, logits
	stats += BT + BT + c.HS()/2             // rstdf; losses; inv_freq
	return data, stats
}

// actGradSizes are the activation gradients' elements per position: dres
// (C), dbuf (the wider of C and NH*HS), dwide (the wider of the planar
// qkv and gate|up).
func (c Config) actGradSizes() (dbuf, dwide int) {
	return max(c.Hidden, c.qWidth()), max(c.qkvWidth(), 2*c.Intermediate)
}

// backwardScratch is the fp32 elements of scratch the backward's ops need
// (one buffer: they run one after another on one stream).
func (c Config) backwardScratch(B, T int) int {
	return max(backend.RMSNormBackwardScratch(B*T, c.Hidden), backend.AttentionBackwardScratch(B, T, c.Heads))
}

// gradOffsets places the dense gradients (model.GradLayout): Layout
// order, or a ring with opts.GradSlots; matrices left out under hooks;
// with FrozenDense the discard buffer instead (model.FrozenGradOffsets:
// the norms, not the embedding, head and biases, whose gradients are not
// computed). n is the length of Grads.
func (c Config) gradOffsets(opts model.Options) (offs []int, n int, err error) {
	var skip func(int) bool
	switch {
	case opts.FrozenMatrices() && opts.FrozenDense:
		head := 1 + c.NumLayers*c.perLayer() + 1 // lm_head when untied
		offs, n = model.FrozenGradOffsets(c.Layout(), func(i int) bool {
			return c.isMatrix(i) || c.isBias(i) || i == 0 || (!c.Tied && i == head)
		})
		return offs, n, nil
	case opts.FrozenMatrices():
		skip = c.isMatrix
	}
	return model.GradLayout(c.Layout(), c.NumLayers, opts, skip)
}

// MemoryWith predicts the device bytes New allocates, exactly. With hooks,
// Grads covers only the dense parameters and the activations keep one
// shared ln1, ln2 and SwiGLU output instead of one per layer; Recompute
// shares more.
func (c Config) MemoryWith(B, T int, dt backend.DType, opts model.Options) model.Memory {
	hooked := opts.MatrixGrads != nil
	data, stats := c.actSizes(B, T, hooked, opts.Recompute)
	// An error is the family's own layout's, which NewModel reports.
	_, ng, _ := c.gradOffsets(opts)
	_, np := opts.ParamOffsets(c.Layout(), c.isMatrix)
	dbuf, dwide := c.actGradSizes()
	BT := int64(B * T)
	return model.Memory{
		Params:      int64(np) * int64(dt.Size()),
		Grads:       int64(ng) * int64(opts.GradDType.Size()),
		Activations: int64(data)*int64(dt.Size()) + int64(stats)*4,
		ActGrads:    BT*int64(c.Hidden+dbuf+dwide)*int64(dt.Size()) + int64(c.backwardScratch(B, T))*4,
		Batch:       int64(opts.BatchRows()) * BT * 4,
	}
}

// New allocates a model for batches of B x T on be, and uploads the
// rotary frequencies (a blocking transfer on the default stream).
// Parameters start at zero; load or initialise them before use.
func New(be backend.Backend, cfg Config, B, T int, dt backend.DType, opts model.Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 {
		return nil, fmt.Errorf("llama: batch %d x %d must be positive", B, T)
	}
	if err := cfg.CheckSeqLen(T); err != nil {
		return nil, err
	}
	if dt != backend.F32 && dt != backend.BF16 {
		return nil, fmt.Errorf("llama: unsupported dtype %v", dt)
	}
	if gdt := opts.GradDType; gdt != backend.F32 && gdt != backend.BF16 {
		return nil, fmt.Errorf("llama: unsupported gradient dtype %v", gdt)
	}
	if opts.Recompute > model.RecomputeLayer {
		return nil, fmt.Errorf("llama: unsupported recompute setting %v", opts.Recompute)
	}
	hooked := opts.MatrixGrads != nil
	if hooked && opts.Adapters != nil {
		return nil, fmt.Errorf("llama: matrix-gradient hooks and adapters together")
	}
	if opts.Base != nil && opts.Adapters == nil {
		return nil, fmt.Errorf("llama: a separate base of the block matrices without adapters")
	}
	m := &Model{Cfg: cfg, B: B, T: T, DType: dt, be: be, hooks: opts.MatrixGrads, adapters: opts.Adapters, base: opts.Base, rc: opts.Recompute,
		hooksInRecompute: opts.HooksInRecompute(), frozen: opts.FrozenMatrices() && opts.FrozenDense}
	m.ParamLayout = cfg.Layout()
	var np int
	m.ParamOffsets, np = opts.ParamOffsets(m.ParamLayout, cfg.isMatrix)
	offs, ng, err := cfg.gradOffsets(opts)
	if err != nil {
		return nil, fmt.Errorf("llama: gradients: %w", err)
	}
	m.GradOffsets = offs
	if m.frozen {
		// The discard buffer's views are the model's own: no parameter
		// has a gradient for the engine.
		m.GradOffsets = make([]int, len(offs))
		for i := range m.GradOffsets {
			m.GradOffsets[i] = -1
		}
	}
	fail := func(what string, err error) (*Model, error) {
		m.Free()
		return nil, fmt.Errorf("llama: %s: %w", what, err)
	}
	if m.Params, err = be.Alloc("params", np, dt); err != nil {
		return fail("parameters", err)
	}
	if m.Grads, err = be.Alloc("grads", ng, opts.GradDType); err != nil {
		return fail("gradients", err)
	}
	m.p, m.g = m.views(m.Params, m.ParamOffsets), m.views(m.Grads, offs)

	data, stats := cfg.actSizes(B, T, hooked, opts.Recompute)
	if m.acts, err = be.Alloc("activations", data, dt); err != nil {
		return fail("activations", err)
	}
	if m.statsBuf, err = be.Alloc("activation stats", stats, backend.F32); err != nil {
		return fail("activations", err)
	}
	BT, C := B*T, cfg.Hidden
	a, st := &backend.Carver{T: m.acts}, &backend.Carver{T: m.statsBuf}
	m.invFreq = st.Next(cfg.HS() / 2)
	m.encoded = a.Next(BT, C)
	m.layers = make([]layerActs, cfg.NumLayers)
	m.actViews = model.CarveActs(cfg.blockActs(B, T), cfg.NumLayers, opts.Recompute, hooked, a, st)
	for l, v := range m.actViews {
		m.layers[l] = layerActs{
			ln1: v[0], rstd1: v[1], qkv: v[2], atty: v[3], lse: v[4],
			res2: v[5], ln2: v[6], rstd2: v[7], gate: v[8], up: v[9], swi: v[10], res3: v[11],
		}
	}
	m.lnf, m.rstdf = a.Next(BT, C), st.Next(BT)
	m.scratch = a.Next(BT, C)
	m.Logits = a.Next(BT, cfg.Vocab)
	m.Losses = st.Next(BT)

	dbuf, dwide := cfg.actGradSizes()
	if m.grad, err = be.Alloc("activation grads", BT*(C+dbuf+dwide), dt); err != nil {
		return fail("activation gradients", err)
	}
	gc := &backend.Carver{T: m.grad}
	m.dres, m.dbuf, m.dwide = gc.Next(BT, C), gc.Next(BT*dbuf), gc.Next(BT*dwide)
	if m.bwdScratch, err = be.Alloc("backward scratch", cfg.backwardScratch(B, T), backend.F32); err != nil {
		return fail("backward scratch", err)
	}
	batch, err := be.Alloc("batch", opts.BatchRows()*BT, backend.I32)
	if err != nil {
		return fail("batch", err)
	}
	m.Inputs, m.Targets = batch.Slice(0, BT), batch.Slice(BT, BT)
	if opts.Packed {
		m.Positions = batch.Slice(2*BT, BT)
	}
	if err := backend.Upload(be, be.DefaultStream(), m.invFreq, cfg.InvFreq()); err != nil {
		return fail("rotary frequencies", err)
	}
	return m, nil
}

// views carves t into parameter views at offs (by Layout index; negative:
// no view).
func (m *Model) views(t backend.Tensor, offs []int) modelParams {
	v := func(i int) backend.Tensor {
		if offs[i] < 0 {
			return backend.Tensor{}
		}
		p := m.ParamLayout[i]
		return t.Slice(offs[i], p.Len(), p.Shape...)
	}
	mp := modelParams{embed: v(0)}
	for l := 0; l < m.Cfg.NumLayers; l++ {
		var lp layerParams
		per := m.Cfg.perLayer()
		for s := range per {
			lp[s] = v(1 + l*per + s)
		}
		mp.layers = append(mp.layers, lp)
	}
	n := 1 + m.Cfg.NumLayers*m.Cfg.perLayer()
	mp.norm, mp.head = v(n), mp.embed
	if !m.Cfg.Tied {
		mp.head = v(n + 1)
	}
	return mp
}

// Free releases every buffer of the model.
func (m *Model) Free() {
	for _, t := range []backend.Tensor{m.Params, m.Grads, m.acts, m.statsBuf, m.grad, m.bwdScratch, m.Inputs} {
		if t.Buf != nil {
			m.be.Free(t)
		}
	}
	*m = Model{Cfg: m.Cfg, B: m.B, T: m.T, DType: m.DType, be: m.be}
}

// Model is the model contract's Model.
var _ model.Model = (*Model)(nil)

// layerInput is the residual stream entering layer l (l == L: the input
// of the final norm).
func (m *Model) layerInput(l int) backend.Tensor {
	if l == 0 {
		return m.encoded
	}
	return m.layers[l-1].res3
}

func (m *Model) checkLayer(pass string, l int) error {
	if l < 0 || l >= m.Cfg.NumLayers {
		return fmt.Errorf("llama %s: layer %d out of range [0, %d)", pass, l, m.Cfg.NumLayers)
	}
	return nil
}

// planes are the q, k and v parts of a planar qkv tensor (or of its
// gradient), each [B*T, width].
func (m *Model) planes(qkv backend.Tensor) (q, k, v backend.Tensor) {
	BT, qw, kw := m.B*m.T, m.Cfg.qWidth(), m.Cfg.kvWidth()
	return qkv.Slice(0, BT*qw, BT, qw), qkv.Slice(BT*qw, BT*kw, BT, kw), qkv.Slice(BT*(qw+kw), BT*kw, BT, kw)
}

// Forward enqueues the forward pass on s, from Inputs to Logits.
func (m *Model) Forward(s backend.Stream) error {
	if err := m.ForwardEmbed(s); err != nil {
		return err
	}
	for l := 0; l < m.Cfg.NumLayers; l++ {
		if err := m.ForwardLayer(s, l); err != nil {
			return err
		}
	}
	return m.ForwardHead(s)
}

// ForwardEmbed enqueues the token embedding (no position table).
func (m *Model) ForwardEmbed(s backend.Stream) error {
	if err := m.be.EncoderForward(s, m.encoded, m.Inputs, backend.Tensor{}, m.p.embed, backend.Tensor{}, m.B, m.T, m.Cfg.Hidden); err != nil {
		return fmt.Errorf("llama forward: %w", err)
	}
	return nil
}

// ForwardLayer enqueues block l; block l-1 (or the embedding) must be
// enqueued before it.
func (m *Model) ForwardLayer(s backend.Stream, l int) error {
	if err := m.checkLayer("forward", l); err != nil {
		return err
	}
	if err := model.Chain(m.forwardSteps(s, l, model.Output, !m.hooksInRecompute)...); err != nil {
		return fmt.Errorf("llama forward, layer %d: %w", l, err)
	}
	return nil
}

// forwardSteps are block l's forward ops up to the end of part last
// (Attention: to the attention output; MLP: to the SwiGLU; Output: the
// whole block), with the input hooks when hooks is set.
func (m *Model) forwardSteps(s backend.Stream, l int, last model.Block, hooks bool) []func() error {
	be, c := m.be, m.Cfg
	B, T, C, BT, HS := m.B, m.T, c.Hidden, m.B*m.T, c.HS()
	a, p, x := &m.layers[l], &m.p.layers[l], m.layerInput(l)
	q, k, v := m.planes(a.qkv)
	input := func(in int, x backend.Tensor) func() error {
		return func() error {
			if !hooks {
				return nil
			}
			return m.input(s, l, in, x)
		}
	}
	steps := []func() error{
		func() error { return be.RMSNormForward(s, a.ln1, a.rstd1, x, p[slotInNorm], BT, C, c.Eps) },
		input(0, a.ln1),
		m.linear(s, l, MatQ, q, a.ln1, BT),
		m.linear(s, l, MatK, k, a.ln1, BT),
		m.linear(s, l, MatV, v, a.ln1, BT),
		func() error { return be.RoPEForward(s, q, q, m.Positions, m.invFreq, B, T, c.Heads, HS) },
		func() error { return be.RoPEForward(s, k, k, m.Positions, m.invFreq, B, T, c.KVHeads, HS) },
		func() error {
			return be.AttentionForward(s, a.atty, a.lse, a.qkv, m.Positions, B, T, c.Heads, c.KVHeads, HS, backend.QKVPlanar)
		},
	}
	if last == model.Attention {
		return steps
	}
	steps = append(steps,
		input(1, a.atty),
		m.linear(s, l, MatO, m.scratch, a.atty, BT),
		func() error { return be.Add(s, a.res2, x, m.scratch) },
		func() error { return be.RMSNormForward(s, a.ln2, a.rstd2, a.res2, p[slotPostNorm], BT, C, c.Eps) },
		input(2, a.ln2),
		m.linear(s, l, MatGate, a.gate, a.ln2, BT),
		m.linear(s, l, MatUp, a.up, a.ln2, BT),
		func() error { return be.SwiGLUForward(s, a.swi, a.gate, a.up) },
		input(3, a.swi),
	)
	if last == model.MLP {
		return steps
	}
	return append(steps,
		m.linear(s, l, MatDown, m.scratch, a.swi, BT),
		func() error { return be.Add(s, a.res3, a.res2, m.scratch) },
	)
}

// linear is the step computing out [N, n] = inp [N, m] W (+ b) for
// matrix k of layer l, plus its adapter's term in lora mode (before
// RoPE, which rotates q and k in place afterwards).
func (m *Model) linear(s backend.Stream, l int, k Matrix, out, inp backend.Tensor, N int) func() error {
	return func() error {
		IC, OC := m.Cfg.MatrixShape(k)
		p := &m.p.layers[l]
		if m.base != nil {
			if err := m.base.Forward(s, l, int(k), N, inp, out); err != nil {
				return fmt.Errorf("%v: %w", k, err)
			}
		} else if err := m.be.Gemm(s, false, false, N, OC, IC, 1, inp, p[matrixSlot[k]], 0, out); err != nil {
			return err
		}
		if err := m.addBias(s, p, k, out, N)(); err != nil {
			return err
		}
		return model.AdapterForward(m.adapters, s, l, int(k), k, inp, out)
	}
}

// addBias is the step adding matrix k's bias (Qwen2's q, k and v) to its
// output out of N rows, before RoPE; a no-op without one.
func (m *Model) addBias(s backend.Stream, p *layerParams, k Matrix, out backend.Tensor, N int) func() error {
	return func() error {
		slot, ok := m.Cfg.biasSlot(k)
		if !ok {
			return nil
		}
		_, OC := m.Cfg.MatrixShape(k)
		return m.be.AddBias(s, out, p[slot], N, OC)
	}
}

// biasBackward is the step accumulating matrix k's bias gradient, the
// column sums of its output gradient dout (after RoPE's backward); a
// no-op without a bias, or when the dense parameters are frozen.
func (m *Model) biasBackward(s backend.Stream, l int, k Matrix, dout backend.Tensor) func() error {
	return func() error {
		slot, ok := m.Cfg.biasSlot(k)
		if !ok || m.frozen {
			return nil
		}
		_, OC := m.Cfg.MatrixShape(k)
		return m.be.BiasBackward(s, m.g.layers[l][slot], dout, m.B*m.T, OC)
	}
}

// recompute enqueues the part of block l's forward that --recompute did
// not keep, from the kept block input, with the input hooks when they
// are called there (model.Options.HooksInRecompute).
func (m *Model) recompute(s backend.Stream, l int) error {
	last, ok := m.rc.Recomputed()
	if !ok {
		return nil
	}
	if err := model.Chain(m.forwardSteps(s, l, last, m.hooksInRecompute)...); err != nil {
		return fmt.Errorf("recompute: %w", err)
	}
	return nil
}

// ForwardHead enqueues the final norm and the logits.
func (m *Model) ForwardHead(s backend.Stream) error {
	be, c := m.be, m.Cfg
	C, BT := c.Hidden, m.B*m.T
	err := model.Chain(
		func() error {
			return be.RMSNormForward(s, m.lnf, m.rstdf, m.layerInput(c.NumLayers), m.p.norm, BT, C, c.Eps)
		},
		// logits = lnf head^T, head V x C (lm_head, or the embedding).
		func() error { return be.Gemm(s, false, true, BT, c.Vocab, C, 1, m.lnf, m.p.head, 0, m.Logits) },
	)
	if err != nil {
		return fmt.Errorf("llama forward, head: %w", err)
	}
	return nil
}

// input hands block input in to the hooks, if any.
func (m *Model) input(s backend.Stream, l, in int, x backend.Tensor) error {
	if m.hooks == nil {
		return nil
	}
	if err := m.hooks.Input(s, l, in, x); err != nil {
		return fmt.Errorf("input %d hook: %w", in, err)
	}
	return nil
}

// CrossEntropy enqueues the fused softmax cross-entropy on the logits of
// the last Forward: Losses gets the per-position losses, and with scale
// != 0 Logits is replaced by scale * dloss/dlogits.
func (m *Model) CrossEntropy(s backend.Stream, scale float32) error {
	if err := m.be.CrossEntropyForwardBackward(s, m.Losses, m.Logits, m.Targets, m.B*m.T, m.Cfg.Vocab, scale); err != nil {
		return fmt.Errorf("llama loss: %w", err)
	}
	return nil
}

// ZeroGrads enqueues clearing of every dense parameter gradient.
func (m *Model) ZeroGrads(s backend.Stream) error { return m.be.Fill(s, m.Grads, 0) }

// Backward enqueues the whole backward pass.
func (m *Model) Backward(s backend.Stream) error { return model.Backward(m, s, m.Cfg.NumLayers) }

// BackwardHead enqueues the head's backward, from dlogits to dres (dL/dx
// of the last layer's output); accumulates the head's (or the tied
// embedding's) and the final norm's gradients.
func (m *Model) BackwardHead(s backend.Stream) error {
	be, c := m.be, m.Cfg
	C, BT := c.Hidden, m.B*m.T
	dlnf := m.dbuf.Slice(0, BT*C, BT, C)
	err := model.Chain(
		// dlnf = dlogits head; dhead += dlogits^T lnf.
		func() error { return be.Gemm(s, false, false, BT, C, c.Vocab, 1, m.Logits, m.p.head, 0, dlnf) },
		func() error {
			if m.frozen {
				return nil // no gradient for a frozen head
			}
			return be.Gemm(s, true, false, c.Vocab, C, BT, 1, m.Logits, m.lnf, 1, m.g.head)
		},
		func() error { return be.Fill(s, m.dres, 0) },
		func() error {
			return be.RMSNormBackward(s, m.dres, m.g.norm, dlnf, m.layerInput(c.NumLayers), m.p.norm, m.rstdf, m.bwdScratch, BT, C)
		},
	)
	if err != nil {
		return fmt.Errorf("llama backward, head: %w", err)
	}
	return nil
}

// linearBackward of matrix k of layer l: dinp = dout W^T (written, or
// added to when accumulate: matrices reading one input sum their input
// gradients), and dW += inp^T dout, or with hooks OutputGrad(dout)
// instead (inp is then not read: it was not kept), or with adapters
// their backward, which adds to dinp, instead of dW.
func (m *Model) linearBackward(s backend.Stream, l int, k Matrix, dinp, dout, inp backend.Tensor, accumulate bool) error {
	IC, OC := m.Cfg.MatrixShape(k)
	N := m.B * m.T
	slot := matrixSlot[k]
	w, dw := m.p.layers[l][slot], m.g.layers[l][slot]
	beta := float32(0)
	if accumulate {
		beta = 1
	}
	return model.Chain(
		func() error {
			if m.adapters != nil {
				return nil // frozen: no dW
			}
			if m.hooks == nil {
				return m.be.Gemm(s, true, false, IC, OC, N, 1, inp, dout, 1, dw)
			}
			if err := m.hooks.OutputGrad(s, l, int(k), dout); err != nil {
				return fmt.Errorf("%v output-grad hook: %w", k, err)
			}
			return nil
		},
		func() error {
			if m.base != nil {
				return m.base.InputGrad(s, l, int(k), N, dout, dinp, beta)
			}
			return m.be.Gemm(s, false, true, N, IC, OC, 1, dout, w, beta, dinp)
		},
		func() error { return model.AdapterBackward(m.adapters, s, l, int(k), k, inp, dout, dinp) },
	)
}

// BackwardLayer enqueues block l's backward. dres holds dL/dres3 of block
// l on entry and dL/dx of its input on exit, so blocks go from L-1 down to
// 0, after BackwardHead. Matrices' output gradients reach the hooks in
// reverse forward order.
func (m *Model) BackwardLayer(s backend.Stream, l int) error {
	if err := m.checkLayer("backward", l); err != nil {
		return err
	}
	be, c := m.be, m.Cfg
	B, T, C, I, BT, HS := m.B, m.T, c.Hidden, c.Intermediate, m.B*m.T, c.HS()
	a, p, g, x := &m.layers[l], &m.p.layers[l], &m.g.layers[l], m.layerInput(l)
	dC := m.dbuf.Slice(0, BT*C, BT, C)
	datty := m.dbuf.Slice(0, BT*c.qWidth(), BT, c.qWidth())
	dgate, dup := m.dwide.Slice(0, BT*I, BT, I), m.dwide.Slice(BT*I, BT*I, BT, I)
	dqkv := m.dwide.Slice(0, BT*c.qkvWidth())
	dq, dk, dv := m.planes(dqkv)
	err := model.Chain(
		func() error { return m.recompute(s, l) },
		// MLP: dswi (in dgate's place) = dres Wdown^T; SwiGLU's backward
		// overwrites it with dgate.
		func() error { return m.linearBackward(s, l, MatDown, dgate, m.dres, a.swi, false) },
		func() error { return be.SwiGLUBackward(s, dgate, dup, dgate, a.gate, a.up) },
		func() error { return m.linearBackward(s, l, MatUp, dC, dup, a.ln2, false) },
		func() error { return m.linearBackward(s, l, MatGate, dC, dgate, a.ln2, true) },
		func() error {
			return be.RMSNormBackward(s, m.dres, g[slotPostNorm], dC, a.res2, p[slotPostNorm], a.rstd2, m.bwdScratch, BT, C)
		},
		// Attention: datty = dres Wo^T; dqkv (planar) from it; RoPE's
		// backward turns dq and dk into the projections' output grads.
		func() error { return m.linearBackward(s, l, MatO, datty, m.dres, a.atty, false) },
		func() error {
			return be.AttentionBackward(s, dqkv, datty, a.qkv, a.atty, a.lse, m.Positions, m.bwdScratch, B, T, c.Heads, c.KVHeads, HS, backend.QKVPlanar)
		},
		func() error { return be.RoPEBackward(s, dq, dq, m.Positions, m.invFreq, B, T, c.Heads, HS) },
		func() error { return be.RoPEBackward(s, dk, dk, m.Positions, m.invFreq, B, T, c.KVHeads, HS) },
		m.biasBackward(s, l, MatV, dv),
		m.biasBackward(s, l, MatK, dk),
		m.biasBackward(s, l, MatQ, dq),
		func() error { return m.linearBackward(s, l, MatV, dC, dv, a.ln1, false) },
		func() error { return m.linearBackward(s, l, MatK, dC, dk, a.ln1, true) },
		func() error { return m.linearBackward(s, l, MatQ, dC, dq, a.ln1, true) },
		func() error {
			return be.RMSNormBackward(s, m.dres, g[slotInNorm], dC, x, p[slotInNorm], a.rstd1, m.bwdScratch, BT, C)
		},
	)
	if err != nil {
		return fmt.Errorf("llama backward, layer %d: %w", l, err)
	}
	return nil
}

// BackwardEmbed enqueues the embedding's backward, after
// BackwardLayer(0).
func (m *Model) BackwardEmbed(s backend.Stream) error {
	if m.frozen {
		return nil // no gradient for a frozen embedding
	}
	if err := m.be.EncoderBackward(s, m.g.embed, backend.Tensor{}, m.dres, m.Inputs, backend.Tensor{}, m.B, m.T, m.Cfg.Hidden); err != nil {
		return fmt.Errorf("llama backward, embeddings: %w", err)
	}
	return nil
}
