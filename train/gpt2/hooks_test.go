package gpt2

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

// hookCfg is small enough for bit-exact comparisons of every gradient.
var hookCfg = Config{V: 64, MaxT: 16, C: 32, L: 2, NH: 4, Eps: 1e-5}

const hookB, hookT = 2, 8

// hookModel builds a model with hookCfg's random weights (non-trivial norms
// and biases) in dtype dt.
func hookModel(t *testing.T, be backend.Backend, dt backend.DType, opts model.Options) *Model {
	t.Helper()
	m, err := NewWithOptions(be, hookCfg, hookB, hookT, dt, opts)
	if err != nil {
		t.Fatal(err)
	}
	vals := Init(hookCfg, 5)
	rng := rand.New(rand.NewPCG(6, 7))
	for _, p := range hookCfg.Layout() {
		if len(p.Shape) == 1 {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				vals[i] += float32(rng.NormFloat64() * 0.1)
			}
		}
	}
	if err := backend.Upload(be, be.DefaultStream(), m.Params, vals); err != nil {
		t.Fatal(err)
	}
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
		inp[i] = int32(rng.IntN(m.Cfg.V))
		tgt[i] = int32(rng.IntN(m.Cfg.V))
		if i%5 == 0 {
			tgt[i] = -1
		}
	}
	s := be.DefaultStream()
	if err := backend.UploadInt32(be, s, m.Inputs, inp); err != nil {
		t.Fatal(err)
	}
	if err := backend.UploadInt32(be, s, m.Targets, tgt); err != nil {
		t.Fatal(err)
	}
}

// microBatch runs forward, loss and backward of micro-batch mb, either
// through Forward/Backward or through the per-layer calls, and returns the
// logits of the forward.
func microBatch(t *testing.T, be backend.Backend, m *Model, mb int, split bool) []float32 {
	t.Helper()
	s := be.DefaultStream()
	setBatch(t, be, m, mb)
	run := func(f func() error) {
		t.Helper()
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if split {
		run(func() error { return m.ForwardEmbed(s) })
		for l := 0; l < m.Cfg.L; l++ {
			run(func() error { return m.ForwardLayer(s, l) })
		}
		run(func() error { return m.ForwardHead(s) })
	} else {
		run(func() error { return m.Forward(s) })
	}
	logits, err := backend.Download(be, s, m.Logits)
	if err != nil {
		t.Fatal(err)
	}
	run(func() error { return m.CrossEntropy(s, 1/float32(2*m.B*m.T)) })
	if split {
		run(func() error { return m.BackwardHead(s) })
		for l := m.Cfg.L - 1; l >= 0; l-- {
			run(func() error { return m.BackwardLayer(s, l) })
		}
		run(func() error { return m.BackwardEmbed(s) })
	} else {
		run(func() error { return m.Backward(s) })
	}
	return logits
}

func download(t *testing.T, be backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	v, err := backend.Download(be, be.DefaultStream(), x)
	if err != nil {
		t.Fatal(err)
	}
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

var dtypes = []backend.DType{backend.F32, backend.BF16}

// TestSplitPassesMatchWhole: the per-layer calls are Forward and Backward
// to the bit, over two accumulated micro-batches.
func TestSplitPassesMatchWhole(t *testing.T) {
	for _, dt := range dtypes {
		t.Run(dt.String(), func(t *testing.T) {
			be := cpu.New(cpu.Config{})
			defer be.Close()
			m := hookModel(t, be, dt, model.Options{})
			var logits [2][][]float32
			var grads [2][]float32
			for i, split := range []bool{false, true} {
				if err := m.ZeroGrads(be.DefaultStream()); err != nil {
					t.Fatal(err)
				}
				for mb := range 2 {
					logits[i] = append(logits[i], microBatch(t, be, m, mb, split))
				}
				grads[i] = download(t, be, m.Grads)
			}
			for mb := range 2 {
				sameBits(t, fmt.Sprintf("logits of micro-batch %d", mb), logits[1][mb], logits[0][mb])
			}
			sameBits(t, "grads", grads[1], grads[0])
			if !slices.ContainsFunc(grads[0], func(g float32) bool { return g != 0 }) {
				t.Error("every gradient is zero")
			}
		})
	}
}

// denseHook computes the matrices' gradients densely from what the hooks
// hand it, as the model would: dW += X^T dY with X copied in the forward.
// It also accumulates X^T dY in float64 on the host, as an independent
// reference for its own Gemm.
type denseHook struct {
	t     *testing.T
	be    backend.Backend
	cfg   Config
	BT    int
	dt    backend.DType
	x, dw [][NumMatrices]backend.Tensor
	ref   [][NumMatrices][]float64
	calls []string
}

func newDenseHook(t *testing.T, be backend.Backend, cfg Config, BT int, dt backend.DType) *denseHook {
	h := &denseHook{t: t, be: be, cfg: cfg, BT: BT, dt: dt}
	h.x = make([][NumMatrices]backend.Tensor, cfg.L)
	h.dw = make([][NumMatrices]backend.Tensor, cfg.L)
	h.ref = make([][NumMatrices][]float64, cfg.L)
	for l := range cfg.L {
		for k := range Matrix(NumMatrices) {
			mm, n := cfg.MatrixShape(k)
			var err error
			if h.x[l][k], err = be.Alloc("hook x", BT*mm, dt); err != nil {
				t.Fatal(err)
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
	k := Matrix(in) // GPT-2: input k is matrix k's
	h.calls = append(h.calls, fmt.Sprintf("in %d %v", l, k))
	mm, _ := h.cfg.MatrixShape(k)
	if !slices.Equal(X.Shape, []int{h.BT, mm}) || X.DType != h.dt {
		return fmt.Errorf("input of %d %v: %v, want [%d %d] %v", l, k, X, h.BT, mm, h.dt)
	}
	return h.be.CopyD2D(s, h.x[l][k], X)
}

func (h *denseHook) OutputGrad(s backend.Stream, l, kk int, dY backend.Tensor) error {
	k := Matrix(kk)
	h.calls = append(h.calls, fmt.Sprintf("out %d %v", l, k))
	mm, n := h.cfg.MatrixShape(k)
	if !slices.Equal(dY.Shape, []int{h.BT, n}) || dY.DType != h.dt {
		return fmt.Errorf("output grad of %d %v: %v, want [%d %d] %v (the model dtype)", l, k, dY, h.BT, n, h.dt)
	}
	if err := h.be.Gemm(s, true, false, mm, n, h.BT, 1, h.x[l][k], dY, 1, h.dw[l][k]); err != nil {
		return err
	}
	// Downloads synchronize s: fine in a test.
	x, err := backend.Download(h.be, s, h.x[l][k])
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
			xi := float64(x[r*mm+i])
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
		for k := range Matrix(NumMatrices) {
			calls = append(calls, fmt.Sprintf("in %d %v", l, k))
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

// TestMatrixHooksMatchDense: a hook that computes dW = X^T dY itself gets
// every matrix gradient bit for bit as the model without hooks, and the
// model's own (dense) gradients do not change either; under every
// recompute setting, with and without hooks, the gradients are those of
// the model that recomputes nothing, to the bit, and the hooks see each
// input once (in the forward, or under --recompute layer in the
// backward's recompute, which hands over the recomputed input).
func TestMatrixHooksMatchDense(t *testing.T) {
	for _, dt := range dtypes {
		for _, rc := range model.Recomputes {
			t.Run(fmt.Sprintf("%v/recompute=%v", dt, rc), func(t *testing.T) {
				be := cpu.New(cpu.Config{})
				defer be.Close()
				s := be.DefaultStream()
				plain := hookModel(t, be, dt, model.Options{})
				plainRC := hookModel(t, be, dt, model.Options{Recompute: rc})
				h := newDenseHook(t, be, hookCfg, hookB*hookT, dt)
				hooked := hookModel(t, be, dt, model.Options{MatrixGrads: h, Recompute: rc})
				// frozen: the same hooks with no dense gradient at all
				// (lsp --dense-params frozen).
				hf := newDenseHook(t, be, hookCfg, hookB*hookT, dt)
				frozen := hookModel(t, be, dt, model.Options{MatrixGrads: hf, Recompute: rc, FrozenDense: true})
				for _, m := range []*Model{plain, plainRC, hooked, frozen} {
					if err := m.ZeroGrads(s); err != nil {
						t.Fatal(err)
					}
				}
				for mb := range 2 {
					want := microBatch(t, be, plain, mb, false)
					sameBits(t, fmt.Sprintf("logits of micro-batch %d, recomputing", mb), microBatch(t, be, plainRC, mb, mb == 0), want)
					got := microBatch(t, be, hooked, mb, mb == 1) // both call paths
					sameBits(t, fmt.Sprintf("logits of micro-batch %d", mb), got, want)
					sameBits(t, fmt.Sprintf("logits of micro-batch %d, frozen", mb), microBatch(t, be, frozen, mb, false), want)
				}
				if calls := wantCalls(hookCfg.L, rc == model.RecomputeLayer); !slices.Equal(h.calls, append(calls, calls...)) {
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
				for l := range hookCfg.L {
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
						if !slices.Equal(g.Shape, p.Shape) {
							t.Errorf("%s: grad view shape %v, want %v", p.Name, g.Shape, p.Shape)
						}
						sameBits(t, "dense grad "+p.Name, download(t, be, g), want)
						continue
					}
					l, k := (i-2)/perLayer, Matrix(-1)
					for kk := range Matrix(NumMatrices) {
						if hookCfg.MatrixParam(l, kk) == i {
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
				if matrices != NumMatrices*hookCfg.L {
					t.Errorf("%d matrices without a dense gradient, want %d", matrices, NumMatrices*hookCfg.L)
				}
			})
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

// TestMemoryWithMatchesAllocation: MemoryWith predicts NewWithOptions' device
// memory to the byte, and Free returns all of it.
func TestMemoryWithMatchesAllocation(t *testing.T) {
	tiny, err := Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  Config
		B, T int
	}{{hookCfg, hookB, hookT}, {tiny, 2, 16}, {Config{V: 5, MaxT: 3, C: 4, L: 1, NH: 2, Eps: 1e-5}, 1, 3}} {
		for _, dt := range dtypes {
			for _, opts := range modeltest.WithRecompute([]model.Options{{}, {MatrixGrads: nopHook{}}}) {
				name := fmt.Sprintf("L%d/%v/hooks=%v/recompute=%v", tc.cfg.L, dt, opts.MatrixGrads != nil, opts.Recompute)
				t.Run(name, func(t *testing.T) {
					be := cpu.New(cpu.Config{})
					defer be.Close()
					before := be.MemStats().InUse
					m, err := NewWithOptions(be, tc.cfg, tc.B, tc.T, dt, opts)
					if err != nil {
						t.Fatal(err)
					}
					plan := tc.cfg.MemoryWith(tc.B, tc.T, dt, opts)
					if got := be.MemStats().InUse - before; got != plan.Total() {
						t.Errorf("allocated %d bytes, plan %d (%+v)", got, plan.Total(), plan)
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
						for range tc.cfg.L {
							for k := range Matrix(NumMatrices) {
								mm, n := tc.cfg.MatrixShape(k)
								wantGrads -= mm * n
							}
						}
					} else if opts.Recompute == model.RecomputeNone && plan != tc.cfg.Memory(tc.B, tc.T, dt) {
						t.Errorf("MemoryWith without hooks %+v, Memory %+v", plan, tc.cfg.Memory(tc.B, tc.T, dt))
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

// checkActViews: the activation views fill their allocations exactly
// (a plan that merely agrees with an oversized allocation fails here), and
// each block keeps its own view of an activation exactly when the hooks
// and the recompute setting say so (the others are shared by every block).
func checkActViews(t *testing.T, m *Model) {
	t.Helper()
	nd, ns := modeltest.CheckActViews(t, m.Cfg.blockActs(m.B, m.T), m.actViews, m.rc, m.hooks != nil)
	for _, v := range []backend.Tensor{m.encoded, m.lnf, m.scratch, m.Logits} {
		nd += v.Len()
	}
	for _, v := range []backend.Tensor{m.lnfMean, m.lnfRstd, m.Losses} {
		ns += v.Len()
	}
	if nd != m.acts.Len() || ns != m.statsBuf.Len() {
		t.Errorf("activation views hold %d and %d fp32 elements, allocations %d and %d", nd, ns, m.acts.Len(), m.statsBuf.Len())
	}
	// The activation gradients are in the model dtype: half the bytes at
	// bf16.
	if m.grad.DType != m.DType {
		t.Errorf("activation gradients in %v, model in %v", m.grad.DType, m.DType)
	}
	for _, part := range []struct {
		name  string
		alloc backend.Tensor
		views []backend.Tensor
	}{{"activation gradients", m.grad, []backend.Tensor{m.dres, m.dbuf, m.dqkv, m.dfch}}} {
		n := 0
		for _, v := range part.views {
			n += v.Len()
		}
		if n != part.alloc.Len() {
			t.Errorf("%s: views hold %d elements, allocation %d", part.name, n, part.alloc.Len())
		}
	}
}

// TestMatrixLayout: MatrixShape and MatrixParam name the layout's matrices.
func TestMatrixLayout(t *testing.T) {
	suffix := map[Matrix]string{MatQKV: "attn.c_attn.weight", MatProj: "attn.c_proj.weight", MatFC: "mlp.c_fc.weight", MatFCProj: "mlp.c_proj.weight"}
	names := map[Matrix]string{MatQKV: "qkv", MatProj: "proj", MatFC: "fc", MatFCProj: "fcproj"}
	for _, cfg := range []Config{hookCfg, {V: 50257, MaxT: 1024, C: 768, L: 3, NH: 12, Eps: 1e-5}} {
		layout := cfg.Layout()
		matrices := 0
		for i := range layout {
			if cfg.isMatrix(i) {
				matrices++
			}
		}
		if matrices != NumMatrices*cfg.L {
			t.Errorf("C=%d: %d matrices, want %d", cfg.C, matrices, NumMatrices*cfg.L)
		}
		for l := range cfg.L {
			for k := range Matrix(NumMatrices) {
				if k.String() != names[k] {
					t.Errorf("Matrix(%d).String() = %q, want %q", k, k.String(), names[k])
				}
				p := layout[cfg.MatrixParam(l, k)]
				if want := fmt.Sprintf("transformer.h.%d.%s", l, suffix[k]); p.Name != want {
					t.Errorf("MatrixParam(%d, %v) is %s, want %s", l, k, p.Name, want)
				}
				mm, n := cfg.MatrixShape(k)
				if !slices.Equal(p.Shape, []int{mm, n}) {
					t.Errorf("MatrixShape(%v) = %d x %d, layout %v", k, mm, n, p.Shape)
				}
				if !cfg.isMatrix(cfg.MatrixParam(l, k)) {
					t.Errorf("isMatrix(MatrixParam(%d, %v)) is false", l, k)
				}
			}
		}
		// The description the engine reads says the same: four matrices
		// per block, each with an input of its own, at MatrixParam.
		x, err := model.NewIndex(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if x.Inputs != NumMatrices || len(x.Blocks) != cfg.L || len(x.Blocks[0]) != perLayer {
			t.Errorf("index: %d inputs, %d blocks of %d parameters", x.Inputs, len(x.Blocks), len(x.Blocks[0]))
		}
		if want := []int{0, 1, len(layout) - 2, len(layout) - 1}; !slices.Equal(x.Outside, want) {
			t.Errorf("parameters outside the blocks %v, want %v", x.Outside, want)
		}
		for l := range cfg.L {
			for k := range Matrix(NumMatrices) {
				if i := x.MatParam[l][k]; i != cfg.MatrixParam(l, k) {
					t.Errorf("index: matrix %v of block %d at %d, MatrixParam says %d", k, l, i, cfg.MatrixParam(l, k))
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
	m := hookModel(t, be, backend.F32, model.Options{MatrixGrads: nopHook{err: boom}})
	setBatch(t, be, m, 0)
	if err := m.Forward(s); !errors.Is(err, boom) {
		t.Errorf("Forward with a failing input hook: %v", err)
	}
	if err := m.BackwardLayer(s, 0); !errors.Is(err, boom) {
		t.Errorf("BackwardLayer with a failing output-grad hook: %v", err)
	}
	for _, l := range []int{-1, hookCfg.L} {
		if err := m.ForwardLayer(s, l); err == nil {
			t.Errorf("ForwardLayer(%d) succeeded", l)
		}
		if err := m.BackwardLayer(s, l); err == nil {
			t.Errorf("BackwardLayer(%d) succeeded", l)
		}
	}
}

// TestKernelDTypes: at bf16 the passes use only the storage types the
// CUDA kernels take (the CPU backend's KernelDTypes mode refuses the
// rest), with and without matrix hooks, with fp32 and bf16 parameter
// gradients; the gradients are those of a plain backend, bit for bit (the
// mode only checks). An fp32 model is refused, naming the GEMM: the
// kernels have no fp32 GEMM.
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
					m := hookModel(t, be, backend.BF16, opts)
					if err := m.ZeroGrads(be.DefaultStream()); err != nil {
						t.Fatal(err)
					}
					microBatch(t, be, m, 0, false)
					grads[i] = download(t, be, m.Grads)
				}
				sameBits(t, "grads under KernelDTypes", grads[1], grads[0])
			})
		}
	}
	be := cpu.New(cpu.Config{KernelDTypes: true})
	defer be.Close()
	m := hookModel(t, be, backend.F32, model.Options{})
	setBatch(t, be, m, 0)
	if err := m.Forward(be.DefaultStream()); err == nil || !strings.Contains(err.Error(), "Gemm(A fp32, B fp32, C fp32)") {
		t.Errorf("an fp32 model's forward under KernelDTypes: %v, want the GEMM refused", err)
	}
}
