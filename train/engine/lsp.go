// lsp mode's place in the step's graph: per layer, from the last, the
// copy of its S down, the host subspace Adam, the copy of Delta up and
// the apply, each node's body a call into train/lsp's State, which holds
// the projectors, the hooks that compress, and the projector check.

package engine

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// initLSP allocates lsp mode's state, once the model (which calls its
// hooks) exists.
func (e *Engine) initLSP() error {
	env := lsp.Env{
		Backend: e.be, Stream: e.st.Compute, Model: e.Model, Index: e.idx,
		B: e.b, T: e.t, DType: e.dt, Seed: e.cfg.Seed, Hyper: e.cfg.Hyper,
		Workers: e.workers, SizeOnly: e.sizeOnly, SkipFlag: e.skipFlag,
		HostSkip: e.hostSkip, HostAccess: e.hostAccess, InFlight: e.lspInFlight(),
	}
	if err := e.lsp.Init(env, e.cfg.LSP); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// lspInFlight is which of lsp's per-block buffers the engine sizes for the
// blocks in flight: A when the model hands the inputs over in the
// backward's recompute.
func (e *Engine) lspInFlight() lsp.InFlight { return lspInFlight(e.cfg) }

func lspInFlight(cfg Config) lsp.InFlight {
	opts := model.Options{MatrixGrads: (*lsp.State)(nil), Recompute: cfg.Recompute}
	return lsp.InFlight{A: opts.HooksInRecompute()}
}

// addLSPDown adds, per layer from the last, the copy of its S and the
// host Adam on them; it returns the Adam nodes by layer.
func (e *Engine) addLSPDown(g *Graph, bwd []NodeID, lr float64) []NodeID {
	st := e.lsp
	adam := make([]NodeID, len(st.Mats))
	for l := len(st.Mats) - 1; l >= 0; l-- {
		done := bwd[l]
		if e.dp.onDevice() {
			// Summed on the device first: the copy down copies the sum.
			done = e.deviceSum(g, fmt.Sprintf("all-reduce S %d", l), spans(st.LayerS(l)), done)
		}
		d2h := g.Add(fmt.Sprintf("d2h S %d", l), D2H, func(s backend.Stream) error {
			return st.CopyDown(s, l)
		}, done)
		ready := d2h
		if e.dp != nil && !e.dp.onDevice() {
			// The layer's matrices are contiguous in the pinned buffer.
			h, off, n := st.HostS(l)
			name := fmt.Sprintf("all-reduce S %d", l)
			ready = e.dp.collective(g, name, n, func() error {
				return e.allReduceHost(name, h, off, n)
			}, d2h)
		}
		adam[l] = g.Add(fmt.Sprintf("host adam S %d", l), Host, func(backend.Stream) error {
			return st.HostAdam(l, e.step, lr)
		}, ready)
		elems, tensors, bytes := st.AdamWork(l)
		g.Nodes[adam[l]].Work = HostWork{Elems: elems, Tensors: tensors, Bytes: bytes}
	}
	return adam
}

// addLSPUp adds, per layer from the last, the copy of its Deltas and the
// apply.
func (e *Engine) addLSPUp(g *Graph, adam []NodeID, lr float64) {
	st := e.lsp
	for l := len(st.Mats) - 1; l >= 0; l-- {
		h2d := g.Add(fmt.Sprintf("h2d Delta %d", l), H2D, func(s backend.Stream) error {
			return st.CopyUp(s, l)
		}, adam[l])
		g.Add(fmt.Sprintf("apply %d", l), Compute, func(s backend.Stream) error {
			return st.Apply(s, l, e.step, lr)
		}, h2d)
	}
}

// CheckDue reports whether the projectors are checked before the next step.
// A step skipped for a non-finite loss does not advance the step count, so
// the attempt after it would be due again; one check per step count is
// enough (and a second would refit the projectors once more).
func (e *Engine) CheckDue() bool {
	if e.lsp == nil || !e.lsp.Checks() || e.checked == e.step {
		return false
	}
	if e.step == 0 {
		return !e.cfg.LSP.StartRandom
	}
	return e.step%e.cfg.LSP.CheckEvery == 0
}

// CalibBatches is the number of micro-batches Check wants
// (lsp.Config.CalibBatches).
func (e *Engine) CalibBatches() int {
	if e.lsp == nil {
		return (e.cfg.LSP.CalibSamples + e.b - 1) / e.b
	}
	return e.lsp.Config.CalibBatches(e.b)
}

// Check runs the projector check (lsp.State.Check) on the calibration
// micro-batches and returns one report per matrix. The pipeline must be
// drained (it is between steps). Gradients left in Grads are cleared by
// the next step.
func (e *Engine) Check(batches []data.Batch) ([]lsp.CheckReport, error) {
	if e.lsp == nil || !e.lsp.Checks() {
		return nil, fmt.Errorf("engine: no projector check in mode %s", e.cfg.Mode)
	}
	e.checked = e.step
	return e.lsp.Check(batches, e.step)
}
