// The projector fit of a check on a GPU: the fit runs on the backend's ops
// (train/lsp's FitSamplesOn), so tracing it gives its ops, costed like the
// step's.

package plan

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// FitTime is the predicted time on m of the projector fits of one check
// of c (lsp mode with fitting; 0 otherwise): every fit traced on a
// tracing backend (lsp.FitGroup.Trace) for the whole --fit-iters budget
// (a fit that reaches alpha stops earlier: an upper bound), its ops run
// one after another on one stream, each costed by OpTime (the gradient
// uploads by the link).
// The calibration passes that form the gradients are not counted.
func FitTime(c Config, m Machine) (float64, error) {
	if c.Engine.Mode != engine.LSP || c.Engine.LSP.NoFit {
		return 0, nil
	}
	groups, err := lsp.FitGroups(c.Arch, c.B, c.Engine.LSP)
	if err != nil {
		return 0, err
	}
	lc := c.Engine.LSP
	var total float64
	for gi, g := range groups {
		tb := trace.New()
		if err := g.Trace(tb, tb.DefaultStream(), lc.FitIters, lc.ProjLR, lc.Ortho); err != nil {
			return 0, fmt.Errorf("plan: fit %d (%d x %d, n %v): %w", gi, g.M, g.D, g.Ns, err)
		}
		var secs float64
		for _, o := range tb.Recorded() {
			secs += m.OpTime(o)
		}
		total += float64(g.Count) * secs
	}
	return total, nil
}
