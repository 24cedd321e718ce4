package modeltest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Blocked is a model whose forward also runs block by block, as every
// family's does (the engine's schedule), besides in one call.
type Blocked interface {
	model.Model
	ForwardEmbed(s backend.Stream) error
	ForwardLayer(s backend.Stream, l int) error
	ForwardHead(s backend.Stream) error
	Backward(s backend.Stream) error
}

// DTypes are the model dtypes the pass checks run at.
var DTypes = []backend.DType{backend.F32, backend.BF16}

// Family is what the pass checks of this file need of a model family: a
// configuration small enough to compare every gradient bit for bit, its
// vocabulary, and New, which builds a model of it for batches of B x T
// with the family test's random weights.
type Family struct {
	Arch model.Arch
	V    int
	B, T int
	New  func(t *testing.T, be backend.Backend, dt backend.DType, opts model.Options) Blocked
}

// SetBatch uploads micro-batch number mb to m (its own tokens of the
// vocabulary V; every fifth target ignored).
func SetBatch(t *testing.T, be backend.Backend, m model.Model, V, mb int) {
	t.Helper()
	bufs := m.Buffers()
	rng := rand.New(rand.NewPCG(uint64(mb), 99))
	inp := make([]int32, bufs.Inputs.Len())
	tgt := make([]int32, len(inp))
	for i := range inp {
		inp[i] = int32(rng.IntN(V))
		tgt[i] = int32(rng.IntN(V))
		if i%5 == 0 {
			tgt[i] = -1
		}
	}
	s := be.DefaultStream()
	Must(t, backend.UploadInt32(be, s, bufs.Inputs, inp))
	Must(t, backend.UploadInt32(be, s, bufs.Targets, tgt))
}

// microBatch runs forward, loss and backward of micro-batch mb, either
// through Forward/Backward or through the per-layer calls, and returns the
// logits of the forward.
func (f Family) microBatch(t *testing.T, be backend.Backend, m Blocked, mb int, split bool) []float32 {
	t.Helper()
	s := be.DefaultStream()
	L := f.Arch.Layers()
	SetBatch(t, be, m, f.V, mb)
	if split {
		Must(t, m.ForwardEmbed(s))
		for l := range L {
			Must(t, m.ForwardLayer(s, l))
		}
		Must(t, m.ForwardHead(s))
	} else {
		Must(t, m.Forward(s))
	}
	logits := Download(t, be, m.Buffers().Logits)
	Must(t, m.CrossEntropy(s, 1/float32(2*f.B*f.T)))
	if split {
		Must(t, m.BackwardHead(s))
		for l := L - 1; l >= 0; l-- {
			Must(t, m.BackwardLayer(s, l))
		}
		Must(t, m.BackwardEmbed(s))
	} else {
		Must(t, m.Backward(s))
	}
	return logits
}

// CheckSplitPasses: the per-layer calls are Forward and Backward to the
// bit, over two accumulated micro-batches, and every parameter gets a
// gradient.
func (f Family) CheckSplitPasses(t *testing.T, dt backend.DType) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	m := f.New(t, be, dt, model.Options{})
	var logits [2][][]float32
	var grads [2][]float32
	for i, split := range []bool{false, true} {
		Must(t, m.ZeroGrads(be.DefaultStream()))
		for mb := range 2 {
			logits[i] = append(logits[i], f.microBatch(t, be, m, mb, split))
		}
		grads[i] = Download(t, be, m.Buffers().Grads)
	}
	for mb := range 2 {
		SameBits(t, fmt.Sprintf("logits of micro-batch %d", mb), logits[1][mb], logits[0][mb])
	}
	SameBits(t, "grads", grads[1], grads[0])
	for _, p := range f.Arch.Layout() {
		g := grads[0][p.Offset : p.Offset+p.Len()]
		if !slices.ContainsFunc(g, func(v float32) bool { return v != 0 }) {
			t.Errorf("%s: every gradient is zero", p.Name)
		}
	}
}

// DenseHook computes the matrices' gradients densely from what the hooks
// hand it, as the model would: each block input X copied in the forward
// (once per input), and dW += X^T dY for each matrix reading it. It also
// accumulates X^T dY in float64 on the host, as an independent reference
// for its own Gemm.
type DenseHook struct {
	x     *model.Index
	be    backend.Backend
	BT    int
	dt    backend.DType
	X     [][]backend.Tensor // X[l][in]: block l's input in
	DW    [][]backend.Tensor // DW[l][k]: matrix k of block l's gradient
	Ref   [][][]float64      // Ref[l][k]: DW[l][k] in float64
	Calls []string           // "in l in" and "out l matrix", in call order
}

// newDenseHook allocates the hook's buffers for arch's matrices on be, for
// BT rows in dtype dt.
func newDenseHook(t *testing.T, be backend.Backend, arch model.Arch, BT int, dt backend.DType) *DenseHook {
	t.Helper()
	x, err := model.NewIndex(arch)
	Must(t, err)
	h := &DenseHook{x: x, be: be, BT: BT, dt: dt}
	for range arch.Layers() {
		var xs, dw []backend.Tensor
		var ref [][]float64
		for _, m := range x.InputM {
			v, err := be.Alloc("hook x", BT*m, dt)
			Must(t, err)
			xs = append(xs, v)
		}
		for _, mt := range x.Mats {
			v, err := be.Alloc("hook dw", mt.M*mt.N, backend.F32)
			Must(t, err)
			dw = append(dw, v)
			ref = append(ref, make([]float64, mt.M*mt.N))
		}
		h.X, h.DW, h.Ref = append(h.X, xs), append(h.DW, dw), append(h.Ref, ref)
	}
	return h
}

func (h *DenseHook) Input(s backend.Stream, l, in int, X backend.Tensor) error {
	h.Calls = append(h.Calls, fmt.Sprintf("in %d %d", l, in))
	if in < 0 || in >= h.x.Inputs {
		return fmt.Errorf("input %d of %d", in, h.x.Inputs)
	}
	if m := h.x.InputM[in]; !slices.Equal(X.Shape, []int{h.BT, m}) || X.DType != h.dt {
		return fmt.Errorf("input %d of %d: %v, want [%d %d] %v", in, l, X, h.BT, m, h.dt)
	}
	return h.be.CopyD2D(s, h.X[l][in], X)
}

func (h *DenseHook) OutputGrad(s backend.Stream, l, k int, dY backend.Tensor) error {
	mt := h.x.Mats[k]
	h.Calls = append(h.Calls, fmt.Sprintf("out %d %s", l, mt.Name))
	mm, n := mt.M, mt.N
	if !slices.Equal(dY.Shape, []int{h.BT, n}) || dY.DType != h.dt {
		return fmt.Errorf("output grad of %d %s: %v, want [%d %d] %v (the model dtype)", l, mt.Name, dY, h.BT, n, h.dt)
	}
	x := h.X[l][mt.Input]
	if err := h.be.Gemm(s, true, false, mm, n, h.BT, 1, x, dY, 1, h.DW[l][k]); err != nil {
		return err
	}
	// Downloads synchronize s: fine in a test.
	xs, err := backend.Download(h.be, s, x)
	if err != nil {
		return err
	}
	dy, err := backend.Download(h.be, s, dY)
	if err != nil {
		return err
	}
	ref := h.Ref[l][k]
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

// wantCalls is the order of hook calls of one micro-batch: every block's
// inputs in the forward, then the output grads in reverse; or, when the
// inputs are handed over in the backward's recompute
// (model.Options.HooksInRecompute), block by block from the last, its
// inputs and then its output grads.
func (h *DenseHook) wantCalls(inRecompute bool) []string {
	var calls []string
	ins := func(l int) {
		for in := range h.x.Inputs {
			calls = append(calls, fmt.Sprintf("in %d %d", l, in))
		}
	}
	L := len(h.X)
	if !inRecompute {
		for l := range L {
			ins(l)
		}
	}
	for l := L - 1; l >= 0; l-- {
		if inRecompute {
			ins(l)
		}
		for k := len(h.x.Mats) - 1; k >= 0; k-- {
			calls = append(calls, fmt.Sprintf("out %d %s", l, h.x.Mats[k].Name))
		}
	}
	return calls
}

// CheckMatrixHooks: a hook that computes dW = X^T dY from the inputs it
// was handed gets every matrix gradient bit for bit as the model without
// hooks, and the model's own (dense) gradients do not change either; under
// the recompute setting rc, with and without hooks, the gradients are
// those of the model that recomputes nothing, to the bit, and the hooks
// see each input once (in the forward, or under --recompute layer in the
// backward's recompute, which hands over the recomputed input). The same
// hooks with no dense gradient at all (lsp --dense-params frozen) see the
// same.
func (f Family) CheckMatrixHooks(t *testing.T, dt backend.DType, rc model.Recompute) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	L := f.Arch.Layers()
	plain := f.New(t, be, dt, model.Options{})
	plainRC := f.New(t, be, dt, model.Options{Recompute: rc})
	h := newDenseHook(t, be, f.Arch, f.B*f.T, dt)
	hooked := f.New(t, be, dt, model.Options{MatrixGrads: h, Recompute: rc})
	hf := newDenseHook(t, be, f.Arch, f.B*f.T, dt)
	frozen := f.New(t, be, dt, model.Options{MatrixGrads: hf, Recompute: rc, FrozenDense: true})
	for _, m := range []Blocked{plain, plainRC, hooked, frozen} {
		Must(t, m.ZeroGrads(s))
	}
	for mb := range 2 {
		want := f.microBatch(t, be, plain, mb, false)
		SameBits(t, fmt.Sprintf("logits of micro-batch %d, recomputing", mb), f.microBatch(t, be, plainRC, mb, mb == 0), want)
		got := f.microBatch(t, be, hooked, mb, mb == 1) // both call paths
		SameBits(t, fmt.Sprintf("logits of micro-batch %d", mb), got, want)
		SameBits(t, fmt.Sprintf("logits of micro-batch %d, frozen", mb), f.microBatch(t, be, frozen, mb, false), want)
	}
	if calls := h.wantCalls(rc == model.RecomputeLayer); !slices.Equal(h.Calls, append(calls, calls...)) {
		t.Errorf("hook calls %v, want %v twice", h.Calls, calls)
	}
	if !slices.Equal(hf.Calls, h.Calls) {
		t.Errorf("frozen: hook calls %v, want %v", hf.Calls, h.Calls)
	}
	layout := f.Arch.Layout()
	for i, p := range layout {
		if _, ok := frozen.GradView(i); ok {
			t.Errorf("frozen: %s has a gradient", p.Name)
		}
	}
	for l := range L {
		for k, mt := range h.x.Mats {
			SameBits(t, fmt.Sprintf("frozen: hook grad %d %s", l, mt.Name), Download(t, be, hf.DW[l][k]), Download(t, be, h.DW[l][k]))
		}
	}
	plainGrads := Download(t, be, plain.Buffers().Grads)
	SameBits(t, "grads recomputing "+rc.String(), Download(t, be, plainRC.Buffers().Grads), plainGrads)
	matrices := 0
	for i, p := range layout {
		want := plainGrads[p.Offset : p.Offset+p.Len()]
		if g, ok := hooked.GradView(i); ok {
			if h.x.IsMat[i] {
				t.Errorf("%s is a matrix with a dense gradient under hooks", p.Name)
			}
			if !slices.Equal(g.Shape, p.Shape) {
				t.Errorf("%s: grad view shape %v, want %v", p.Name, g.Shape, p.Shape)
			}
			SameBits(t, "dense grad "+p.Name, Download(t, be, g), want)
			continue
		}
		l, k := p.Layer, -1
		if l >= 0 {
			k = slices.Index(h.x.MatParam[l], i)
		}
		if k < 0 {
			t.Errorf("%s has no gradient view but is no matrix", p.Name)
			continue
		}
		matrices++
		got := Download(t, be, h.DW[l][k])
		SameBits(t, "hook grad "+p.Name, got, want)
		CloseToF64(t, "hook grad "+p.Name+" vs float64", got, h.Ref[l][k], 1e-5)
	}
	if matrices != len(h.x.Mats)*L {
		t.Errorf("%d matrices without a dense gradient, want %d", matrices, len(h.x.Mats)*L)
	}
}

// NopHook lets a model run in hook mode without doing anything; Err is
// what its calls return.
type NopHook struct{ Err error }

func (h NopHook) Input(backend.Stream, int, int, backend.Tensor) error      { return h.Err }
func (h NopHook) OutputGrad(backend.Stream, int, int, backend.Tensor) error { return h.Err }

// CheckPassErrors: hook errors and bad layer numbers come back as errors.
func (f Family) CheckPassErrors(t *testing.T) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	boom := errors.New("boom")
	m := f.New(t, be, backend.F32, model.Options{MatrixGrads: NopHook{Err: boom}})
	SetBatch(t, be, m, f.V, 0)
	if err := m.Forward(s); !errors.Is(err, boom) {
		t.Errorf("Forward with a failing input hook: %v", err)
	}
	if err := m.BackwardLayer(s, 0); !errors.Is(err, boom) {
		t.Errorf("BackwardLayer with a failing output-grad hook: %v", err)
	}
	for _, l := range []int{-1, f.Arch.Layers()} {
		if err := m.ForwardLayer(s, l); err == nil {
			t.Errorf("ForwardLayer(%d) succeeded", l)
		}
		if err := m.BackwardLayer(s, l); err == nil {
			t.Errorf("BackwardLayer(%d) succeeded", l)
		}
	}
}

// CheckKernelDTypes: at bf16 the passes use only the storage types the
// CUDA kernels take (the CPU backend's KernelDTypes mode refuses the
// rest), with and without matrix hooks, with fp32 and bf16 parameter
// gradients; the gradients are those of a plain backend, bit for bit (the
// mode only checks). An fp32 model is refused, naming the GEMM: the
// kernels have no fp32 GEMM.
func (f Family) CheckKernelDTypes(t *testing.T) {
	for _, gdt := range DTypes {
		for _, hooked := range []bool{false, true} {
			t.Run(fmt.Sprintf("grad-%v/hooks=%v", gdt, hooked), func(t *testing.T) {
				var grads [2][]float32
				for i, strict := range []bool{false, true} {
					be := cpu.New(cpu.Config{KernelDTypes: strict})
					defer be.Close()
					opts := model.Options{GradDType: gdt}
					if hooked {
						opts.MatrixGrads = newDenseHook(t, be, f.Arch, f.B*f.T, backend.BF16)
					}
					m := f.New(t, be, backend.BF16, opts)
					Must(t, m.ZeroGrads(be.DefaultStream()))
					f.microBatch(t, be, m, 0, false)
					grads[i] = Download(t, be, m.Buffers().Grads)
				}
				SameBits(t, "grads under KernelDTypes", grads[1], grads[0])
			})
		}
	}
	be := cpu.New(cpu.Config{KernelDTypes: true})
	defer be.Close()
	m := f.New(t, be, backend.F32, model.Options{})
	SetBatch(t, be, m, f.V, 0)
	if err := m.Forward(be.DefaultStream()); err == nil || !strings.Contains(err.Error(), "Gemm(A fp32, B fp32, C fp32)") {
		t.Errorf("an fp32 model's forward under KernelDTypes: %v, want the GEMM refused", err)
	}
}

// MemoryCase is a configuration and batch shape for CheckMemoryCases.
type MemoryCase struct {
	Name string
	Arch model.Arch
	B, T int
}

// CheckMemoryCases runs CheckMemoryWith on every case in every dtype of
// DTypes, with parameter gradients in each of grads, without and with
// matrix hooks, under every recompute setting.
func CheckMemoryCases(t *testing.T, cases []MemoryCase, grads []backend.DType, parts func(*testing.T, model.Model) (acts, actGrads int64)) {
	for _, c := range cases {
		for _, dt := range DTypes {
			for _, gdt := range grads {
				for _, opts := range WithRecompute([]model.Options{{GradDType: gdt}, {GradDType: gdt, MatrixGrads: NopHook{}}}) {
					name := fmt.Sprintf("%s/%v/grads-%v/hooks=%v/recompute=%v", c.Name, dt, gdt, opts.MatrixGrads != nil, opts.Recompute)
					t.Run(name, func(t *testing.T) { CheckMemoryWith(t, c.Arch, c.B, c.T, dt, opts, parts) })
				}
			}
		}
	}
}

// CheckMemoryWith builds arch's model for B x T in dt with opts and
// checks that arch.MemoryWith predicted its device memory to the byte,
// part by part (parts: the family's count of the bytes the model
// allocated for its activations and for its activation gradients and
// scratch, which may check the model's views of them as well), that the
// gradients hold every parameter but the matrices under hooks, and that
// Free returns all of it.
func CheckMemoryWith(t *testing.T, arch model.Arch, B, T int, dt backend.DType, opts model.Options, parts func(*testing.T, model.Model) (acts, actGrads int64)) {
	t.Helper()
	be := cpu.New(cpu.Config{})
	defer be.Close()
	before := be.MemStats().InUse
	m, err := arch.NewModel(be, B, T, dt, opts)
	Must(t, err)
	plan := arch.MemoryWith(B, T, dt, opts)
	if got := be.MemStats().InUse - before; got != plan.Total() {
		t.Errorf("allocated %d bytes, plan %d (%+v)", got, plan.Total(), plan)
	}
	bufs := m.Buffers()
	if got := bufs.Params.Bytes(); got != plan.Params {
		t.Errorf("params %d bytes, plan %d", got, plan.Params)
	}
	if got := bufs.Grads.Bytes(); got != plan.Grads {
		t.Errorf("grads %d bytes, plan %d", got, plan.Grads)
	}
	acts, actGrads := parts(t, m)
	if acts != plan.Activations {
		t.Errorf("activations %d bytes, plan %d", acts, plan.Activations)
	}
	if actGrads != plan.ActGrads {
		t.Errorf("activation gradients and scratch %d bytes, plan %d", actGrads, plan.ActGrads)
	}
	wantGrads := arch.NumParams()
	if opts.MatrixGrads != nil {
		x, err := model.NewIndex(arch)
		Must(t, err)
		wantGrads -= x.MatrixElems()
	}
	if bufs.Grads.Len() != wantGrads {
		t.Errorf("grads hold %d elements, want %d", bufs.Grads.Len(), wantGrads)
	}
	m.Free()
	if got := be.MemStats().InUse; got != before {
		t.Errorf("%d bytes in use after Free, want %d", got, before)
	}
}
