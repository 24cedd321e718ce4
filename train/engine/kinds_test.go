package engine

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// kindConfigs are the dense projector kinds under the engine's
// properties: svd through the blocks' device slots (projectors uploaded
// into them under --recompute layer, S summed on the host), with a
// check before step 1 and every 5 steps; gaussian with everything on
// the device, no checks.
func kindConfigs() []modeCase {
	svd, gauss := testConfig(LSP), testConfig(LSP)
	svd.LSP.Projector = lsp.KindSVD
	svd.DenseParams = DenseHost
	svd.Recompute, svd.GradResidency, svd.slots = model.RecomputeLayer, ResidencyRing, 1
	gauss.LSP.Projector, gauss.LSP.NoFit = lsp.KindGaussian, true
	return []modeCase{{"lsp-svd", svd, backend.BF16}, {"lsp-gauss", gauss, backend.BF16}}
}

// TestGaussianMatchesSparse: gaussian projectors are the sparse ones
// with r = d (the same draw: NewProjector(m, d, d)), so the dense ops
// (DenseGemm, DenseApply) train as the sparse ones do, to fp32 rounding
// (the sums run in another order): losses and fp32 weights over a few
// steps.
func TestGaussianMatchesSparse(t *testing.T) {
	sparse := testConfig(LSP)
	sparse.LSP.R, sparse.LSP.NoFit = sparse.LSP.D, true
	gauss := sparse
	gauss.LSP.Projector = lsp.KindGaussian
	a := newDeviceTrainer(t, sparse, backend.F32, 2, false, 0)
	b := newDeviceTrainer(t, gauss, backend.F32, 2, false, 0)
	for x, row := range a.e.lsp.Inputs {
		for i, in := range row {
			if got := b.e.lsp.Inputs[x][i].P; !in.P.Equal(got) {
				t.Fatalf("layer %d input %d: gaussian P differs from sparse r = d's", x, i)
			}
		}
	}
	la, lb := a.run(t, 4), b.run(t, 4)
	for i := range la {
		if math.Abs(la[i]-lb[i]) > 1e-5*math.Abs(la[i]) {
			t.Errorf("step %d: loss %v (gaussian) against %v (sparse r = d)", i+1, lb[i], la[i])
		}
	}
	pa, pb := a.params(t), b.params(t)
	var worst, scale float64
	for i := range pa {
		worst = max(worst, math.Abs(float64(pa[i]-pb[i])))
		scale = max(scale, math.Abs(float64(pa[i])))
	}
	if worst > 1e-5*scale {
		t.Errorf("weights differ by %.3g (largest %.3g), want within fp32 rounding", worst, scale)
	}
	if la[len(la)-1] == la[0] {
		t.Errorf("losses %v: no training", la)
	}
}
