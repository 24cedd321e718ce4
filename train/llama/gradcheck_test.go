package llama

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// TestGradientsMatchFiniteDifferences checks the analytic gradient of
// entries of every kind of parameter against central differences of the
// loss, in a shape the fixtures do not cover: NH*HS (32) different from
// the hidden size (24), grouped-query heads, llama3 RoPE.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	m := hookModel(t, be, hookCfg, backend.F32, model.Options{})
	modeltest.SetBatch(t, be, m, hookCfg.Vocab, 3)
	n := 0
	for i := range m.B * m.T {
		if i%5 != 0 {
			n++
		}
	}
	loss := func() float64 {
		t.Helper()
		must(t, m.Forward(s))
		must(t, m.CrossEntropy(s, 0))
		return modeltest.MeanLoss(t, be, m, n)
	}
	must(t, m.ZeroGrads(s))
	must(t, m.Forward(s))
	must(t, m.CrossEntropy(s, 1/float32(n)))
	must(t, m.Backward(s))
	grads := modeltest.Download(t, be, m.Grads)
	params := modeltest.Download(t, be, m.Params)
	rng := rand.New(rand.NewPCG(3, 4))
	const h = 1e-2
	for _, p := range m.Layout() {
		for range 3 {
			i := p.Offset + rng.IntN(p.Len())
			at := func(d float32) float64 {
				v := append([]float32(nil), params...)
				v[i] += d
				must(t, backend.Upload(be, s, m.Params, v))
				return loss()
			}
			fd := (at(h) - at(-h)) / (2 * h)
			if g := float64(grads[i]); math.Abs(g-fd) > 2e-4+0.02*math.Abs(fd) {
				t.Errorf("%s[%d]: gradient %.6g, finite difference %.6g", p.Name, i-p.Offset, g, fd)
			}
		}
	}
	must(t, backend.Upload(be, s, m.Params, params))
	if t.Failed() {
		t.Logf("config %+v", hookCfg)
	}
}
