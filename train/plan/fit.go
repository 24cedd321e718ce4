// The projector fit of a check on a GPU: the fit runs on the backend's ops
// (train/devfit), so tracing it gives its ops, costed like the step's.

package plan

import (
	"fmt"
	"math/rand/v2"

	"github.com/lsp-offload/lsp-offload/train/devfit"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// FitTime is the predicted time on m of the projector fits of one check
// of c (lsp mode with fitting; 0 otherwise): every fit traced on a
// tracing backend (devfit.TraceFit) for the whole --fit-iters budget (a
// fit that reaches alpha stops earlier: an upper bound), its ops run one
// after another on one stream, each costed by OpTime (the gradient
// uploads by the link).
// The calibration passes that form the gradients are not counted.
func FitTime(c Config, m Machine) (float64, error) {
	if c.Engine.Mode != engine.LSP || c.Engine.LSP.NoFit {
		return 0, nil
	}
	groups, err := engine.FitGroups(c.Arch, c.B, c.Engine.LSP)
	if err != nil {
		return 0, err
	}
	lc := c.Engine.LSP
	iters := lc.FitIters
	var total float64
	for gi, g := range groups {
		secs, err := fitTime(g, iters, lc.ProjLR, lc.Ortho, m)
		if err != nil {
			return 0, fmt.Errorf("plan: fit %d (%d x %d, n %v): %w", gi, g.M, g.D, g.Ns, err)
		}
		total += float64(g.Count) * secs
	}
	return total, nil
}

// fitTime traces one fit of g's shapes for iters Adam steps and costs it.
func fitTime(g engine.FitGroup, iters int, lr, ortho float64, m Machine) (float64, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	P, err := lsp.NewProjector(g.M, g.D, g.R, rng)
	if err != nil {
		return 0, err
	}
	Qs := make([]*lsp.Projector, len(g.Ns))
	for k, n := range g.Ns {
		if Qs[k], err = lsp.NewProjector(n, g.D, g.R, rng); err != nil {
			return 0, err
		}
	}
	if lr <= 0 {
		lr = 0.05
	}
	tb := trace.New()
	opts := lsp.FitOptions{LR: lr, MaxIters: iters, Ortho: ortho}
	if err := devfit.TraceFit(tb, tb.DefaultStream(), P, Qs, g.Samples, iters, opts); err != nil {
		return 0, err
	}
	var secs float64
	for _, o := range tb.Recorded() {
		secs += m.OpTime(o)
	}
	return secs, nil
}
