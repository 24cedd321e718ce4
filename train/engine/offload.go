// ZeRO-Offload style updates on the host: the gradients of a group of
// parameters (one block, or the parameters outside the blocks: embeddings,
// final norm, head) go down as soon as the group's backward is done, CPU
// Adam updates fp32 master weights with fp32 moments on the worker pool,
// and the new weights come back in the model dtype. Used by --mode zero for
// every parameter and by --mode lsp --dense-params host for the parameters
// that are not block matrices.
//
// Host memory: pinned gradients (--grad-dtype) and weights (model dtype) of
// every offloaded parameter; master weights (bf16 models; an fp32 model's
// pinned weights are the master) and moments in Go memory.

package engine

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// hostTensor is one parameter updated on the host.
type hostTensor struct {
	name        string
	idx         int            // the parameter's Layout index
	param, grad backend.Tensor // device views
	off, n      int            // elements, into the host arrays
	// acc is the tensor's place in the gradient ring's fp32 accumulator
	// (ring.go), in elements; -1: the host Adam reads the pinned
	// gradient.
	acc   int
	decay bool
	state *host.AdamState
}

// hostGroup is the unit of one d2h -> Adam -> h2d chain.
type hostGroup struct {
	name    string
	layer   int // -1: outside the blocks, complete after the embeddings' backward
	tensors []hostTensor
	normSq  float64 // of the latest step, written by the group's host node
	// skipped: the step's loss was not finite, so the host node left the
	// master and moments alone and the weight copy up is not made
	// (written by the host node, read by the launcher after it).
	skipped bool
}

type offload struct {
	e      *Engine
	groups []hostGroup
	n      int                // offloaded elements
	gsize  int                // bytes per gradient element
	grads  backend.HostBuffer // [n], the gradient dtype
	out    backend.HostBuffer // model dtype [n]
	master []float32          // bf16 models only
	mom    []float32          // M then V
	// shard: zero mode with several ranks, the host optimizer sharded
	// among them (shard.go); master and mom are then nil.
	shard *hostShard
}

// groupSpec lists, per group, the layout indices of its parameters.
type groupSpec struct {
	name   string
	layer  int
	params []int
}

// groupsAll is every parameter: one group per block from the last, then
// the parameters outside the blocks.
func groupsAll(x *model.Index) []groupSpec { return groupsOf(x, func(int) bool { return true }) }

// groupsDense is every parameter but the block matrices.
func groupsDense(x *model.Index) []groupSpec {
	return groupsOf(x, func(i int) bool { return !x.IsMat[i] })
}

func groupsOf(x *model.Index, keep func(int) bool) []groupSpec {
	var gs []groupSpec
	for l := len(x.Blocks) - 1; l >= 0; l-- {
		gsp := groupSpec{name: fmt.Sprintf("layer %d", l), layer: l}
		for _, i := range x.Blocks[l] {
			if keep(i) {
				gsp.params = append(gsp.params, i)
			}
		}
		gs = append(gs, gsp)
	}
	out := groupSpec{name: "embeddings and head", layer: -1}
	for _, i := range x.Outside {
		if keep(i) {
			out.params = append(out.params, i)
		}
	}
	return append(gs, out)
}

// offloadBytes is the host memory of offloading the given parameters.
func offloadBytes(n int64, dt, gdt backend.DType) int64 {
	b := n*int64(gdt.Size()) + n*int64(dt.Size()) + 2*n*4 // pinned grads and weights, moments
	if dt != backend.F32 {
		b += n * 4 // master
	}
	return b
}

func newOffload(e *Engine, specs []groupSpec) (*offload, error) {
	m := e.Model
	params := m.Buffers().Params
	o := &offload{e: e}
	for _, sp := range specs {
		g := hostGroup{name: sp.name, layer: sp.layer}
		for _, i := range sp.params {
			p := e.idx.Layout[i]
			gv, ok := m.GradView(i)
			if !ok {
				return nil, fmt.Errorf("engine: %s has no gradient to offload", p.Name)
			}
			g.tensors = append(g.tensors, hostTensor{name: p.Name, idx: i, param: m.ParamView(params, i), grad: gv,
				off: o.n, n: p.Len(), acc: -1, decay: p.Decay})
			o.n += p.Len()
		}
		o.groups = append(o.groups, g)
	}
	var err error
	o.gsize = e.cfg.GradDType.Size()
	if o.grads, err = e.be.AllocHost("offload grads", o.n*o.gsize); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if o.out, err = e.be.AllocHost("offload weights", o.n*e.dt.Size()); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if e.cfg.sharded() {
		o.shard = newHostShard(o, e.cfg.Comm, !e.sizeOnly)
		for gi := range o.groups {
			for ti := range o.groups[gi].tensors {
				o.groups[gi].tensors[ti].state = &host.AdamState{} // the step count; the moments are the shard's
			}
		}
		return o, nil
	}
	if e.sizeOnly {
		return o, nil // traced: the host nodes never run, so no Go copies
	}
	if e.dt != backend.F32 {
		o.master = make([]float32, o.n)
	}
	o.mom = make([]float32, 2*o.n)
	for gi := range o.groups {
		for ti := range o.groups[gi].tensors {
			t := &o.groups[gi].tensors[ti]
			t.state = &host.AdamState{M: o.mom[t.off : t.off+t.n], V: o.mom[o.n+t.off : o.n+t.off+t.n]}
		}
	}
	return o, nil
}

func (o *offload) free() {
	for _, h := range []backend.HostBuffer{o.grads, o.out} {
		if h != nil {
			o.e.be.FreeHost(h)
		}
	}
}

// weights is the fp32 master: the Go copy of a bf16 model's, or an fp32
// model's pinned weights.
func (o *offload) weights() []float32 {
	if o.master != nil {
		return o.master
	}
	return o.out.Float32()[:o.n]
}

func (o *offload) outBF16() []uint16 { return o.out.BF16()[:o.n] }

// grad is a tensor's gradient: in the pinned buffer, or the ring's fp32
// accumulator when the step accumulated it there.
func (o *offload) grad(t hostTensor) host.AdamGrad {
	if t.acc >= 0 {
		return host.AdamGrad{F32: o.e.ring.acc.Float32()[t.acc : t.acc+t.n]}
	}
	if o.gsize == 2 {
		return host.AdamGrad{BF16: o.grads.BF16()[t.off : t.off+t.n]}
	}
	return host.AdamGrad{F32: o.grads.Float32()[t.off : t.off+t.n]}
}

// initMaster reads the device parameters into the host master weights.
func (o *offload) initMaster() error {
	o.e.hostAccess("offload init", nil, []backend.Range{hazard.HostRange(o.out, 0, len(o.out.Bytes()))})
	if o.shard != nil && o.shard.master != nil {
		return o.initShard()
	}
	w := o.weights()
	for _, g := range o.groups {
		for _, t := range g.tensors {
			vals, err := backend.Download(o.e.be, o.e.st.Compute, t.param)
			if err != nil {
				return fmt.Errorf("engine: reading %s: %w", t.name, err)
			}
			copy(w[t.off:t.off+t.n], vals)
		}
	}
	return nil
}

// addGradsCopy adds the copy of group gi's gradients to the pinned
// buffer, after the backward that completes them (block l's, or the
// embeddings' for the group outside the blocks).
func (o *offload) addGradsCopy(g *Graph, gi int, bwd []NodeID, bwdEmbed NodeID) NodeID {
	grp := &o.groups[gi]
	done := bwdEmbed
	if grp.layer >= 0 {
		done = bwd[grp.layer]
	}
	return g.Add("d2h grads "+grp.name, D2H, func(s backend.Stream) error {
		for _, t := range grp.tensors {
			if err := o.e.be.CopyD2H(s, o.grads, t.off*o.gsize, t.grad); err != nil {
				return err
			}
		}
		return nil
	}, done)
}

// addDown adds each group's gradient copy and host Adam; it returns the
// Adam node of every group.
func (o *offload) addDown(g *Graph, bwd []NodeID, bwdEmbed NodeID, lr float64) []NodeID {
	if o.shard != nil {
		return o.addDownSharded(g, bwd, bwdEmbed, lr)
	}
	e := o.e
	adam := make([]NodeID, len(o.groups))
	for gi := range o.groups {
		grp := &o.groups[gi]
		d2h := o.addGradsCopy(g, gi, bwd, bwdEmbed)
		ready := d2h
		if e.dp != nil && len(grp.tensors) > 0 {
			// The group's gradients are contiguous in grads (fp32: checkComm).
			first, last := grp.tensors[0], grp.tensors[len(grp.tensors)-1]
			name := "all-reduce grads " + grp.name
			n := last.off + last.n - first.off
			ready = e.dp.collective(g, name, n, func() error {
				return e.allReduceHost(name, o.grads, first.off*o.gsize, n)
			}, d2h)
		}
		adam[gi] = o.addAdam(g, gi, lr, ready)
	}
	return adam
}

// addAdam adds group gi's host Adam after ready, the nodes that complete
// its gradient on the host.
func (o *offload) addAdam(g *Graph, gi int, lr float64, ready ...NodeID) NodeID {
	grp := &o.groups[gi]
	id := g.Add("host adam "+grp.name, Host, func(backend.Stream) error {
		return o.adam(grp, lr)
	}, ready...)
	g.Nodes[id].Work = o.work(grp)
	return id
}

// work is the host Adam of one group: every element pre-scanned for its
// norm (the engine supplies none), master and moments read and written,
// and the model-dtype copy written when it is not the master.
func (o *offload) work(grp *hostGroup) HostWork {
	w := HostWork{Tensors: int64(len(grp.tensors))}
	for _, t := range grp.tensors {
		gsize := o.gsize
		if t.acc >= 0 {
			gsize = 4 // the ring's fp32 accumulator
		}
		w.Elems += int64(t.n)
		w.Bytes += int64(t.n) * int64(host.AdamBytesPerElement(gsize, true, o.e.dt != backend.F32, false))
	}
	return w
}

// addUp adds each group's weight copy. The copies write the weights
// directly; the step ends with every stream drained, so the next step's
// forward reads them without an edge of its own.
func (o *offload) addUp(g *Graph, adam []NodeID) {
	e := o.e
	dsize := e.dt.Size()
	for gi := range o.groups {
		grp := &o.groups[gi]
		g.Add("h2d weights "+grp.name, H2D, func(s backend.Stream) error {
			if grp.skipped {
				return nil // the pinned weights are not this step's
			}
			for _, t := range grp.tensors {
				if err := e.be.CopyH2D(s, t.param, o.out, t.off*dsize); err != nil {
					return err
				}
			}
			return nil
		}, adam[gi])
	}
}

// adam runs one group's CPU Adam step, or nothing on a step whose loss is
// not finite: the master weights, moments and step counts stay as they
// are (host.AdamState.Step counts applied steps only).
func (o *offload) adam(grp *hostGroup, lr float64) error {
	e := o.e
	if grp.skipped = e.hostSkip("host adam " + grp.name); grp.skipped {
		return nil
	}
	dsize := e.dt.Size()
	var reads, writes []backend.Range
	for _, t := range grp.tensors {
		if t.acc >= 0 {
			reads = append(reads, hazard.HostRange(e.ring.acc, 4*t.acc, 4*t.n))
		} else {
			reads = append(reads, hazard.HostRange(o.grads, t.off*o.gsize, t.n*o.gsize))
		}
		writes = append(writes, hazard.HostRange(o.out, t.off*dsize, t.n*dsize))
	}
	e.hostAccess("host adam "+grp.name, reads, writes)
	w := o.weights()
	ts := make([]host.AdamTensor, len(grp.tensors))
	for i, t := range grp.tensors {
		ts[i] = host.AdamTensor{Name: t.name, Params: e.cfg.Hyper.HostParams(lr, t.decay), W: w[t.off : t.off+t.n],
			Grad: o.grad(t), State: t.state}
		if o.master != nil {
			ts[i].BF16Out = o.outBF16()[t.off : t.off+t.n]
		}
	}
	res, err := e.workers.AdamStep(ts)
	if err != nil {
		return err
	}
	grp.normSq = 0
	for _, r := range res.Tensors {
		grp.normSq += r.Norm * r.Norm
	}
	return nil
}

// stepNormSq sums the groups' squared gradient norms of the latest step.
func (o *offload) stepNormSq() float64 {
	var s float64
	for _, g := range o.groups {
		s += g.normSq
	}
	return s
}
