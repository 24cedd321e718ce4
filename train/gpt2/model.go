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
// The passes are also exposed per layer (ForwardLayer, BackwardLayer, ...) so
// that the offload engine can interleave them with its copies and host work;
// Config and Model implement train/model's Arch and Model for it. With
// MatrixGrads hooks the four weight matrices of every block get no dense
// gradient: the hooks see each matrix's input in the forward and its output
// gradient in the backward, and compress them (docs/DESIGN.md, "LSP as
// implemented"). Each of GPT-2's four matrices reads an input of its own
// (c_attn is q, k and v fused into one matrix), so input k is matrix k's.
//
// Storage: parameters, activations and activation gradients are in the
// model's dtype (DType), as in llm.c, so that at bf16 every op gets the
// types the CUDA kernels take (backend.KernelDTypes: GEMM and attention
// are bf16 only); the parameter gradients are in Options.GradDType; the
// LayerNorm and attention statistics and the backward's scratch are fp32.
//
// Activations: every block keeps its own for the backward, except the
// matrix inputs ln1, ln2 and fchg under hooks and what Options.Recompute
// drops (attn: ln1 to the attention output; layer: all but the block's
// output), which live in one buffer shared by the blocks and are computed
// again at the start of each block's backward.
//
// Limits: T <= MaxT; the attention op saves only its log-sum-exp. At
// bf16 the residual stream's gradient (dres) is rounded to bf16 at every
// LayerNorm backward that adds to it, 2L+1 times per backward.

package gpt2

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Matrix names one of a block's four weight matrices.
type Matrix int

// The matrices of a block, in forward order.
const (
	MatQKV    Matrix = iota // c_attn: C x 3C
	MatProj                 // attn c_proj: C x C
	MatFC                   // mlp c_fc: C x 4C
	MatFCProj               // mlp c_proj: 4C x C
)

// NumMatrices is the number of weight matrices of a block.
const NumMatrices = 4

func (k Matrix) String() string {
	switch k {
	case MatQKV:
		return "qkv"
	case MatProj:
		return "proj"
	case MatFC:
		return "fc"
	case MatFCProj:
		return "fcproj"
	}
	return fmt.Sprintf("Matrix(%d)", int(k))
}

// matrixSlot is each matrix's index among its block's 12 parameters.
var matrixSlot = [NumMatrices]int{2, 4, 8, 10}

// MatrixShape is matrix k's shape, in x out (as HF's Conv1D stores it).
func (c Config) MatrixShape(k Matrix) (m, n int) {
	switch k {
	case MatQKV:
		return c.C, 3 * c.C
	case MatProj:
		return c.C, c.C
	case MatFC:
		return c.C, 4 * c.C
	case MatFCProj:
		return 4 * c.C, c.C
	}
	return 0, 0
}

// MatrixParam is the index into Layout() of matrix k of layer l.
func (c Config) MatrixParam(l int, k Matrix) int { return 2 + l*perLayer + matrixSlot[k] }

// Matrices lists a block's four matrices for model.Arch; each reads its own
// input.
func (c Config) Matrices() []model.Matrix {
	ms := make([]model.Matrix, NumMatrices)
	for k := range Matrix(NumMatrices) {
		m, n := c.MatrixShape(k)
		ms[k] = model.Matrix{Name: k.String(), Slot: matrixSlot[k], M: m, N: n, Input: int(k)}
	}
	return ms
}

// isMatrix reports whether Layout() entry i is a block's weight matrix.
func (c Config) isMatrix(i int) bool {
	if i < 2 || i >= 2+c.L*perLayer {
		return false
	}
	j := (i - 2) % perLayer
	return j == matrixSlot[0] || j == matrixSlot[1] || j == matrixSlot[2] || j == matrixSlot[3]
}

// layerActs are one block's activations (blockActs in the same order).
// Under hooks ln1, ln2 and fchg are shared buffers (only the hooks read
// them after the forward); so are the ones Recompute drops.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd backend.Tensor
	qkv, atty, lse        backend.Tensor
	res2                  backend.Tensor
	ln2, ln2Mean, ln2Rstd backend.Tensor
	fch, fchg             backend.Tensor
	res3                  backend.Tensor
}

// layerParams are one block's parameter (or gradient) views. A gradient
// view with a nil Buf does not exist (a matrix under hooks).
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
	acts       backend.Tensor // the single activation allocation
	encoded    backend.Tensor
	layers     []layerActs
	actViews   [][]backend.Tensor // layers' views, by blockActs index
	lnf        backend.Tensor
	lnfMean    backend.Tensor
	lnfRstd    backend.Tensor
	scratch    backend.Tensor // (B,T,C) output of the projections before the residual add
	grad       backend.Tensor // the single allocation of activation gradients (DType)
	dres, dbuf backend.Tensor // (B,T,C)
	dqkv, dfch backend.Tensor // (B,T,3C), (B,T,4C)
	bwdScratch backend.Tensor // the LayerNorm and attention backwards' scratch (fp32, its own allocation)
	statsBuf   backend.Tensor
}

// blockActs lists one block's activations in layerActs order, for
// model.CarveActs: which the backward reads only as a matrix input (not
// kept under hooks) and which part of the block each belongs to (not
// kept when --recompute computes that part again).
func (c Config) blockActs(B, T int) []model.Act {
	BT, C := B*T, c.C
	attn, mlp := model.Attention, model.MLP
	return []model.Act{
		{Shape: []int{BT, C}, Block: attn, MatrixInput: true},    // ln1
		{Shape: []int{BT}, F32: true, Block: attn},               // ln1Mean
		{Shape: []int{BT}, F32: true, Block: attn},               // ln1Rstd
		{Shape: []int{BT, 3 * C}, Block: attn},                   // qkv
		{Shape: []int{BT, C}, Block: attn},                       // atty
		{Shape: []int{B, c.NH, T}, F32: true, Block: attn},       // lse
		{Shape: []int{BT, C}, Block: mlp},                        // res2
		{Shape: []int{BT, C}, Block: mlp, MatrixInput: true},     // ln2
		{Shape: []int{BT}, F32: true, Block: mlp},                // ln2Mean
		{Shape: []int{BT}, F32: true, Block: mlp},                // ln2Rstd
		{Shape: []int{BT, 4 * C}, Block: mlp},                    // fch
		{Shape: []int{BT, 4 * C}, Block: mlp, MatrixInput: true}, // fchg
		{Shape: []int{BT, C}, Block: model.Output},               // res3
	}
}

// actSizes is the elements of the activation allocations: data in the
// model dtype, stats in fp32.
func (c Config) actSizes(B, T int, hooked bool, rc model.Recompute) (data, stats int) {
	BT := B * T
	data, stats = model.ActSizes(c.blockActs(B, T), c.L, rc, hooked)
	data += BT*c.C + BT*c.C + BT*c.C + BT*c.V // encoded, lnf, scratch, logits
	stats += 2*BT + BT                        // lnf's mean and rstd; losses
	return data, stats
}

// actGradWidth is the activation gradients' elements per position: dres
// and dbuf (C each), dqkv (3C) and dfch (4C).
func (c Config) actGradWidth() int { return 2*c.C + 3*c.C + 4*c.C }

// backwardScratch is the fp32 elements of scratch the backward's ops need
// (one buffer: they run one after another on one stream).
func (c Config) backwardScratch(B, T int) int {
	return max(backend.LayerNormBackwardScratch(B*T, c.C), backend.AttentionBackwardScratch(B, T, c.NH))
}

// gradOffsets places the dense gradients (model.GradLayout): Layout
// order, or a ring with opts.GradSlots; matrices left out under hooks;
// with FrozenDense the discard buffer instead (model.FrozenGradOffsets:
// the norms and biases, not wte and wpe, whose gradients are not
// computed). n is the length of Grads.
func (c Config) gradOffsets(opts model.Options) (offs []int, n int, err error) {
	var skip func(int) bool
	switch {
	case opts.FrozenMatrices() && opts.FrozenDense:
		offs, n = model.FrozenGradOffsets(c.Layout(), func(i int) bool { return c.isMatrix(i) || i < 2 })
		return offs, n, nil
	case opts.FrozenMatrices():
		skip = c.isMatrix
	}
	return model.GradLayout(c.Layout(), c.L, opts, skip)
}

// Memory predicts the device bytes New allocates for a batch of B x T.
func (c Config) Memory(B, T int, dt backend.DType) model.Memory {
	return c.MemoryWith(B, T, dt, model.Options{})
}

// MemoryWith predicts the device bytes NewWithOptions allocates. With hooks,
// Grads covers only the dense parameters and the activations keep one
// shared ln1, ln2 and gelu output instead of one per layer; Recompute
// shares more.
func (c Config) MemoryWith(B, T int, dt backend.DType, opts model.Options) model.Memory {
	hooked := opts.MatrixGrads != nil
	data, stats := c.actSizes(B, T, hooked, opts.Recompute)
	// An error is the family's own layout's, which NewModel reports.
	_, ng, _ := c.gradOffsets(opts)
	_, np := opts.ParamOffsets(c.Layout(), c.isMatrix)
	BT := int64(B * T)
	return model.Memory{
		Params:      int64(np) * int64(dt.Size()),
		Grads:       int64(ng) * int64(opts.GradDType.Size()),
		Activations: int64(data)*int64(dt.Size()) + int64(stats)*4,
		ActGrads:    BT*int64(c.actGradWidth())*int64(dt.Size()) + int64(c.backwardScratch(B, T))*4,
		Batch:       int64(opts.BatchRows()) * BT * 4,
	}
}

// New allocates a model for batches of B x T on be. Parameters start at
// zero; load or initialise them before use.
func New(be backend.Backend, cfg Config, B, T int, dt backend.DType) (*Model, error) {
	return NewWithOptions(be, cfg, B, T, dt, model.Options{})
}

// Config and Model are the model contract's Arch and Model.
var (
	_ model.Arch  = Config{}
	_ model.Model = (*Model)(nil)
)

// NewModel is NewWithOptions for model.Arch.
func (c Config) NewModel(be backend.Backend, B, T int, dt backend.DType, opts model.Options) (model.Model, error) {
	m, err := NewWithOptions(be, c, B, T, dt, opts)
	if err != nil {
		return nil, err // not a nil *Model in a non-nil interface
	}
	return m, nil
}

// NewWithOptions is New with matrix-gradient hooks or other options. With
// hooks, the matrices' inputs (ln1, ln2 and gelu outputs) are not kept per
// layer but in one shared buffer each; so are what Recompute drops.
func NewWithOptions(be backend.Backend, cfg Config, B, T int, dt backend.DType, opts model.Options) (*Model, error) {
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
	hooked := opts.MatrixGrads != nil
	if opts.Recompute > model.RecomputeLayer {
		return nil, fmt.Errorf("gpt2: unsupported recompute setting %v", opts.Recompute)
	}
	if hooked && opts.Adapters != nil {
		return nil, fmt.Errorf("gpt2: matrix-gradient hooks and adapters together")
	}
	if opts.Base != nil && opts.Adapters == nil {
		return nil, fmt.Errorf("gpt2: a separate base of the block matrices without adapters")
	}
	m := &Model{Cfg: cfg, B: B, T: T, DType: dt, be: be, hooks: opts.MatrixGrads, adapters: opts.Adapters, base: opts.Base, rc: opts.Recompute,
		hooksInRecompute: opts.HooksInRecompute(), frozen: opts.FrozenMatrices() && opts.FrozenDense}
	m.ParamLayout = cfg.Layout()
	var n int
	m.ParamOffsets, n = opts.ParamOffsets(m.ParamLayout, cfg.isMatrix)
	offs, ng, err := cfg.gradOffsets(opts)
	if err != nil {
		return nil, fmt.Errorf("gpt2: gradients: %w", err)
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
	free := func() { m.Free() }
	if m.Params, err = be.Alloc("params", n, dt); err != nil {
		return nil, fmt.Errorf("gpt2: parameters: %w", err)
	}
	if gdt := opts.GradDType; gdt != backend.F32 && gdt != backend.BF16 {
		return nil, fmt.Errorf("gpt2: unsupported gradient dtype %v", gdt)
	}
	if m.Grads, err = be.Alloc("grads", ng, opts.GradDType); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: gradients: %w", err)
	}
	m.p, m.g = m.views(m.Params, m.ParamOffsets), m.views(m.Grads, offs)

	data, stats := cfg.actSizes(B, T, hooked, opts.Recompute)
	if m.acts, err = be.Alloc("activations", data, dt); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: activations: %w", err)
	}
	if m.statsBuf, err = be.Alloc("activation stats", stats, backend.F32); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: activations: %w", err)
	}
	BT, C := B*T, cfg.C
	a, st := &backend.Carver{T: m.acts}, &backend.Carver{T: m.statsBuf}
	m.encoded = a.Next(BT, C)
	m.layers = make([]layerActs, cfg.L)
	m.actViews = model.CarveActs(cfg.blockActs(B, T), cfg.L, opts.Recompute, hooked, a, st)
	for l, v := range m.actViews {
		m.layers[l] = layerActs{
			ln1: v[0], ln1Mean: v[1], ln1Rstd: v[2], qkv: v[3], atty: v[4], lse: v[5],
			res2: v[6], ln2: v[7], ln2Mean: v[8], ln2Rstd: v[9], fch: v[10], fchg: v[11], res3: v[12],
		}
	}
	m.lnf, m.lnfMean, m.lnfRstd = a.Next(BT, C), st.Next(BT), st.Next(BT)
	m.scratch = a.Next(BT, C)
	m.Logits = a.Next(BT, cfg.V)
	m.Losses = st.Next(BT)

	// Activation gradients in the model dtype: at bf16 the GEMMs and the
	// attention backward take them as they are, and they take half the
	// memory.
	if m.grad, err = be.Alloc("activation grads", BT*cfg.actGradWidth(), dt); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: activation gradients: %w", err)
	}
	gc := &backend.Carver{T: m.grad}
	m.dres, m.dbuf, m.dqkv, m.dfch = gc.Next(BT, C), gc.Next(BT, C), gc.Next(BT, 3*C), gc.Next(BT, 4*C)
	if m.bwdScratch, err = be.Alloc("backward scratch", cfg.backwardScratch(B, T), backend.F32); err != nil {
		free()
		return nil, fmt.Errorf("gpt2: backward scratch: %w", err)
	}

	batch, err := be.Alloc("batch", opts.BatchRows()*BT, backend.I32)
	if err != nil {
		free()
		return nil, fmt.Errorf("gpt2: batch: %w", err)
	}
	m.Inputs, m.Targets = batch.Slice(0, BT), batch.Slice(BT, BT)
	if opts.Packed {
		m.Positions = batch.Slice(2*BT, BT)
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
	mp := modelParams{wte: v(0), wpe: v(1)}
	for l := 0; l < m.Cfg.L; l++ {
		i := 2 + l*perLayer
		mp.layers = append(mp.layers, layerParams{
			ln1w: v(i), ln1b: v(i + 1), qkvw: v(i + 2), qkvb: v(i + 3), projw: v(i + 4), projb: v(i + 5),
			ln2w: v(i + 6), ln2b: v(i + 7), fcw: v(i + 8), fcb: v(i + 9), fcpw: v(i + 10), fcpb: v(i + 11),
		})
	}
	n := len(m.ParamLayout)
	mp.lnfw, mp.lnfb = v(n-2), v(n-1)
	return mp
}

// Free releases every buffer of the model.
func (m *Model) Free() {
	for _, t := range []backend.Tensor{m.Params, m.Grads, m.acts, m.statsBuf, m.grad, m.bwdScratch, m.Inputs} {
		if t.Buf != nil {
			m.be.Free(t)
		}
	}
}

// layerInput is the residual stream entering layer l (l == L: the input of
// the final LayerNorm).
func (m *Model) layerInput(l int) backend.Tensor {
	if l == 0 {
		return m.encoded
	}
	return m.layers[l-1].res3
}

func (m *Model) checkLayer(pass string, l int) error {
	if l < 0 || l >= m.Cfg.L {
		return fmt.Errorf("gpt2 %s: layer %d out of range [0, %d)", pass, l, m.Cfg.L)
	}
	return nil
}

// Forward enqueues the forward pass on s, from Inputs to Logits.
func (m *Model) Forward(s backend.Stream) error {
	if err := m.ForwardEmbed(s); err != nil {
		return err
	}
	for l := 0; l < m.Cfg.L; l++ {
		if err := m.ForwardLayer(s, l); err != nil {
			return err
		}
	}
	return m.ForwardHead(s)
}

// ForwardEmbed enqueues the encoder: token plus position embeddings.
func (m *Model) ForwardEmbed(s backend.Stream) error {
	if err := m.be.EncoderForward(s, m.encoded, m.Inputs, m.Positions, m.p.wte, m.p.wpe, m.B, m.T, m.Cfg.C); err != nil {
		return fmt.Errorf("gpt2 forward: %w", err)
	}
	return nil
}

// ForwardLayer enqueues block l; block l-1 (or the encoder) must be
// enqueued before it.
func (m *Model) ForwardLayer(s backend.Stream, l int) error {
	if err := m.checkLayer("forward", l); err != nil {
		return err
	}
	if err := model.Chain(m.forwardSteps(s, l, model.Output, !m.hooksInRecompute)...); err != nil {
		return fmt.Errorf("gpt2 forward, layer %d: %w", l, err)
	}
	return nil
}

// forwardSteps are block l's forward ops up to the end of part last
// (Attention: to the attention output; MLP: to the gelu; Output: the
// whole block), with the input hooks when hooks is set.
func (m *Model) forwardSteps(s backend.Stream, l int, last model.Block, hooks bool) []func() error {
	be, c := m.be, m.Cfg
	B, T, C, BT := m.B, m.T, c.C, m.B*m.T
	a, p, x := &m.layers[l], &m.p.layers[l], m.layerInput(l)
	input := func(k Matrix, x backend.Tensor) func() error {
		return func() error {
			if !hooks {
				return nil
			}
			return m.input(s, l, k, x)
		}
	}
	steps := []func() error{
		func() error {
			return be.LayerNormForward(s, a.ln1, a.ln1Mean, a.ln1Rstd, x, p.ln1w, p.ln1b, BT, C, c.Eps)
		},
		input(MatQKV, a.ln1),
		func() error { return m.linear(s, l, MatQKV, a.qkv, a.ln1, p.qkvw, p.qkvb, BT, C, 3*C) },
		func() error {
			return be.AttentionForward(s, a.atty, a.lse, a.qkv, m.Positions, B, T, c.NH, c.NH, C/c.NH, backend.QKVFused)
		},
	}
	if last == model.Attention {
		return steps
	}
	steps = append(steps,
		input(MatProj, a.atty),
		func() error { return m.linear(s, l, MatProj, m.scratch, a.atty, p.projw, p.projb, BT, C, C) },
		func() error { return be.Add(s, a.res2, x, m.scratch) },
		func() error {
			return be.LayerNormForward(s, a.ln2, a.ln2Mean, a.ln2Rstd, a.res2, p.ln2w, p.ln2b, BT, C, c.Eps)
		},
		input(MatFC, a.ln2),
		func() error { return m.linear(s, l, MatFC, a.fch, a.ln2, p.fcw, p.fcb, BT, C, 4*C) },
		func() error { return be.GeluForward(s, a.fchg, a.fch) },
		input(MatFCProj, a.fchg),
	)
	if last == model.MLP {
		return steps
	}
	return append(steps,
		func() error { return m.linear(s, l, MatFCProj, m.scratch, a.fchg, p.fcpw, p.fcpb, BT, 4*C, C) },
		func() error { return be.Add(s, a.res3, a.res2, m.scratch) },
	)
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

// ForwardHead enqueues the final LayerNorm and the logits.
func (m *Model) ForwardHead(s backend.Stream) error {
	be, c := m.be, m.Cfg
	C, BT := c.C, m.B*m.T
	err := model.Chain(
		func() error {
			return be.LayerNormForward(s, m.lnf, m.lnfMean, m.lnfRstd, m.layerInput(c.L), m.p.lnfw, m.p.lnfb, BT, C, c.Eps)
		},
		// logits = lnf wte^T: the tied head.
		func() error { return be.Gemm(s, false, true, BT, c.V, C, 1, m.lnf, m.p.wte, 0, m.Logits) },
	)
	if err != nil {
		return fmt.Errorf("gpt2 forward, head: %w", err)
	}
	return nil
}

// input hands matrix k's input to the hooks, if any.
func (m *Model) input(s backend.Stream, l int, k Matrix, x backend.Tensor) error {
	if m.hooks == nil {
		return nil
	}
	if err := m.hooks.Input(s, l, int(k), x); err != nil {
		return fmt.Errorf("%v input hook: %w", k, err)
	}
	return nil
}

// linear computes out[N,OC] = inp[N,IC] W[IC,OC] + bias for matrix k of
// layer l, plus its adapter's term in lora mode.
func (m *Model) linear(s backend.Stream, l int, k Matrix, out, inp, w, bias backend.Tensor, N, IC, OC int) error {
	if m.base != nil {
		if err := m.base.Forward(s, l, int(k), N, inp, out); err != nil {
			return fmt.Errorf("%v: %w", k, err)
		}
	} else if err := m.be.Gemm(s, false, false, N, OC, IC, 1, inp, w, 0, out); err != nil {
		return err
	}
	if err := m.be.AddBias(s, out, bias, N, OC); err != nil {
		return err
	}
	return model.AdapterForward(m.adapters, s, l, int(k), k, inp, out)
}

// linearBackward of matrix k of layer l: dinp = dout W^T (written), db +=
// colsum(dout), and dW += inp^T dout, or with hooks OutputGrad(dout)
// instead (inp is then not read: it was not kept), or with adapters
// their backward, which adds to dinp, instead of dW.
func (m *Model) linearBackward(s backend.Stream, l int, k Matrix, dinp, dw, db, dout, inp, w backend.Tensor, N, IC, OC int) error {
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
		func() error { return m.be.BiasBackward(s, db, dout, N, OC) },
		func() error {
			if m.base != nil {
				return m.base.InputGrad(s, l, int(k), N, dout, dinp, 0)
			}
			return m.be.Gemm(s, false, true, N, IC, OC, 1, dout, w, 0, dinp)
		},
		func() error { return model.AdapterBackward(m.adapters, s, l, int(k), k, inp, dout, dinp) },
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

// ZeroGrads enqueues clearing of every dense parameter gradient.
func (m *Model) ZeroGrads(s backend.Stream) error { return m.be.Fill(s, m.Grads, 0) }

// Backward enqueues the backward pass: from the dlogits left by
// CrossEntropy, accumulates every dense parameter gradient into Grads (and
// calls the hooks for the matrices).
func (m *Model) Backward(s backend.Stream) error {
	if err := m.BackwardHead(s); err != nil {
		return err
	}
	for l := m.Cfg.L - 1; l >= 0; l-- {
		if err := m.BackwardLayer(s, l); err != nil {
			return err
		}
	}
	return m.BackwardEmbed(s)
}

// BackwardHead enqueues the head's backward, from dlogits to dres (dL/dx of
// the last layer's output); accumulates the wte and ln_f gradients.
func (m *Model) BackwardHead(s backend.Stream) error {
	be, c := m.be, m.Cfg
	C, BT := c.C, m.B*m.T
	err := model.Chain(
		// Head: dlnf = dlogits wte; dwte += dlogits^T lnf.
		func() error { return be.Gemm(s, false, false, BT, C, c.V, 1, m.Logits, m.p.wte, 0, m.dbuf) },
		func() error {
			if m.frozen {
				return nil // no gradient for a frozen wte
			}
			return be.Gemm(s, true, false, c.V, C, BT, 1, m.Logits, m.lnf, 1, m.g.wte)
		},
		func() error { return be.Fill(s, m.dres, 0) },
		func() error {
			return be.LayerNormBackward(s, m.dres, m.g.lnfw, m.g.lnfb, m.dbuf, m.layerInput(c.L), m.p.lnfw, m.lnfMean, m.lnfRstd, m.bwdScratch, BT, C)
		},
	)
	if err != nil {
		return fmt.Errorf("gpt2 backward, head: %w", err)
	}
	return nil
}

// BackwardLayer enqueues block l's backward. dres holds dL/dx3 of block l on
// entry and dL/dx of its input on exit, so blocks go from L-1 down to 0,
// after BackwardHead.
func (m *Model) BackwardLayer(s backend.Stream, l int) error {
	if err := m.checkLayer("backward", l); err != nil {
		return err
	}
	be, c := m.be, m.Cfg
	B, T, C, BT := m.B, m.T, c.C, m.B*m.T
	a, p, g, x := &m.layers[l], &m.p.layers[l], &m.g.layers[l], m.layerInput(l)
	// The residual stream passes dres through and each LayerNorm backward
	// adds its branch to it.
	err := model.Chain(
		func() error { return m.recompute(s, l) },
		func() error {
			return m.linearBackward(s, l, MatFCProj, m.dfch, g.fcpw, g.fcpb, m.dres, a.fchg, p.fcpw, BT, 4*C, C)
		},
		func() error { return be.GeluBackward(s, m.dfch, a.fch, m.dfch) },
		func() error {
			return m.linearBackward(s, l, MatFC, m.dbuf, g.fcw, g.fcb, m.dfch, a.ln2, p.fcw, BT, C, 4*C)
		},
		func() error {
			return be.LayerNormBackward(s, m.dres, g.ln2w, g.ln2b, m.dbuf, a.res2, p.ln2w, a.ln2Mean, a.ln2Rstd, m.bwdScratch, BT, C)
		},
		func() error {
			return m.linearBackward(s, l, MatProj, m.dbuf, g.projw, g.projb, m.dres, a.atty, p.projw, BT, C, C)
		},
		func() error {
			return be.AttentionBackward(s, m.dqkv, m.dbuf, a.qkv, a.atty, a.lse, m.Positions, m.bwdScratch, B, T, c.NH, c.NH, C/c.NH, backend.QKVFused)
		},
		func() error {
			return m.linearBackward(s, l, MatQKV, m.dbuf, g.qkvw, g.qkvb, m.dqkv, a.ln1, p.qkvw, BT, C, 3*C)
		},
		func() error {
			return be.LayerNormBackward(s, m.dres, g.ln1w, g.ln1b, m.dbuf, x, p.ln1w, a.ln1Mean, a.ln1Rstd, m.bwdScratch, BT, C)
		},
	)
	if err != nil {
		return fmt.Errorf("gpt2 backward, layer %d: %w", l, err)
	}
	return nil
}

// BackwardEmbed enqueues the encoder's backward: wte and wpe gradients from
// dres, after BackwardLayer(0).
func (m *Model) BackwardEmbed(s backend.Stream) error {
	if m.frozen {
		return nil // no gradient for frozen embeddings
	}
	if err := m.be.EncoderBackward(s, m.g.wte, m.g.wpe, m.dres, m.Inputs, m.Positions, m.B, m.T, m.Cfg.C); err != nil {
		return fmt.Errorf("gpt2 backward, embeddings: %w", err)
	}
	return nil
}
