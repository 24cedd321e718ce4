// A toy model that is not GPT-2, to show that the engine trains any model
// that describes itself through train/model: its two block matrices read
// the same input (as LLaMA's q, k and v do), so lsp mode must give them one
// P and one compressed activation.
//
//	x0 = emb[inp] + pos                          (B,T,C)
//	per block: x' = x + gelu(x W1 + b) + x W2    W1, W2: C x C, both read x
//	logits = x_L emb^T                            (tied head)

package engine

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// toyArch is the toy's architecture: V vocabulary, T positions, C width, L
// blocks.
type toyArch struct{ V, T, C, L int }

var toy = toyArch{V: 64, T: testT, C: 16, L: 2}

// Block slots: W1, W2, then the bias (the block's dense tensor).
const (
	toyW1, toyW2, toyBias = 0, 1, 2
	toyPerBlock           = 3
)

func (a toyArch) Layout() []model.Param {
	var ps []model.Param
	off := 0
	add := func(name string, layer int, decay bool, shape ...int) {
		p := model.Param{Name: name, Shape: shape, Offset: off, Decay: decay, Layer: layer}
		off += p.Len()
		ps = append(ps, p)
	}
	add("emb", -1, true, a.V, a.C)
	add("pos", -1, true, a.T, a.C)
	for l := range a.L {
		add(fmt.Sprintf("block.%d.w1", l), l, true, a.C, a.C)
		add(fmt.Sprintf("block.%d.w2", l), l, true, a.C, a.C)
		add(fmt.Sprintf("block.%d.bias", l), l, false, a.C)
	}
	return ps
}

func (a toyArch) Layers() int { return a.L }

func (a toyArch) Matrices() []model.Matrix {
	return []model.Matrix{
		{Name: "w1", Slot: toyW1, M: a.C, N: a.C, Input: 0},
		{Name: "w2", Slot: toyW2, M: a.C, N: a.C, Input: 0},
	}
}

func (a toyArch) NumParams() int { return a.V*a.C + a.T*a.C + a.L*(2*a.C*a.C+a.C) }

// sizes are the toy's allocations in elements: gradients, activations in
// the model dtype (x0, per block x and the pre-gelu h, logits), fp32
// activation gradients (dx, dh, scratch) and fp32 losses.
func (a toyArch) sizes(B, T int, hooked bool) (grads, acts, actGrads int) {
	BT := B * T
	grads = a.NumParams()
	if hooked {
		grads -= a.L * 2 * a.C * a.C
	}
	return grads, BT*a.C + a.L*2*BT*a.C + BT*a.V, 3 * BT * a.C
}

func (a toyArch) MemoryWith(B, T int, dt backend.DType, opts model.Options) model.Memory {
	grads, acts, actGrads := a.sizes(B, T, opts.MatrixGrads != nil)
	BT := int64(B * T)
	return model.Memory{
		Params:      int64(a.NumParams()) * int64(dt.Size()),
		Grads:       int64(grads) * int64(opts.GradDType.Size()),
		Activations: int64(acts)*int64(dt.Size()) + 4*BT,
		ActGrads:    int64(actGrads) * 4,
		Batch:       2 * BT * 4,
	}
}

func (a toyArch) NewModel(be backend.Backend, B, T int, dt backend.DType, opts model.Options) (model.Model, error) {
	if T > a.T {
		return nil, fmt.Errorf("toy: T = %d > %d", T, a.T)
	}
	m := &toyModel{a: a, be: be, B: B, T: T, layout: a.Layout(), hooks: opts.MatrixGrads}
	grads, acts, actGrads := a.sizes(B, T, m.hooks != nil)
	BT := B * T
	var err error
	alloc := func(name string, n int, dt backend.DType) backend.Tensor {
		if err != nil {
			return backend.Tensor{}
		}
		var t backend.Tensor
		if t, err = be.Alloc(name, n, dt); err == nil {
			m.allocs = append(m.allocs, t)
		}
		return t
	}
	gdt := opts.GradDType
	m.bufs.Params = alloc("toy params", a.NumParams(), dt)
	m.bufs.Grads = alloc("toy grads", grads, gdt)
	act := alloc("toy activations", acts, dt)
	m.bufs.Losses = alloc("toy losses", BT, backend.F32)
	ag := alloc("toy activation grads", actGrads, backend.F32)
	batch := alloc("toy batch", 2*BT, backend.I32)
	if err != nil {
		m.Free()
		return nil, err
	}
	m.bufs.Inputs, m.bufs.Targets = batch.Slice(0, BT), batch.Slice(BT, BT)
	ac, gc := &backend.Carver{T: act}, &backend.Carver{T: ag}
	m.x = append(m.x, ac.Next(BT, a.C))
	for range a.L {
		m.x = append(m.x, ac.Next(BT, a.C))
		m.h = append(m.h, ac.Next(BT, a.C))
	}
	m.logits = ac.Next(BT, a.V)
	m.dx, m.dh, m.tmp = gc.Next(BT, a.C), gc.Next(BT, a.C), gc.Next(BT, a.C)
	// Gradient views: the layout's, with the matrices left out under hooks.
	off := 0
	for i, p := range m.layout {
		if m.hooks != nil && p.Layer >= 0 && (i-2)%toyPerBlock != toyBias {
			m.gradOff = append(m.gradOff, -1)
			continue
		}
		m.gradOff = append(m.gradOff, off)
		off += p.Len()
	}
	return m, nil
}

// toyModel is the toy on a backend.
type toyModel struct {
	a       toyArch
	be      backend.Backend
	B, T    int
	layout  []model.Param
	hooks   model.MatrixGrads
	gradOff []int
	bufs    model.Buffers
	allocs  []backend.Tensor

	x      []backend.Tensor // x[l]: block l's input; x[L] the head's
	h      []backend.Tensor // h[l]: x W1 + b of block l
	logits backend.Tensor
	dx, dh backend.Tensor // fp32
	tmp    backend.Tensor // fp32
}

func (m *toyModel) Buffers() model.Buffers { return m.bufs }

func (m *toyModel) ParamView(t backend.Tensor, i int) backend.Tensor {
	p := m.layout[i]
	return t.Slice(p.Offset, p.Len(), p.Shape...)
}

func (m *toyModel) GradView(i int) (backend.Tensor, bool) {
	if m.gradOff[i] < 0 {
		return backend.Tensor{}, false
	}
	p := m.layout[i]
	return m.bufs.Grads.Slice(m.gradOff[i], p.Len(), p.Shape...), true
}

func (m *toyModel) param(l, slot int) backend.Tensor {
	return m.ParamView(m.bufs.Params, 2+l*toyPerBlock+slot)
}

func (m *toyModel) grad(i int) backend.Tensor {
	g, _ := m.GradView(i)
	return g
}

func (m *toyModel) ZeroGrads(s backend.Stream) error { return m.be.Fill(s, m.bufs.Grads, 0) }

func (m *toyModel) Forward(s backend.Stream) error {
	be, a, BT := m.be, m.a, m.B*m.T
	emb, pos := m.ParamView(m.bufs.Params, 0), m.ParamView(m.bufs.Params, 1)
	if err := be.EncoderForward(s, m.x[0], m.bufs.Inputs, backend.Tensor{}, emb, pos, m.B, m.T, a.C); err != nil {
		return err
	}
	for l := range a.L {
		x, h, out := m.x[l], m.h[l], m.x[l+1]
		if m.hooks != nil {
			if err := m.hooks.Input(s, l, 0, x); err != nil {
				return err
			}
		}
		steps := []func() error{
			func() error { return be.Gemm(s, false, false, BT, a.C, a.C, 1, x, m.param(l, toyW1), 0, h) },
			func() error { return be.AddBias(s, h, m.param(l, toyBias), BT, a.C) },
			func() error { return be.GeluForward(s, m.tmp, h) },
			func() error { return be.Add(s, out, x, m.tmp) },
			func() error { return be.Gemm(s, false, false, BT, a.C, a.C, 1, x, m.param(l, toyW2), 0, m.tmp) },
			func() error { return be.Accumulate(s, out, m.tmp) },
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return err
			}
		}
	}
	return be.Gemm(s, false, true, BT, a.V, a.C, 1, m.x[a.L], emb, 0, m.logits)
}

func (m *toyModel) CrossEntropy(s backend.Stream, scale float32) error {
	return m.be.CrossEntropyForwardBackward(s, m.bufs.Losses, m.logits, m.bufs.Targets, m.B*m.T, m.a.V, scale)
}

func (m *toyModel) BackwardHead(s backend.Stream) error {
	be, a, BT := m.be, m.a, m.B*m.T
	emb := m.ParamView(m.bufs.Params, 0)
	if err := be.Gemm(s, false, false, BT, a.C, a.V, 1, m.logits, emb, 0, m.dx); err != nil {
		return err
	}
	return be.Gemm(s, true, false, a.V, a.C, BT, 1, m.logits, m.x[a.L], 1, m.grad(0))
}

// BackwardLayer: dx holds dL/dx' on entry and dL/dx on exit.
func (m *toyModel) BackwardLayer(s backend.Stream, l int) error {
	be, a, BT := m.be, m.a, m.B*m.T
	x, first := m.x[l], 2+l*toyPerBlock
	weightGrad := func(k int, dY backend.Tensor) error {
		if m.hooks != nil {
			return m.hooks.OutputGrad(s, l, k, dY)
		}
		return be.Gemm(s, true, false, a.C, a.C, BT, 1, x, dY, 1, m.grad(first+k))
	}
	steps := []func() error{
		func() error { return be.GeluBackward(s, m.dh, m.h[l], m.dx) },
		func() error { return weightGrad(toyW2, m.dx) },
		func() error { return weightGrad(toyW1, m.dh) },
		func() error { return be.BiasBackward(s, m.grad(first+toyBias), m.dh, BT, a.C) },
		func() error { return be.Gemm(s, false, true, BT, a.C, a.C, 1, m.dx, m.param(l, toyW2), 0, m.tmp) },
		func() error { return be.Gemm(s, false, true, BT, a.C, a.C, 1, m.dh, m.param(l, toyW1), 1, m.tmp) },
		func() error { return be.Accumulate(s, m.dx, m.tmp) },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

func (m *toyModel) BackwardEmbed(s backend.Stream) error {
	return m.be.EncoderBackward(s, m.grad(0), m.grad(1), m.dx, m.bufs.Inputs, backend.Tensor{}, m.B, m.T, m.a.C)
}

func (m *toyModel) Free() {
	for _, t := range m.allocs {
		m.be.Free(t)
	}
	m.allocs = nil
}

// toyInit draws the toy's weights: small matrices, so the residual stream
// stays O(1).
func toyInit(a toyArch, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, a.NumParams())
	for _, p := range a.Layout() {
		std := 0.3
		if len(p.Shape) == 2 && p.Layer >= 0 {
			std = 0.5 / math.Sqrt(float64(a.C))
		}
		for i := p.Offset; i < p.Offset+p.Len(); i++ {
			v[i] = float32(rng.NormFloat64() * std)
		}
	}
	return v
}

func newToy(t *testing.T, cfg Config) *trainer {
	t.Helper()
	be := cpu.New(cpu.Config{Threads: 2})
	e, err := New(be, toy, testB, testT, 1, backend.F32, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Free(); be.Close() })
	if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, toyInit(toy, 3)); err != nil {
		t.Fatal(err)
	}
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	return &trainer{be: be, cpu: be, e: e, hazards: cpuHazards(be)}
}

// TestToyModelTrains: a model the engine has never heard of trains in every
// mode, and the plan of its memory holds.
func TestToyModelTrains(t *testing.T) {
	for _, tc := range pipelinedModes() {
		t.Run(tc.name, func(t *testing.T) {
			tr := newToy(t, tc.cfg)
			losses := tr.run(t, 80)
			mean := func(v []float64) float64 {
				s := 0.0
				for _, x := range v {
					s += x
				}
				return s / float64(len(v))
			}
			first, last := mean(losses[:10]), mean(losses[70:])
			t.Logf("mean loss of the first 10 steps %.4g, of the last 10 %.4g", first, last)
			if !(last < 0.7*first) {
				t.Errorf("loss did not fall: %v", losses)
			}
			plan, err := MemoryOf(toy, testB, testT, 1, backend.F32, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if hw := tr.be.MemStats().HighWater; plan.DeviceTotal() < hw || float64(plan.DeviceTotal()) > 1.1*float64(hw) {
				t.Errorf("predicted device peak %d, arena high-water mark %d (%s)", plan.DeviceTotal(), hw, plan)
			}
		})
	}
}

// TestToySharedInput: the toy's two matrices read one input, so lsp mode
// keeps one P and one A for them, and each S is P^T G Q_k of the matrix's
// own dense gradient G.
func TestToySharedInput(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.NoFit = true
	tr := newToy(t, cfg)
	st := tr.e.lsp
	for l := range toy.L {
		if len(st.Inputs[l]) != 1 || st.Mats[l][0].In != st.Inputs[l][0] || st.Mats[l][1].In != st.Inputs[l][0] {
			t.Fatalf("block %d: %d inputs; matrices read %p and %p", l, len(st.Inputs[l]), st.Mats[l][0].In, st.Mats[l][1].In)
		}
	}
	// The same weights without hooks give the dense gradients.
	be, s := tr.be, tr.be.DefaultStream()
	dense, err := toy.NewModel(be, testB, testT, backend.F32, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dense.Free()
	b := batches(5, 1)[0]
	scale := 1 / float32(b.NumTargets)
	for _, m := range []model.Model{tr.e.Model, dense} {
		bufs := m.Buffers()
		if err := be.CopyD2D(s, bufs.Params, tr.e.Model.Buffers().Params); err != nil {
			t.Fatal(err)
		}
		if err := backend.UploadInt32(be, s, bufs.Inputs, b.Inputs); err != nil {
			t.Fatal(err)
		}
		if err := backend.UploadInt32(be, s, bufs.Targets, b.Targets); err != nil {
			t.Fatal(err)
		}
		if err := m.ZeroGrads(s); err != nil {
			t.Fatal(err)
		}
		st.SetMicro(0)
		if err := model.ForwardBackward(m, s, toy.L, scale); err != nil {
			t.Fatal(err)
		}
	}
	grads, err := backend.Download(be, s, dense.Buffers().Grads)
	if err != nil {
		t.Fatal(err)
	}
	x, err := model.NewIndex(toy)
	if err != nil {
		t.Fatal(err)
	}
	for l := range toy.L {
		for k, xm := range st.Mats[l] {
			p := x.Layout[x.MatParam[l][k]]
			want := projectS(xm.In.P, xm.Q, grads[p.Offset:p.Offset+p.Len()])
			got, err := backend.Download(be, s, xm.S)
			if err != nil {
				t.Fatal(err)
			}
			var scale, worst float64
			for i := range want {
				scale = max(scale, math.Abs(want[i]))
				worst = max(worst, math.Abs(float64(got[i])-want[i]))
			}
			if !(scale > 0) || worst > 1e-4*scale {
				t.Errorf("%s: S differs from P^T G Q by %.3g (scale %.3g)", p.Name, worst, scale)
			}
		}
	}
}

// TestToySharedInputResumes: the fit of the shared P (FitShared) and the
// state of both matrices survive a save and a load bit for bit.
func TestToySharedInputResumes(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.CheckEvery = 2
	full := newToy(t, cfg)
	full.runFrom(t, 0, 5)
	a := newToy(t, cfg)
	a.runFrom(t, 0, 3)
	st, err := a.e.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	b := newToy(t, cfg)
	b.resume(t, a.params(t), st, 3, 5, full)
	// A copy of the shared P that disagrees is refused.
	bad := maps.Clone(st)
	name := "lsp.block.0.w2.p_val"
	bad[name] = append([]float32(nil), st[name]...)
	bad[name][0]++
	if err := b.e.LoadState(bad); err == nil {
		t.Error("a second, different copy of the shared P was accepted")
	}
}

// projectS is S = P^T G Q (d x d) in float64, from the projectors' row
// storage: row i of P and row j of Q each hold R entries, so G[i][j]
// adds G[i][j] P[i,a] Q[j,b] to S[a][b]. It is the test's own reference,
// written apart from the code under test.
func projectS(P, Q *lsp.Projector, G []float32) []float64 {
	d, n := P.D, Q.M
	S := make([]float64, d*d)
	for i := range P.M {
		for j := range n {
			g := float64(G[i*n+j])
			for u := range P.R {
				pa, pv := int(P.Idx[i*P.R+u]), float64(P.Val[i*P.R+u])
				for v := range Q.R {
					S[pa*d+int(Q.Idx[j*Q.R+v])] += g * pv * float64(Q.Val[j*Q.R+v])
				}
			}
		}
	}
	return S
}
