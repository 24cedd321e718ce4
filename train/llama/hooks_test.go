package llama

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// hookCfg is small enough for bit-exact comparisons of every gradient:
// grouped-query attention, head_dim not hidden/heads, an intermediate size
// that is no multiple of anything, llama3 RoPE, untied head.
var hookCfg = Config{Vocab: 48, Hidden: 24, Intermediate: 40, NumLayers: 2, Heads: 4, KVHeads: 2, HeadDim: 8,
	Eps: 1e-5, RopeTheta: 10000, MaxPos: 16,
	RopeScaling: &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 12}}

const hookB, hookT = 2, 8

var dtypes = []backend.DType{backend.F32, backend.BF16}

// hookModel builds a model of cfg with random weights (norm weights away
// from 1) in dtype dt.
func hookModel(t *testing.T, be backend.Backend, cfg Config, dt backend.DType, opts model.Options) *Model {
	t.Helper()
	m, err := New(be, cfg, hookB, hookT, dt, opts)
	if err != nil {
		t.Fatal(err)
	}
	vals := cfg.Init(5)
	rng := rand.New(rand.NewPCG(6, 7))
	for _, p := range cfg.Layout() {
		if len(p.Shape) == 1 {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				vals[i] += float32(rng.NormFloat64() * 0.1)
			}
		} else {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				vals[i] *= 10 // 0.2: logits far enough from uniform to matter
			}
		}
	}
	must(t, backend.Upload(be, be.DefaultStream(), m.Params, vals))
	return m
}

// setBatch uploads micro-batch number mb (its own tokens; every fifth
// target ignored).
func setBatch(t *testing.T, be backend.Backend, m *Model, mb int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(mb), 99))
	inp := make([]int32, m.B*m.T)
	tgt := make([]int32, m.B*m.T)
	for i := range inp {
		inp[i] = int32(rng.IntN(m.Cfg.Vocab))
		tgt[i] = int32(rng.IntN(m.Cfg.Vocab))
		if i%5 == 0 {
			tgt[i] = -1
		}
	}
	s := be.DefaultStream()
	must(t, backend.UploadInt32(be, s, m.Inputs, inp))
	must(t, backend.UploadInt32(be, s, m.Targets, tgt))
}

// microBatch runs forward, loss and backward of micro-batch mb, either
// through Forward/Backward or through the per-layer calls, and returns the
// logits of the forward.
func microBatch(t *testing.T, be backend.Backend, m *Model, mb int, split bool) []float32 {
	t.Helper()
	s := be.DefaultStream()
	setBatch(t, be, m, mb)
	if split {
		must(t, m.ForwardEmbed(s))
		for l := range m.Cfg.NumLayers {
			must(t, m.ForwardLayer(s, l))
		}
		must(t, m.ForwardHead(s))
	} else {
		must(t, m.Forward(s))
	}
	logits := download(t, be, m.Logits)
	must(t, m.CrossEntropy(s, 1/float32(2*m.B*m.T)))
	if split {
		must(t, m.BackwardHead(s))
		for l := m.Cfg.NumLayers - 1; l >= 0; l-- {
			must(t, m.BackwardLayer(s, l))
		}
		must(t, m.BackwardEmbed(s))
	} else {
		must(t, m.Backward(s))
	}
	return logits
}

func download(t *testing.T, be backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	v, err := backend.Download(be, be.DefaultStream(), x)
	must(t, err)
	return v
}

// sameBits reports the first element whose bits differ.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %.9g, want %.9g bit for bit", what, i, got[i], want[i])
			return
		}
	}
}

// TestSplitPassesMatchWhole: the per-layer calls are Forward and Backward
// to the bit, over two accumulated micro-batches.
func TestSplitPassesMatchWhole(t *testing.T) {
	for _, dt := range dtypes {
		t.Run(dt.String(), func(t *testing.T) {
			be := cpu.New(cpu.Config{})
			defer be.Close()
			m := hookModel(t, be, hookCfg, dt, model.Options{})
			var logits [2][][]float32
			var grads [2][]float32
			for i, split := range []bool{false, true} {
				must(t, m.ZeroGrads(be.DefaultStream()))
				for mb := range 2 {
					logits[i] = append(logits[i], microBatch(t, be, m, mb, split))
				}
				grads[i] = download(t, be, m.Grads)
			}
			for mb := range 2 {
				sameBits(t, fmt.Sprintf("logits of micro-batch %d", mb), logits[1][mb], logits[0][mb])
			}
			sameBits(t, "grads", grads[1], grads[0])
			for _, p := range m.Layout() {
				g := grads[0][p.Offset : p.Offset+p.Len()]
				if !slices.ContainsFunc(g, func(v float32) bool { return v != 0 }) {
					t.Errorf("%s: every gradient is zero", p.Name)
				}
			}
		})
	}
}

// denseHook computes the matrices' gradients densely from what the hooks
// hand it: each block input X copied in the forward (once per input), and
// dW += X^T dY for each matrix reading it. It also accumulates X^T dY in
// float64 on the host, as an independent reference for its own Gemm.
type denseHook struct {
	cfg   Config
	be    backend.Backend
	BT    int
	dt    backend.DType
	x     [][NumInputs]backend.Tensor
	dw    [][NumMatrices]backend.Tensor
	ref   [][NumMatrices][]float64
	calls []string
}

func newDenseHook(t *testing.T, be backend.Backend, cfg Config, BT int, dt backend.DType) *denseHook {
	h := &denseHook{cfg: cfg, be: be, BT: BT, dt: dt}
	h.x = make([][NumInputs]backend.Tensor, cfg.NumLayers)
	h.dw = make([][NumMatrices]backend.Tensor, cfg.NumLayers)
	h.ref = make([][NumMatrices][]float64, cfg.NumLayers)
	for l := range cfg.NumLayers {
		for k := range Matrix(NumMatrices) {
			mm, n := cfg.MatrixShape(k)
			var err error
			if h.x[l][matrixInput[k]].Buf == nil {
				if h.x[l][matrixInput[k]], err = be.Alloc("hook x", BT*mm, dt); err != nil {
					t.Fatal(err)
				}
			}
			if h.dw[l][k], err = be.Alloc("hook dw", mm*n, backend.F32); err != nil {
				t.Fatal(err)
			}
			h.ref[l][k] = make([]float64, mm*n)
		}
	}
	return h
}

func (h *denseHook) Input(s backend.Stream, l, in int, X backend.Tensor) error {
	h.calls = append(h.calls, fmt.Sprintf("in %d %d", l, in))
	if in < 0 || in >= NumInputs {
		return fmt.Errorf("input %d of %d", in, NumInputs)
	}
	if X.Len() != h.x[l][in].Len() || X.DType != h.dt {
		return fmt.Errorf("input %d of %d: %v, want %d elements of %v", in, l, X, h.x[l][in].Len(), h.dt)
	}
	return h.be.CopyD2D(s, h.x[l][in], X)
}

func (h *denseHook) OutputGrad(s backend.Stream, l, kk int, dY backend.Tensor) error {
	k := Matrix(kk)
	h.calls = append(h.calls, fmt.Sprintf("out %d %v", l, k))
	mm, n := h.cfg.MatrixShape(k)
	if !slices.Equal(dY.Shape, []int{h.BT, n}) || dY.DType != h.dt {
		return fmt.Errorf("output grad of %d %v: %v, want [%d %d] %v (the model dtype)", l, k, dY, h.BT, n, h.dt)
	}
	x := h.x[l][matrixInput[k]]
	if err := h.be.Gemm(s, true, false, mm, n, h.BT, 1, x, dY, 1, h.dw[l][k]); err != nil {
		return err
	}
	xs, err := backend.Download(h.be, s, x)
	if err != nil {
		return err
	}
	dy, err := backend.Download(h.be, s, dY)
	if err != nil {
		return err
	}
	ref := h.ref[l][k]
	for r := range h.BT {
		for i := range mm {
			xi := float64(xs[r*mm+i])
			for j := range n {
				ref[i*n+j] += xi * float64(dy[r*n+j])
			}
		}
	}
	return nil
}

// wantCalls is the order of hook calls of one micro-batch: every
// block's inputs in the forward, then the output grads in reverse; or,
// when the inputs are handed over in the backward's recompute
// (model.Options.HooksInRecompute), block by block from the last, its
// inputs and then its output grads.
func wantCalls(L int, inRecompute bool) []string {
	var calls []string
	ins := func(l int) {
		for in := range NumInputs {
			calls = append(calls, fmt.Sprintf("in %d %d", l, in))
		}
	}
	if !inRecompute {
		for l := range L {
			ins(l)
		}
	}
	for l := L - 1; l >= 0; l-- {
		if inRecompute {
			ins(l)
		}
		for k := Matrix(NumMatrices - 1); k >= 0; k-- {
			calls = append(calls, fmt.Sprintf("out %d %v", l, k))
		}
	}
	return calls
}

// TestMatrixHooksMatchDense: a hook that computes dW = X^T dY from the
// shared inputs it was handed gets every matrix gradient bit for bit as
// the model without hooks, and the dense gradients do not change either;
// for a tied and an untied head (the tied one with Qwen2's q, k and v
// biases); under every recompute setting, with and without hooks, the
// gradients are those of the model that recomputes nothing, to the bit, and the hooks see each input once (in the
// forward, or under --recompute layer in the backward's recompute, which
// hands over the recomputed input).
func TestMatrixHooksMatchDense(t *testing.T) {
	tied := hookCfg.clone()
	tied.Tied, tied.KVHeads, tied.RopeScaling = true, 1, &RopeScaling{Type: "linear", Factor: 2}
	// Qwen2's q, k and v biases: dense parameters next to hooked matrices.
	tied.QKVBias = true
	for _, cfg := range []Config{hookCfg, tied} {
		for _, dt := range dtypes {
			for _, rc := range model.Recomputes {
				t.Run(fmt.Sprintf("tied=%v/%v/recompute=%v", cfg.Tied, dt, rc), func(t *testing.T) {
					be := cpu.New(cpu.Config{})
					defer be.Close()
					s := be.DefaultStream()
					plain := hookModel(t, be, cfg, dt, model.Options{})
					plainRC := hookModel(t, be, cfg, dt, model.Options{Recompute: rc})
					h := newDenseHook(t, be, cfg, hookB*hookT, dt)
					// frozen: the same hooks with no dense gradient at all
					// (lsp --dense-params frozen).
					hf := newDenseHook(t, be, cfg, hookB*hookT, dt)
					frozen := hookModel(t, be, cfg, dt, model.Options{MatrixGrads: hf, Recompute: rc, FrozenDense: true})
					hooked := hookModel(t, be, cfg, dt, model.Options{MatrixGrads: h, Recompute: rc})
					for _, m := range []*Model{plain, plainRC, hooked, frozen} {
						must(t, m.ZeroGrads(s))
					}
					for mb := range 2 {
						want := microBatch(t, be, plain, mb, false)
						sameBits(t, fmt.Sprintf("logits of micro-batch %d, recomputing", mb), microBatch(t, be, plainRC, mb, mb == 0), want)
						got := microBatch(t, be, hooked, mb, mb == 1) // both call paths
						sameBits(t, fmt.Sprintf("logits of micro-batch %d", mb), got, want)
						sameBits(t, fmt.Sprintf("logits of micro-batch %d, frozen", mb), microBatch(t, be, frozen, mb, false), want)
					}
					if calls := wantCalls(cfg.NumLayers, rc == model.RecomputeLayer); !slices.Equal(h.calls, append(calls, calls...)) {
						t.Errorf("hook calls %v, want %v twice", h.calls, calls)
					}
					if !slices.Equal(hf.calls, h.calls) {
						t.Errorf("frozen: hook calls %v, want %v", hf.calls, h.calls)
					}
					for i, p := range frozen.Layout() {
						if _, ok := frozen.GradView(i); ok {
							t.Errorf("frozen: %s has a gradient", p.Name)
						}
					}
					for l := range cfg.NumLayers {
						for k := range Matrix(NumMatrices) {
							sameBits(t, fmt.Sprintf("frozen: hook grad %d %v", l, k), download(t, be, hf.dw[l][k]), download(t, be, h.dw[l][k]))
						}
					}
					plainGrads := download(t, be, plain.Grads)
					sameBits(t, "grads recomputing "+rc.String(), download(t, be, plainRC.Grads), plainGrads)
					matrices := 0
					for i, p := range plain.Layout() {
						want := plainGrads[p.Offset : p.Offset+p.Len()]
						if g, ok := hooked.GradView(i); ok {
							if cfg.isMatrix(i) {
								t.Errorf("%s is a matrix with a dense gradient under hooks", p.Name)
							}
							sameBits(t, "dense grad "+p.Name, download(t, be, g), want)
							continue
						}
						l, k := (i-1)/cfg.perLayer(), Matrix(-1)
						for kk := range Matrix(NumMatrices) {
							if cfg.MatrixParam(l, kk) == i {
								k = kk
							}
						}
						if k < 0 {
							t.Errorf("%s has no gradient view but is no matrix", p.Name)
							continue
						}
						matrices++
						got := download(t, be, h.dw[l][k])
						sameBits(t, "hook grad "+p.Name, got, want)
						closeToF64(t, "hook grad "+p.Name+" vs float64", got, h.ref[l][k], 1e-5)
					}
					if matrices != NumMatrices*cfg.NumLayers {
						t.Errorf("%d matrices without a dense gradient, want %d", matrices, NumMatrices*cfg.NumLayers)
					}
				})
			}
		}
	}
}

// closeToF64 compares with a float64 reference, relative to its scale.
func closeToF64(t *testing.T, what string, got []float32, want []float64, rtol float64) {
	t.Helper()
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	if scale == 0 {
		t.Errorf("%s: reference is all zero", what)
	}
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > rtol*scale {
			t.Errorf("%s[%d] = %.8g, want %.8g", what, i, got[i], want[i])
			return
		}
	}
}

// nopHook lets the model run in hook mode without doing anything.
type nopHook struct{ err error }

func (h nopHook) Input(backend.Stream, int, int, backend.Tensor) error      { return h.err }
func (h nopHook) OutputGrad(backend.Stream, int, int, backend.Tensor) error { return h.err }

// TestMemoryWithMatchesAllocation: MemoryWith predicts New's device memory to
// the byte, part by part, and Free returns all of it.
func TestMemoryWithMatchesAllocation(t *testing.T) {
	tiny, err := Preset("llama-tiny")
	must(t, err)
	tied := hookCfg.clone()
	tied.Tied, tied.QKVBias = true, true
	wideHeads := Config{Vocab: 5, Hidden: 4, Intermediate: 3, NumLayers: 1, Heads: 2, KVHeads: 1, HeadDim: 6,
		Eps: 1e-5, RopeTheta: 10000, MaxPos: 3}
	for _, tc := range []struct {
		cfg  Config
		B, T int
	}{{hookCfg, hookB, hookT}, {tied, 1, 5}, {tiny, 2, 16}, {wideHeads, 1, 3}} {
		for _, dt := range dtypes {
			for _, gdt := range dtypes {
				for _, opts := range modeltest.WithRecompute([]model.Options{{GradDType: gdt}, {GradDType: gdt, MatrixGrads: nopHook{}}}) {
					name := fmt.Sprintf("C%d-L%d-tied=%v/%v/grads-%v/hooks=%v/recompute=%v", tc.cfg.Hidden, tc.cfg.NumLayers, tc.cfg.Tied, dt, gdt, opts.MatrixGrads != nil, opts.Recompute)
					t.Run(name, func(t *testing.T) {
						be := cpu.New(cpu.Config{})
						defer be.Close()
						before := be.MemStats().InUse
						m, err := New(be, tc.cfg, tc.B, tc.T, dt, opts)
						must(t, err)
						plan := tc.cfg.MemoryWith(tc.B, tc.T, dt, opts)
						if got := be.MemStats().InUse - before; got != plan.Total() {
							t.Errorf("allocated %d bytes, plan %d (%+v)", got, plan.Total(), plan)
						}
						if got := m.Params.Bytes(); got != plan.Params {
							t.Errorf("params %d bytes, plan %d", got, plan.Params)
						}
						if m.Grads.Bytes() != plan.Grads {
							t.Errorf("grads %d bytes, plan %d", m.Grads.Bytes(), plan.Grads)
						}
						if got := m.acts.Bytes() + m.statsBuf.Bytes(); got != plan.Activations {
							t.Errorf("activations %d bytes, plan %d", got, plan.Activations)
						}
						if got := m.grad.Bytes() + m.bwdScratch.Bytes(); got != plan.ActGrads {
							t.Errorf("activation gradients and scratch %d bytes, plan %d", got, plan.ActGrads)
						}
						checkActViews(t, m)
						wantGrads := tc.cfg.NumParams()
						if opts.MatrixGrads != nil {
							for range tc.cfg.NumLayers {
								for k := range Matrix(NumMatrices) {
									mm, n := tc.cfg.MatrixShape(k)
									wantGrads -= mm * n
								}
							}
						}
						if m.Grads.Len() != wantGrads {
							t.Errorf("grads hold %d elements, want %d", m.Grads.Len(), wantGrads)
						}
						m.Free()
						if got := be.MemStats().InUse; got != before {
							t.Errorf("%d bytes in use after Free, want %d", got, before)
						}
					})
				}
			}
		}
	}
}

// checkActViews: the activation views fill their allocations exactly (a
// plan that merely agrees with an oversized allocation fails here), and
// each block keeps its own view of an activation exactly when the hooks
// and the recompute setting say so (the others are shared by every block).
func checkActViews(t *testing.T, m *Model) {
	t.Helper()
	nd, ns := modeltest.CheckActViews(t, m.Cfg.blockActs(m.B, m.T), m.actViews, m.rc, m.hooks != nil)
	for _, v := range []backend.Tensor{m.encoded, m.lnf, m.scratch, m.Logits} {
		nd += v.Len()
	}
	for _, v := range []backend.Tensor{m.invFreq, m.rstdf, m.Losses} {
		ns += v.Len()
	}
	if nd != m.acts.Len() || ns != m.statsBuf.Len() {
		t.Errorf("activation views hold %d and %d fp32 elements, allocations %d and %d", nd, ns, m.acts.Len(), m.statsBuf.Len())
	}
	if m.grad.DType != m.DType {
		t.Errorf("activation gradients in %v, model in %v", m.grad.DType, m.DType)
	}
	for _, part := range []struct {
		name  string
		alloc backend.Tensor
		views []backend.Tensor
	}{{"activation gradients", m.grad, []backend.Tensor{m.dres, m.dbuf, m.dwide}}} {
		n := 0
		for _, v := range part.views {
			n += v.Len()
		}
		if n != part.alloc.Len() {
			t.Errorf("%s: views hold %d elements, allocation %d", part.name, n, part.alloc.Len())
		}
	}
}

// TestMatrixLayout: MatrixShape, MatrixParam and Matrices name the
// layout's matrices, and model.NewIndex reads four shared inputs: q, k, v
// one; o one; gate and up one; down one.
func TestMatrixLayout(t *testing.T) {
	suffix := map[Matrix]string{MatQ: "self_attn.q_proj.weight", MatK: "self_attn.k_proj.weight", MatV: "self_attn.v_proj.weight",
		MatO: "self_attn.o_proj.weight", MatGate: "mlp.gate_proj.weight", MatUp: "mlp.up_proj.weight", MatDown: "mlp.down_proj.weight"}
	for _, name := range []string{"llama3-8b", "smollm2-135m"} {
		cfg, err := Preset(name)
		must(t, err)
		cfg.NumLayers = 3
		layout := cfg.Layout()
		for l := range cfg.NumLayers {
			for k := range Matrix(NumMatrices) {
				p := layout[cfg.MatrixParam(l, k)]
				if want := fmt.Sprintf("model.layers.%d.%s", l, suffix[k]); p.Name != want {
					t.Errorf("MatrixParam(%d, %v) is %s, want %s", l, k, p.Name, want)
				}
				mm, n := cfg.MatrixShape(k)
				if !slices.Equal(p.Shape, []int{mm, n}) || !p.Transposed || !p.Decay {
					t.Errorf("%s: shape %v transposed %v decay %v, want %d x %d, transposed, decayed", p.Name, p.Shape, p.Transposed, p.Decay, mm, n)
				}
			}
		}
		for _, p := range layout {
			if len(p.Shape) == 1 && (p.Decay || p.Transposed) {
				t.Errorf("%s: a norm with decay %v, transposed %v", p.Name, p.Decay, p.Transposed)
			}
		}
		if last := layout[len(layout)-1]; cfg.Tied != (last.Name == "model.norm.weight") {
			t.Errorf("tied=%v, layout ends with %s", cfg.Tied, last.Name)
		}
		x, err := model.NewIndex(cfg)
		must(t, err)
		if x.Inputs != NumInputs || !slices.Equal(x.InputM, []int{cfg.Hidden, cfg.qWidth(), cfg.Hidden, cfg.Intermediate}) {
			t.Errorf("%s: %d inputs of widths %v", name, x.Inputs, x.InputM)
		}
		want := [][]int{{0, 1, 2}, {3}, {4, 5}, {6}}
		for in, r := range x.Readers {
			if !slices.Equal(r, want[in]) {
				t.Errorf("%s: input %d read by %v, want %v", name, in, r, want[in])
			}
		}
		for l := range cfg.NumLayers {
			for k := range Matrix(NumMatrices) {
				if x.MatParam[l][k] != cfg.MatrixParam(l, k) {
					t.Errorf("index: matrix %v of block %d at %d, MatrixParam says %d", k, l, x.MatParam[l][k], cfg.MatrixParam(l, k))
				}
			}
		}
		for i := range layout {
			if x.IsMat[i] != cfg.isMatrix(i) {
				t.Errorf("index: IsMat[%d] = %v, isMatrix says %v", i, x.IsMat[i], cfg.isMatrix(i))
			}
		}
	}
}

// TestPassErrors: hook errors and bad layer numbers come back as errors.
func TestPassErrors(t *testing.T) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	boom := errors.New("boom")
	m := hookModel(t, be, hookCfg, backend.F32, model.Options{MatrixGrads: nopHook{err: boom}})
	setBatch(t, be, m, 0)
	if err := m.Forward(s); !errors.Is(err, boom) {
		t.Errorf("Forward with a failing input hook: %v", err)
	}
	if err := m.BackwardLayer(s, 0); !errors.Is(err, boom) {
		t.Errorf("BackwardLayer with a failing output-grad hook: %v", err)
	}
	for _, l := range []int{-1, hookCfg.NumLayers} {
		if err := m.ForwardLayer(s, l); err == nil {
			t.Errorf("ForwardLayer(%d) succeeded", l)
		}
		if err := m.BackwardLayer(s, l); err == nil {
			t.Errorf("BackwardLayer(%d) succeeded", l)
		}
	}
}

// TestKernelDTypes: at bf16 the passes use only the storage types the
// CUDA kernels take, with and without hooks, with fp32 and bf16 parameter
// gradients; the gradients are those of a plain backend, bit for bit.
func TestKernelDTypes(t *testing.T) {
	for _, gdt := range dtypes {
		for _, hooked := range []bool{false, true} {
			t.Run(fmt.Sprintf("grad-%v/hooks=%v", gdt, hooked), func(t *testing.T) {
				var grads [2][]float32
				for i, strict := range []bool{false, true} {
					be := cpu.New(cpu.Config{KernelDTypes: strict})
					defer be.Close()
					opts := model.Options{GradDType: gdt}
					if hooked {
						opts.MatrixGrads = newDenseHook(t, be, hookCfg, hookB*hookT, backend.BF16)
					}
					m := hookModel(t, be, hookCfg, backend.BF16, opts)
					must(t, m.ZeroGrads(be.DefaultStream()))
					microBatch(t, be, m, 0, false)
					grads[i] = download(t, be, m.Grads)
				}
				sameBits(t, "grads under KernelDTypes", grads[1], grads[0])
			})
		}
	}
	be := cpu.New(cpu.Config{KernelDTypes: true})
	defer be.Close()
	m := hookModel(t, be, hookCfg, backend.F32, model.Options{})
	setBatch(t, be, m, 0)
	if err := m.Forward(be.DefaultStream()); err == nil || !strings.Contains(err.Error(), "Gemm(A fp32, B fp32, C fp32)") {
		t.Errorf("an fp32 model's forward under KernelDTypes: %v, want the GEMM refused", err)
	}
}
