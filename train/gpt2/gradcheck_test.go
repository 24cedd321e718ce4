package gpt2

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// testModel builds a small random model with a random batch, some targets
// ignored.
func testModel(t *testing.T, be backend.Backend) *Model {
	t.Helper()
	cfg := Config{V: 37, MaxT: 12, C: 16, L: 2, NH: 2, Eps: 1e-5}
	m, err := New(be, cfg, 2, 9, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	s := be.DefaultStream()
	vals := Init(cfg, 7)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range cfg.Layout() { // non-trivial norms and biases
		if len(p.Shape) == 1 {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				vals[i] += float32(rng.NormFloat64() * 0.1)
			}
		}
	}
	if err := backend.Upload(be, s, m.Params, vals); err != nil {
		t.Fatal(err)
	}
	inp := make([]int32, m.B*m.T)
	tgt := make([]int32, m.B*m.T)
	for i := range inp {
		inp[i] = int32(rng.IntN(cfg.V))
		tgt[i] = int32(rng.IntN(cfg.V))
		if i%5 == 0 {
			tgt[i] = -1
		}
	}
	if err := backend.UploadInt32(be, s, m.Inputs, inp); err != nil {
		t.Fatal(err)
	}
	if err := backend.UploadInt32(be, s, m.Targets, tgt); err != nil {
		t.Fatal(err)
	}
	return m
}

func countTargets(t *testing.T, be backend.Backend, m *Model) int {
	// Targets are what testModel uploaded: every fifth is ignored.
	n := 0
	for i := 0; i < m.B*m.T; i++ {
		if i%5 != 0 {
			n++
		}
	}
	return n
}

// meanLoss runs the forward pass and returns the mean loss in float64.
func meanLoss(t *testing.T, be backend.Backend, m *Model, n int) float64 {
	t.Helper()
	s := be.DefaultStream()
	if err := m.Forward(s); err != nil {
		t.Fatal(err)
	}
	if err := m.CrossEntropy(s, 0); err != nil {
		t.Fatal(err)
	}
	return modeltest.MeanLoss(t, be, m, n)
}

// TestFiniteDifference compares the backward pass with central differences
// of the loss on a few entries of every kind of parameter.
func TestFiniteDifference(t *testing.T) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	m := testModel(t, be)
	n := countTargets(t, be, m)
	if err := m.ZeroGrads(s); err != nil {
		t.Fatal(err)
	}
	if err := m.Forward(s); err != nil {
		t.Fatal(err)
	}
	if err := m.CrossEntropy(s, 1/float32(n)); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(s); err != nil {
		t.Fatal(err)
	}
	grads, err := backend.Download(be, s, m.Grads)
	if err != nil {
		t.Fatal(err)
	}
	params, err := backend.Download(be, s, m.Params)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	const h = 1e-2
	for _, p := range m.Layout() {
		for k := 0; k < 2; k++ {
			i := p.Offset + rng.IntN(p.Len())
			orig := params[i]
			eval := func(x float32) float64 {
				params[i] = x
				if err := backend.Upload(be, s, m.Params, params); err != nil {
					t.Fatal(err)
				}
				return meanLoss(t, be, m, n)
			}
			fd := (eval(orig+h) - eval(orig-h)) / (2 * h)
			params[i] = orig
			g := float64(grads[i])
			if math.Abs(fd-g) > 2e-3+2e-2*math.Abs(g) {
				t.Errorf("%s[%d]: backward %.6g, finite difference %.6g", p.Name, i-p.Offset, g, fd)
			}
		}
	}
	if err := backend.Upload(be, s, m.Params, params); err != nil {
		t.Fatal(err)
	}
}
