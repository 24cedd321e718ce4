package gpt2

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// The PyTorch fixture: a tiny random GPT2LMHeadModel written by
// transformers' save_pretrained, with its logits, loss, every gradient and
// a 10-step AdamW trajectory (scripts/fixtures/gpt2_tiny.py).
const fixtureDir = "../testdata/gpt2-tiny"

// Tolerances, fp32 throughout: |got - want| <= atol + rtol*|want|, with atol
// scaled by the largest magnitude of the tensor so that near-zero entries of
// a large tensor do not demand more than fp32 can give.
const (
	logitRTol = 1e-5
	gradRTol  = 1e-4 // gradients sum many more products; 1e-4 of the tensor's scale
	lossRTol  = 1e-5
)

type fixture struct {
	cfg          Config
	params       []float32
	inputs       []int32
	targets      []int32
	logits       []float32
	loss         float64
	grads        map[string][]float32
	finals       map[string][]float32
	adamLosses   []float32
	validTargets int
}

func loadFixture(t *testing.T) *fixture {
	t.Helper()
	cfg, params, err := LoadHF(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := safetensors.Open(fixtureDir + "/reference.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{cfg: cfg, params: params, grads: map[string][]float32{}, finals: map[string][]float32{}}
	ints := func(name string) []int32 {
		v, _, err := ref.Int64(name)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int32, len(v))
		for i, x := range v {
			out[i] = int32(x)
			if x == -100 { // PyTorch's ignore_index; ours is any negative
				out[i] = -1
			}
		}
		return out
	}
	floats := func(name string) []float32 {
		v, _, err := ref.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	fx.inputs, fx.targets = ints("input_ids"), ints("targets")
	fx.logits = floats("logits")
	fx.loss = float64(floats("loss")[0])
	fx.adamLosses = floats("adamw_losses")
	for _, p := range cfg.Layout() {
		fx.grads[p.Name] = floats("grad." + p.Name)
		if _, ok := ref.Info("final." + p.Name); ok {
			fx.finals[p.Name] = floats("final." + p.Name)
		}
	}
	for _, x := range fx.targets {
		if x >= 0 {
			fx.validTargets++
		}
	}
	return fx
}

// closeTo compares got with want elementwise and reports the worst entry.
func closeTo(t *testing.T, what string, got, want []float32, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	worst, at := 0.0, 0
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if r := d / (rtol * (scale + math.Abs(float64(want[i])))); r > worst {
			worst, at = r, i
		}
	}
	if worst > 1 {
		t.Errorf("%s: worst index %d: got %.8g, want %.8g (tolerance %.1e relative to the tensor scale %.3g)",
			what, at, got[at], want[at], rtol, scale)
	}
}

func fixtureModel(t *testing.T, be backend.Backend, fx *fixture) *Model {
	t.Helper()
	m, err := New(be, fx.cfg, 3, 32, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	s := be.DefaultStream()
	if err := backend.Upload(be, s, m.Params, fx.params); err != nil {
		t.Fatal(err)
	}
	if err := backend.UploadInt32(be, s, m.Inputs, fx.inputs); err != nil {
		t.Fatal(err)
	}
	if err := backend.UploadInt32(be, s, m.Targets, fx.targets); err != nil {
		t.Fatal(err)
	}
	return m
}

func lossOf(t *testing.T, be backend.Backend, m *Model, n int) float64 {
	t.Helper()
	l, err := backend.Download(be, be.DefaultStream(), m.Losses)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, v := range l {
		sum += float64(v)
	}
	return sum / float64(n)
}

// TestMatchesPyTorch checks logits, loss and every gradient.
func TestMatchesPyTorch(t *testing.T) {
	fx := loadFixture(t)
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	m := fixtureModel(t, be, fx)
	if err := m.ZeroGrads(s); err != nil {
		t.Fatal(err)
	}
	if err := m.Forward(s); err != nil {
		t.Fatal(err)
	}
	logits, err := backend.Download(be, s, m.Logits)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "logits", logits, fx.logits, logitRTol)
	if err := m.CrossEntropy(s, 1/float32(fx.validTargets)); err != nil {
		t.Fatal(err)
	}
	loss := lossOf(t, be, m, fx.validTargets)
	if math.Abs(loss-fx.loss) > lossRTol*fx.loss {
		t.Errorf("loss %.8g, PyTorch %.8g", loss, fx.loss)
	}
	if err := m.Backward(s); err != nil {
		t.Fatal(err)
	}
	grads, err := backend.Download(be, s, m.Grads)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Layout() {
		closeTo(t, "grad "+p.Name, grads[p.Offset:p.Offset+p.Len()], fx.grads[p.Name], gradRTol)
	}
}

// TestAdamWTrajectoryMatchesPyTorch runs the fixture's 10 AdamW steps (same
// batch every step, lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
// on matrices and embeddings only, no clipping) and compares each loss and
// the final weights.
func TestAdamWTrajectoryMatchesPyTorch(t *testing.T) {
	fx := loadFixture(t)
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	m := fixtureModel(t, be, fx)
	var ts []optim.Tensor
	for i, p := range m.Layout() {
		g, _ := m.GradView(i)
		ts = append(ts, optim.Tensor{Name: p.Name, Param: m.ParamView(m.Params, i), Grad: g, Decay: len(p.Shape) >= 2})
		if p.Decay != (len(p.Shape) >= 2) {
			t.Errorf("%s: layout decay %v differs from the fixture's dim >= 2 rule", p.Name, p.Decay)
		}
	}
	h := optim.Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: optim.ClipNone}
	opt, err := optim.New(be, h, ts, m.Grads)
	if err != nil {
		t.Fatal(err)
	}
	for step, want := range fx.adamLosses {
		err := model.Chain(
			func() error { return m.ZeroGrads(s) },
			func() error { return m.Forward(s) },
			func() error { return m.CrossEntropy(s, 1/float32(fx.validTargets)) },
			func() error { return m.Backward(s) },
		)
		if err != nil {
			t.Fatal(err)
		}
		got := lossOf(t, be, m, fx.validTargets)
		// Errors compound over steps; 1e-5 relative holds through step 10.
		if math.Abs(got-float64(want)) > lossRTol*float64(want) {
			t.Errorf("step %d: loss %.8g, PyTorch %.8g", step, got, want)
		}
		if err := opt.Step(s, 1e-3, backend.Tensor{}); err != nil {
			t.Fatal(err)
		}
	}
	final, err := backend.Download(be, s, m.Params)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Layout() {
		want, ok := fx.finals[p.Name]
		if !ok {
			continue
		}
		got := final[p.Offset : p.Offset+p.Len()]
		if strings.HasSuffix(p.Name, "c_attn.bias") {
			// The key bias adds q.b_k to every score of a softmax row, which
			// the softmax cancels: its true gradient is 0 and both sides hold
			// only rounding noise, which Adam's m/sqrt(v) scales up to steps
			// of size lr. Compare q and v biases; check k moved by at most
			// 10 steps of lr in either implementation.
			C := m.Cfg.C
			for i := C; i < 2*C; i++ {
				if d := math.Abs(float64(got[i] - want[i])); d > 2*10*1e-3 {
					t.Errorf("final %s key bias %d: %g vs %g", p.Name, i-C, got[i], want[i])
				}
			}
			closeTo(t, "final q bias "+p.Name, got[:C], want[:C], 1e-4)
			closeTo(t, "final v bias "+p.Name, got[2*C:], want[2*C:], 1e-4)
			continue
		}
		closeTo(t, fmt.Sprintf("final %s", p.Name), got, want, 1e-4)
	}
}
