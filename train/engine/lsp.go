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
		HostSkip: e.hostSkip, HostAccess: e.hostAccess, InFlight: lspInFlight(e.cfg, e.accum),
	}
	if err := e.lsp.Init(env, e.cfg.LSP); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// lspSlots is the number of device slots lsp's per-block S (and, under
// --recompute layer with ring residency, projectors) take when they are
// not held for every block: a block's slot is taken again by the backward
// two blocks below, so its S has the next block's whole backward to go
// down, through the host Adam and back up as Delta before the apply,
// which the compute stream then waits for (docs/DESIGN.md, "The
// schedule"). Two would leave that chain no slack beyond one block.
const lspSlots = 3

// lspInFlight is which of lsp's per-block buffers the engine sizes for
// the blocks in flight (lsp.InFlight): A when the model hands the inputs
// over in the backward's recompute; S always with one micro-batch per
// step (one S per block goes down once either way); and with ring
// residency (lsp's auto) the projectors (with A; they go up for every
// micro-batch's backward) and, with several micro-batches, each
// micro-batch's S, summed on the host (one rank only: the ranks sum a
// step's S once).
func lspInFlight(cfg Config, accum int) lsp.InFlight {
	opts := model.Options{MatrixGrads: (*lsp.State)(nil), Recompute: cfg.Recompute}
	fl := lsp.InFlight{A: opts.HooksInRecompute()}
	ring, slots := cfg.GradResidency == ResidencyRing, lspSlots
	if cfg.slots > 0 {
		slots = cfg.slots
	}
	switch {
	case accum == 1:
		fl.Slots = slots
	case ring && (cfg.Comm == nil || cfg.Comm.Size() == 1):
		fl.Slots, fl.HostSum = slots, true
	}
	if ring && fl.A && fl.Slots > 0 {
		fl.ProjectorSlots = fl.Slots + 1 // see lsp.InFlight
		if cfg.slots > 0 {
			fl.ProjectorSlots = cfg.slots
		}
	}
	return fl
}

// addLSPDown adds, per layer from the last, the copy of its S and the
// host Adam on them, after the last micro-batch's backwards bwd (every
// block's S held on the device); it returns the Adam nodes by layer.
func (e *Engine) addLSPDown(g *Graph, bwd []NodeID, lr float64) []NodeID {
	adam := make([]NodeID, len(e.lsp.Mats))
	for l := len(adam) - 1; l >= 0; l-- {
		adam[l] = e.addLSPLayerDown(g, l, lr, bwd[l])
	}
	return adam
}

// addLSPUp adds, per layer from the last, the copy of its Deltas and the
// apply.
func (e *Engine) addLSPUp(g *Graph, adam []NodeID, lr float64) {
	for l := len(adam) - 1; l >= 0; l-- {
		e.addLSPLayerUp(g, l, lr, adam[l])
	}
}

// addLSPLayerDown adds layer l's S copy down after deps (with several
// ranks summed over them, on the device first or on the host after) and
// the host Adam on it; it returns the Adam node.
func (e *Engine) addLSPLayerDown(g *Graph, l int, lr float64, deps ...NodeID) NodeID {
	st := e.lsp
	if e.dp.onDevice() {
		// Summed on the device first: the copy down copies the sum.
		deps = []NodeID{e.deviceSum(g, fmt.Sprintf("all-reduce S %d", l), spans(st.LayerS(l)), deps...)}
	}
	d2h := g.Add(fmt.Sprintf("d2h S %d", l), D2H, func(s backend.Stream) error {
		return st.CopyDown(s, l)
	}, deps...)
	ready := d2h
	if e.dp != nil && !e.dp.onDevice() {
		// The layer's matrices are contiguous in the pinned buffer.
		h, off, n := st.HostS(l)
		name := fmt.Sprintf("all-reduce S %d", l)
		ready = e.dp.collective(g, name, n, func() error {
			return e.allReduceHost(name, h, off, n)
		}, d2h)
	}
	adam := g.Add(fmt.Sprintf("host adam S %d", l), Host, func(backend.Stream) error {
		return st.HostAdam(l, e.step, lr)
	}, ready)
	elems, tensors, bytes := st.AdamWork(l)
	g.Nodes[adam].Work = HostWork{Elems: elems, Tensors: tensors, Bytes: bytes}
	return adam
}

// addLSPLayerUp adds layer l's Delta copy up after adam and the apply; it
// returns the apply node.
func (e *Engine) addLSPLayerUp(g *Graph, l int, lr float64, adam NodeID) NodeID {
	st := e.lsp
	h2d := g.Add(fmt.Sprintf("h2d Delta %d", l), H2D, func(s backend.Stream) error {
		return st.CopyUp(s, l)
	}, adam)
	return g.Add(fmt.Sprintf("apply %d", l), Compute, func(s backend.Stream) error {
		return st.Apply(s, l, e.step, lr)
	}, h2d)
}

// none marks a slot no node has used yet in a step's graph.
const none NodeID = -1

// lspSlots schedules lsp's blocks through the device slots of
// lsp.InFlight (docs/DESIGN.md, "The schedule"): the backward of block l
// of micro-batch i takes slot l % Slots, so it comes after whatever
// released that slot last: the copy down of an earlier micro-batch's S
// (summed on the host), or the apply of a block of the last micro-batch,
// which the compute stream runs in list order. That is why each block's
// apply enters the compute stream's list right after the backward two
// blocks below it, instead of after every backward. With projectors in
// the slots, each backward also waits for its block's upload, which waits
// for the slot's previous reader.
type lspSlotSched struct {
	e            *Engine
	g            *Graph
	lr           float64
	fl           lsp.InFlight
	last         int      // the last micro-batch
	sFree, pFree []NodeID // by slot: the node after which S / the projectors may be overwritten
	sums         []NodeID // by layer: its latest host sum of S (none)
	adam         []NodeID // by layer: its host Adam in the last micro-batch
	next         int      // the highest layer whose apply is not in the list yet
}

func (e *Engine) newLSPSlotSched(g *Graph, lr float64) *lspSlotSched {
	fl := lspInFlight(e.cfg, e.accum)
	if fl.Slots == 0 {
		return nil
	}
	L := len(e.lsp.Mats)
	r := &lspSlotSched{e: e, g: g, lr: lr, fl: fl, last: e.accum - 1,
		sFree: make([]NodeID, fl.Slots), pFree: make([]NodeID, fl.ProjectorSlots),
		sums: make([]NodeID, L), adam: make([]NodeID, L), next: L - 1}
	for _, xs := range [][]NodeID{r.sFree, r.pFree, r.sums} {
		for i := range xs {
			xs[i] = none
		}
	}
	return r
}

// before adds block l's projector upload for micro-batch i, if any, and
// returns what its backward waits for on other queues.
func (r *lspSlotSched) before(i, l int) []NodeID {
	slot := l % r.fl.Slots
	var deps []NodeID
	if r.e.lsp.ProjectorsInSlots() {
		var after []NodeID
		if f := r.pFree[l%r.fl.ProjectorSlots]; f != none {
			after = append(after, f)
		}
		deps = append(deps, r.g.Add(fmt.Sprintf("h2d projectors %d.%d", i, l), H2D, func(s backend.Stream) error {
			return r.e.lsp.UploadProjectors(s, l)
		}, after...))
	}
	if f := r.sFree[slot]; f != none && r.g.Nodes[f].Queue != Compute {
		deps = append(deps, f)
	}
	return deps
}

// after adds what follows block l's backward bwd in micro-batch i: its S
// down and summed on the host (an earlier micro-batch), or down, through
// the host Adam, with the applies whose slots the next backward takes
// (the last).
func (r *lspSlotSched) after(i, l int, bwd NodeID) {
	e, g, slot := r.e, r.g, l%r.fl.Slots
	var deps []NodeID
	if r.sums[l] != none {
		deps = append(deps, r.sums[l]) // the sum has read the pinned S the copy overwrites
	}
	if i < r.last {
		d2h := g.Add(fmt.Sprintf("d2h S %d.%d", i, l), D2H, func(s backend.Stream) error {
			return e.lsp.CopyDown(s, l)
		}, append(deps, bwd)...)
		r.sums[l] = g.Add(fmt.Sprintf("host sum S %d.%d", i, l), Host, func(backend.Stream) error {
			return e.lsp.SumS(l, i)
		}, d2h)
		elems, bytes := e.lsp.SumWork(l)
		g.Nodes[r.sums[l]].Work = HostWork{Elems: elems, Tensors: int64(len(e.lsp.Mats[l])), Bytes: bytes}
		r.sFree[slot] = d2h
		r.releaseProjectors(l, bwd)
		return
	}
	r.adam[l] = e.addLSPLayerDown(g, l, r.lr, append(deps, bwd)...)
	// The backward of block l-1 takes the slot of block l-1+Slots.
	for r.next >= l-1+r.fl.Slots {
		r.up(r.next)
	}
}

// up adds layer l's Delta up and apply, which release its slot.
func (r *lspSlotSched) up(l int) {
	apply := r.e.addLSPLayerUp(r.g, l, r.lr, r.adam[l])
	r.sFree[l%r.fl.Slots] = apply
	r.releaseProjectors(l, apply)
	r.next = l - 1
}

// releaseProjectors records that block l's projector slot, if any, may
// be overwritten after node n.
func (r *lspSlotSched) releaseProjectors(l int, n NodeID) {
	if r.fl.ProjectorSlots > 0 {
		r.pFree[l%r.fl.ProjectorSlots] = n
	}
}

// finish adds the applies not in the list yet.
func (r *lspSlotSched) finish() {
	for r.next >= 0 {
		r.up(r.next)
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
