// Zero mode's gradient ring (--grad-residency ring): the device holds the
// gradients of a few groups at a time, as DeepSpeed's ZeRO-Offload copies
// gradients to the host in buckets while the backward produces them,
// instead of the whole gradient (N elements) for the step.
//
// The groups, in one micro-batch's backward order, are the head's (final
// norm, untied head: complete after BackwardHead), blocks L-1 .. 0 and the
// embeddings' (after BackwardEmbed); the j-th uses slot j % ringSlots of
// the model's Grads (model.NewGradRing). Per micro-batch and group:
//
//	compute: zero the group's region, then its backward pass; after the
//	         d2h copy of the slot's previous group (an edge)
//	d2h:     copy the group's gradient to the pinned buffer; with several
//	         micro-batches after the previous one's accumulate (an edge)
//	host:    (several micro-batches) add the pinned copy into an fp32
//	         accumulator; the group's host Adam reads it after the last
//
// With one micro-batch the host Adam reads the pinned gradient as with
// the whole gradient, so the two give the same bits. A head tied to the
// embedding is written from BackwardHead to BackwardEmbed; it stays in a
// resident region outside the ring, zeroed once per step and accumulated
// over the micro-batches on the device as the whole gradient is (so it too
// gives the same bits), and goes down after the last micro-batch.
//
// The ring's cost: the gradients cross the link once per micro-batch
// (accum times the whole path's traffic), and the host reads and writes
// the accumulator once per micro-batch. Limits: one rank (zero's sharded
// host optimizer reads whole-step gradients; several ranks keep the
// whole gradient).

package engine

import (
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// ringSlots is the ring's number of slots. One would serialise each
// group's backward behind the copy of the group before it; two let a
// group's backward run while the previous group's gradient goes down,
// and lsp-train plan predicts the same step time with three (the link,
// not the slots, is then the limit), so two, the less memory.
const ringSlots = 2

// GradResidency is where zero mode keeps the parameter gradients on the
// device (--grad-residency).
type GradResidency string

// Residencies.
const (
	// ResidencyAuto is resolved by the caller, who knows the device's
	// budget (train: whole when the whole plan fits, ring otherwise); the
	// engine takes it, and the empty value, as whole.
	ResidencyAuto  GradResidency = "auto"
	ResidencyWhole GradResidency = "whole" // every gradient, for the step
	ResidencyRing  GradResidency = "ring"  // a ring of per-group slots (ring.go)
)

// ParseGradResidency reads a --grad-residency value.
func ParseGradResidency(s string) (GradResidency, error) {
	switch r := GradResidency(s); r {
	case ResidencyAuto, ResidencyWhole, ResidencyRing:
		return r, nil
	}
	return "", fmt.Errorf("unknown grad-residency %q (want auto, whole or ring)", s)
}

// ring reports whether the engine keeps zero mode's gradients in a ring.
func (c Config) ring() bool { return c.Mode == Zero && c.GradResidency == ResidencyRing }

// checkResidency checks --grad-residency against the other settings.
func (c Config) checkResidency() error {
	if c.GradResidency == "" {
		return nil
	}
	if _, err := ParseGradResidency(string(c.GradResidency)); err != nil {
		return fmt.Errorf("--grad-residency: %w", err)
	}
	if c.GradResidency != ResidencyRing {
		return nil
	}
	if c.Mode == Native {
		return fmt.Errorf("--grad-residency: ring is zero's and lsp's (their host Adam takes the gradients, or S, block by block); --mode native keeps its gradients whole on the device")
	}
	if c.Comm != nil && c.Comm.Size() > 1 {
		return fmt.Errorf("--grad-residency: ring is not supported with %d ranks (their sharded host optimizer sums whole-step gradients); use whole, or auto, which chooses whole there", c.Comm.Size())
	}
	return nil
}

// gradRing is the engine's side of the ring: the model's layout of it,
// the offloaded tensors of each group and the host accumulator.
type gradRing struct {
	e *Engine
	model.GradRing
	groups []ringGroup // by GradRing.Groups
	// acc is the fp32 accumulator of the ring groups' gradients over the
	// micro-batches (accum > 1; nil with one micro-batch), pinned so that
	// a hazard-checking backend sees its reads and writes.
	acc backend.HostBuffer
}

// ringGroup is one group of the ring.
type ringGroup struct {
	model.GradGroup
	region  backend.Tensor // its region of Grads, zeroed before its pass
	tensors []*hostTensor  // its offloaded tensors (offload's)
	off     int            // the offload group its tensors belong to
}

// ringLayout is the ring of x's gradients the engine asks the model for.
func ringLayout(x *model.Index) (model.GradRing, error) {
	r, err := model.NewGradRing(x.Layout, len(x.Blocks), ringSlots, nil)
	if err != nil {
		return model.GradRing{}, fmt.Errorf("engine: --grad-residency ring: %w", err)
	}
	return r, nil
}

// newRing sets up the ring of the engine's model (built with
// Options.GradSlots = ringSlots) over the offload's tensors.
func newRing(e *Engine) (*gradRing, error) {
	lay, err := ringLayout(e.idx)
	if err != nil {
		return nil, err
	}
	grads := e.Model.Buffers().Grads
	r := &gradRing{e: e, GradRing: lay}
	// The model must have laid Grads out as the ring says: the engine
	// zeroes and copies regions of it by the ring's offsets.
	honoured := grads.Len() == lay.Len
	for i := range e.idx.Layout {
		if gv, ok := e.Model.GradView(i); ok && gv.Off-grads.Off != lay.Offsets[i] {
			honoured = false
		}
	}
	if !honoured {
		return nil, fmt.Errorf("engine: --grad-residency ring: the model does not lay its gradients out as a ring (model.Options.GradSlots)")
	}
	byIdx := make(map[int]*hostTensor)
	owner := make(map[int]int)
	o := e.off
	for gi := range o.groups {
		for ti := range o.groups[gi].tensors {
			t := &o.groups[gi].tensors[ti]
			byIdx[t.idx], owner[t.idx] = t, gi
		}
	}
	accN := 0
	for _, gg := range lay.Groups {
		rg := ringGroup{GradGroup: gg, region: grads.Slice(gg.Off, gg.Len), off: -1}
		for _, i := range gg.Params {
			t := byIdx[i]
			if t == nil {
				return nil, fmt.Errorf("engine: --grad-residency ring: %s is not offloaded", e.idx.Layout[i].Name)
			}
			if rg.off >= 0 && owner[i] != rg.off {
				return nil, fmt.Errorf("engine: --grad-residency ring: group %s spans two host groups", gg.Name)
			}
			rg.off = owner[i]
			if e.accum > 1 && !gg.Resident() {
				t.acc = accN
				accN += t.n
			}
			rg.tensors = append(rg.tensors, t)
		}
		r.groups = append(r.groups, rg)
	}
	if accN > 0 {
		if r.acc, err = e.be.AllocHost("ring grad accumulator", 4*accN); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	return r, nil
}

func (r *gradRing) free() {
	if r != nil && r.acc != nil {
		r.e.be.FreeHost(r.acc)
	}
}

// ringElems is the gradient elements of the ring's groups (not the
// resident region's): what crosses the link once per micro-batch and what
// the accumulator holds.
func ringElems(lay model.GradRing) int64 {
	var n int64
	for _, g := range lay.Groups {
		if !g.Resident() {
			n += int64(g.Len)
		}
	}
	return n
}

// ringStep is the state of one step's graph while it is built.
type ringStep struct {
	lastCopy []NodeID // by slot: the d2h copy of its latest group; -1: none yet
	lastAcc  []NodeID // by group: its latest accumulate; -1: none
	ready    []NodeID // by group: what completes it on the host for the Adam
}

// addZero adds the zeroing of the resident region at the step's start.
func (r *gradRing) addZero(g *Graph) *ringStep {
	st := &ringStep{lastCopy: make([]NodeID, r.Slots), lastAcc: make([]NodeID, len(r.groups)), ready: make([]NodeID, len(r.groups))}
	for i := range st.lastCopy {
		st.lastCopy[i] = -1
	}
	for i := range st.lastAcc {
		st.lastAcc[i] = -1
	}
	if r.Resident > 0 {
		resident := r.e.Model.Buffers().Grads.Slice(0, r.Resident)
		g.Add("zero resident grads", Compute, func(s backend.Stream) error { return r.e.be.Fill(s, resident, 0) })
	}
	return st
}

// addMicro adds micro-batch i's backward passes (the head's, each
// block's, the embeddings'), each with its group's zeroing, copy down and
// accumulation.
func (r *gradRing) addMicro(g *Graph, st *ringStep, i int) {
	e, m := r.e, r.e.Model
	L := len(e.idx.Blocks)
	// group finds the ring group of a pass (layer >= 0, or the pass
	// outside the blocks); -1: none (its parameters are resident or it
	// has none).
	group := func(layer int, pass model.Pass) int {
		for k, rg := range r.groups {
			if !rg.Resident() && rg.Layer == layer && (layer >= 0 || rg.Pass == pass) {
				return k
			}
		}
		return -1
	}
	pass := func(name string, k int, run func(s backend.Stream) error) NodeID {
		var deps []NodeID
		if k >= 0 {
			if c := st.lastCopy[r.groups[k].Slot]; c >= 0 {
				deps = append(deps, c) // the slot's previous group is down
			}
		}
		bwd := g.Add(name, Compute, func(s backend.Stream) error {
			if k >= 0 {
				if err := e.be.Fill(s, r.groups[k].region, 0); err != nil {
					return err
				}
			}
			return run(s)
		}, deps...)
		if k >= 0 {
			st.lastCopy[r.groups[k].Slot] = r.addCopy(g, st, k, i, bwd)
		}
		return bwd
	}
	pass(fmt.Sprintf("backward %d.head", i), group(-1, model.ByHead), m.BackwardHead)
	for l := L - 1; l >= 0; l-- {
		l := l
		pass(fmt.Sprintf("backward %d.%d", i, l), group(l, 0), func(s backend.Stream) error { return m.BackwardLayer(s, l) })
	}
	embed := pass(fmt.Sprintf("backward %d.embed", i), group(-1, model.ByEmbed), m.BackwardEmbed)
	if i == e.accum-1 {
		for k := range r.groups {
			if r.groups[k].Resident() {
				st.ready[k] = r.addD2H(g, k, "d2h grads "+r.groups[k].Name, embed)
			}
		}
	}
}

// addCopy adds micro-batch i's copy of group k down after its backward
// bwd and, with several micro-batches, its accumulation; it returns the
// copy.
func (r *gradRing) addCopy(g *Graph, st *ringStep, k, i int, bwd NodeID) NodeID {
	name := fmt.Sprintf("%d.%s", i, r.groups[k].Name)
	deps := []NodeID{bwd}
	if st.lastAcc[k] >= 0 {
		deps = append(deps, st.lastAcc[k]) // the previous copy is added in
	}
	d2h := r.addD2H(g, k, "d2h grads "+name, deps...)
	st.ready[k] = d2h
	if r.acc != nil {
		first := i == 0
		acc := g.Add("accumulate grads "+name, Host, func(backend.Stream) error {
			return r.accumulate(&r.groups[k], "accumulate grads "+name, first)
		}, d2h)
		g.Nodes[acc].Work = r.accumulateWork(&r.groups[k], first)
		st.lastAcc[k], st.ready[k] = acc, acc
	}
	return d2h
}

// addD2H adds the copy of group k's gradients to the pinned buffer.
func (r *gradRing) addD2H(g *Graph, k int, name string, deps ...NodeID) NodeID {
	o := r.e.off
	rg := &r.groups[k]
	return g.Add(name, D2H, func(s backend.Stream) error {
		for _, t := range rg.tensors {
			if err := r.e.be.CopyD2H(s, o.grads, t.off*o.gsize, t.grad); err != nil {
				return err
			}
		}
		return nil
	}, deps...)
}

// addAdam adds each host group's Adam after what completes its gradients
// in the last micro-batch.
func (r *gradRing) addAdam(g *Graph, st *ringStep, lr float64) []NodeID {
	o := r.e.off
	ready := make([][]NodeID, len(o.groups))
	for k, rg := range r.groups {
		ready[rg.off] = append(ready[rg.off], st.ready[k])
	}
	adam := make([]NodeID, len(o.groups))
	for gi := range o.groups {
		adam[gi] = o.addAdam(g, gi, lr, ready[gi]...)
	}
	return adam
}

// accumulateChunk is the elements one worker adds at a time.
const accumulateChunk = 1 << 16

// accumulate adds group rg's pinned gradient into the accumulator (the
// first micro-batch's is copied, converted from bf16), on the worker
// pool. Every element is one rounding of float32(acc + g), whatever the
// chunking, so the schedules agree bit for bit.
func (r *gradRing) accumulate(rg *ringGroup, name string, first bool) error {
	o := r.e.off
	var reads, writes []backend.Range
	type chunk struct {
		t      *hostTensor
		lo, hi int
	}
	var chunks []chunk
	for _, t := range rg.tensors {
		reads = append(reads, hazard.HostRange(o.grads, t.off*o.gsize, t.n*o.gsize))
		if !first {
			reads = append(reads, hazard.HostRange(r.acc, 4*t.acc, 4*t.n))
		}
		writes = append(writes, hazard.HostRange(r.acc, 4*t.acc, 4*t.n))
		for lo := 0; lo < t.n; lo += accumulateChunk {
			chunks = append(chunks, chunk{t, lo, min(lo+accumulateChunk, t.n)})
		}
	}
	r.e.hostAccess(name, reads, writes)
	acc := r.acc.Float32()
	var g32 []float32
	var g16 []uint16
	if o.gsize == 2 {
		g16 = o.grads.BF16()
	} else {
		g32 = o.grads.Float32()
	}
	return r.e.workers.ParallelFor(len(chunks), func(c int) {
		ch := chunks[c]
		dst := acc[ch.t.acc+ch.lo : ch.t.acc+ch.hi]
		if g16 != nil {
			src := g16[ch.t.off+ch.lo : ch.t.off+ch.hi]
			for j, h := range src {
				v := math.Float32frombits(uint32(h) << 16)
				if !first {
					v += dst[j]
				}
				dst[j] = v
			}
			return
		}
		src := g32[ch.t.off+ch.lo : ch.t.off+ch.hi]
		if first {
			copy(dst, src)
			return
		}
		for j, v := range src {
			dst[j] += v
		}
	})
}

// accumulateWork is an accumulate node's host work: the pinned gradient
// read, the accumulator read (after the first micro-batch) and written.
func (r *gradRing) accumulateWork(rg *ringGroup, first bool) HostWork {
	w := HostWork{Tensors: int64(len(rg.tensors))}
	for _, t := range rg.tensors {
		w.Elems += int64(t.n)
	}
	per := int64(r.e.off.gsize) + 4
	if !first {
		per += 4
	}
	w.Bytes = w.Elems * per
	return w
}
