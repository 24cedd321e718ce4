// ZeRO's partitioning of the host optimizer (zero mode with several
// ranks): the host Adam of every group of parameters is split among the
// ranks, each group's elements in comm.Shard's contiguous ranges (the
// group is contiguous in the offload's arrays, so a shard may start or end
// inside a tensor). Per group, in the chain of collectives (dp.go):
//
//   - after the gradients' copy down, a reduce-scatter gives this rank the
//     rank-order sum of its shard only (the bits an all-reduce gives for
//     those elements); each rank then sums the squares of its part of every
//     tensor of the group, in float64, and the ranks all-gather those
//     partial sums (as bits) and add them in rank order, so every rank
//     holds every tensor's whole gradient norm: the per-tensor clip
//     (--clip-mode matrix) and the reported norm see the whole tensor;
//   - the host Adam updates only the shard: fp32 master (bf16 models) and
//     moments exist for it alone, so they take 1/N of one process's host
//     memory; the pinned gradients and weights stay whole (the copies down
//     and up move every element);
//   - an all-gather of the updated weights, in the model dtype that goes up
//     to the device (fp32 in place; bf16 as one broadcast per rank of its
//     shard's bytes), after which every rank copies the whole group up.
//
// The all-gather of group i follows the reduce-scatter of group i+1 in the
// chain, so that one group's Adam overlaps with the next group's
// reduce-scatter rather than holding it up.
//
// A checkpoint holds the whole state: every rank reads the state's
// arrays (StateArrays), each gathered group by group through the pinned
// gradients (a collective), and rank 0 writes what it reads, so that the
// file has the layout of one process's and no rank holds a whole array
// more than it does for a step; LoadStateFrom takes each rank's shard of
// the whole arrays.
//
// Element for element the update is the replicated one's: the same summed
// gradient and the same Adam. The norms differ in the order of their
// float64 sums (per rank, then over ranks), which changes the clip's scale
// by rounding when a tensor is clipped.

package engine

import (
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// hostShard is one rank's part of a sharded host optimizer.
type hostShard struct {
	c      comm.Communicator
	n      int       // this rank's elements over every group
	grads  []float32 // [n] this rank's shard of the summed gradients
	master []float32 // bf16 models: [n]
	mom    []float32 // M then V, [2n]
	groups []shardGroup
}

// shardGroup is one offload group's shard on this rank.
type shardGroup struct {
	off, n int // the group's elements in the offload's arrays
	lo, hi int // this rank's shard of them (absolute, as off)
	base   int // where the shard starts in the rank's arrays
	pieces []shardPiece
	// part holds every rank's float64 partial sum of squares per tensor
	// (2 float32 slots each, rank after rank); norm the whole norms.
	part []float32
	norm []float64
	// sq and chunks are the norm's scratch: per tensor, per chunk of a piece.
	sq, chunks []float64
}

// shardPiece is the part of one tensor that lies in the shard.
type shardPiece struct {
	t      int // the tensor's index in its group
	off, n int // absolute elements
	state  *host.AdamState
}

// sharded reports whether cfg's zero mode shards the host optimizer.
func (c Config) sharded() bool {
	return c.Mode == Zero && c.Comm != nil && c.Comm.Size() > 1 && !c.replicateHost
}

// shardElems is the number of elements rank owns of a host optimizer
// with the given group sizes.
func shardElems(groupElems []int, size, rank int) int {
	n := 0
	for _, g := range groupElems {
		lo, hi := comm.Shard(g, size, rank)
		n += hi - lo
	}
	return n
}

func newHostShard(o *offload, c comm.Communicator, alloc bool) *hostShard {
	sh := &hostShard{c: c}
	size, rank := c.Size(), c.Rank()
	off := 0
	for _, grp := range o.groups {
		n := 0
		for _, t := range grp.tensors {
			n += t.n
		}
		lo, hi := comm.Shard(n, size, rank)
		sg := shardGroup{off: off, n: n, lo: off + lo, hi: off + hi, base: sh.n,
			part: make([]float32, 2*len(grp.tensors)*size), norm: make([]float64, len(grp.tensors))}
		sg.sq = make([]float64, len(grp.tensors))
		chunks := 0
		for ti, t := range grp.tensors {
			a, b := max(t.off, sg.lo), min(t.off+t.n, sg.hi)
			if a < b {
				sg.pieces = append(sg.pieces, shardPiece{t: ti, off: a, n: b - a})
				chunks = max(chunks, (b-a+host.AdamChunkLen-1)/host.AdamChunkLen)
			}
		}
		sg.chunks = make([]float64, chunks)
		sh.n += hi - lo
		off += n
		sh.groups = append(sh.groups, sg)
	}
	if !alloc {
		return sh // traced: the host nodes never run
	}
	sh.grads = make([]float32, sh.n)
	if o.e.dt != backend.F32 {
		sh.master = make([]float32, sh.n)
	}
	sh.mom = make([]float32, 2*sh.n)
	for gi := range sh.groups {
		sg := &sh.groups[gi]
		for pi := range sg.pieces {
			p := &sg.pieces[pi]
			l := sg.local(p.off)
			p.state = &host.AdamState{M: sh.mom[l : l+p.n], V: sh.mom[sh.n+l : sh.n+l+p.n]}
		}
	}
	return sh
}

// local is where absolute element i of the shard lies in the rank's arrays.
func (sg *shardGroup) local(i int) int { return sg.base + i - sg.lo }

// addDownSharded is addDown for a sharded optimizer; it returns, per
// group, the all-gather of its weights, which the copies up follow.
func (o *offload) addDownSharded(g *Graph, bwd []NodeID, bwdEmbed NodeID, lr float64) []NodeID {
	e, sh := o.e, o.shard
	gathers := make([]NodeID, len(o.groups))
	adam := make([]NodeID, len(o.groups))
	dsize := e.dt.Size()
	gather := func(gi int) {
		grp, sg := &o.groups[gi], &sh.groups[gi]
		name := "all-gather weights " + grp.name
		// The planner prices a collective as an all-reduce of
		// Node.AllReduce bytes; an all-gather is half of one.
		gathers[gi] = e.dp.collective(g, name, 0, func() error { return o.gatherWeights(name, sg) }, adam[gi])
		g.Nodes[gathers[gi]].AllReduce = int64(dsize*sg.n+4*len(sg.part)) / 2
	}
	for gi := range o.groups {
		grp, sg := &o.groups[gi], &sh.groups[gi]
		d2h := o.addGradsCopy(g, gi, bwd, bwdEmbed)
		name := "reduce-scatter grads " + grp.name
		rs := e.dp.collective(g, name, 0, func() error { return o.reduceScatter(name, grp, sg) }, d2h)
		g.Nodes[rs].AllReduce = int64(4*sg.n) / 2
		adam[gi] = g.Add("host adam "+grp.name, Host, func(backend.Stream) error {
			return o.adamShard(grp, sg, lr)
		}, rs)
		g.Nodes[adam[gi]].Work = o.workShard(grp, sg)
		if gi > 0 {
			gather(gi - 1)
		}
	}
	gather(len(o.groups) - 1)
	return gathers
}

// reduceScatter sums the group's gradients over ranks into this rank's
// shard and gathers every tensor's norm.
func (o *offload) reduceScatter(name string, grp *hostGroup, sg *shardGroup) error {
	sh := o.shard
	o.e.hostAccess(name, []backend.Range{hazard.HostRange(o.grads, 4*sg.off, 4*sg.n)}, nil)
	mine := sh.grads[sg.base : sg.base+sg.hi-sg.lo]
	if err := sh.c.ReduceScatterSum(mine, o.grads.Float32()[sg.off:sg.off+sg.n]); err != nil {
		return err
	}
	T, r := len(grp.tensors), sh.c.Rank()
	sq := sg.sq
	clear(sq)
	for _, p := range sg.pieces {
		x := sh.grads[sg.local(p.off) : sg.local(p.off)+p.n]
		chunks := sg.chunks[:(p.n+host.AdamChunkLen-1)/host.AdamChunkLen]
		if err := host.SumSquaresChunks(x, host.AdamChunkLen, chunks); err != nil {
			return err
		}
		for _, c := range chunks {
			sq[p.t] += c
		}
	}
	for ti, v := range sq {
		b := math.Float64bits(v)
		sg.part[2*(r*T+ti)] = math.Float32frombits(uint32(b))
		sg.part[2*(r*T+ti)+1] = math.Float32frombits(uint32(b >> 32))
	}
	if err := sh.c.AllGather(sg.part, sg.part[2*r*T:2*(r+1)*T]); err != nil {
		return err
	}
	for ti := range sg.norm {
		var s float64
		for k := 0; k < sh.c.Size(); k++ {
			i := 2 * (k*T + ti)
			s += math.Float64frombits(uint64(math.Float32bits(sg.part[i])) | uint64(math.Float32bits(sg.part[i+1]))<<32)
		}
		sg.norm[ti] = math.Sqrt(s)
	}
	return nil
}

// adamShard runs the group's CPU Adam on this rank's shard, or nothing on
// a step whose loss is not finite (on any rank: the flag is agreed). Every
// rank counts every tensor's steps, so each holds the counts a checkpoint
// saves.
func (o *offload) adamShard(grp *hostGroup, sg *shardGroup, lr float64) error {
	e, sh := o.e, o.shard
	if grp.skipped = e.hostSkip("host adam " + grp.name); grp.skipped {
		return nil
	}
	dsize := e.dt.Size()
	writes := []backend.Range{hazard.HostRange(o.out, sg.lo*dsize, (sg.hi-sg.lo)*dsize)}
	e.hostAccess("host adam "+grp.name, nil, writes)
	ts := make([]host.AdamTensor, len(sg.pieces))
	for i, p := range sg.pieces {
		t := grp.tensors[p.t]
		l := sg.local(p.off)
		p.state.Step = t.state.Step
		ts[i] = host.AdamTensor{Name: t.name, Params: e.cfg.Hyper.HostParams(lr, t.decay),
			Grad: host.AdamGrad{F32: sh.grads[l : l+p.n]}, State: p.state, NormKnown: true, Norm: sg.norm[p.t]}
		if sh.master != nil {
			ts[i].W, ts[i].BF16Out = sh.master[l:l+p.n], o.outBF16()[p.off:p.off+p.n]
		} else {
			ts[i].W = o.out.Float32()[p.off : p.off+p.n]
		}
	}
	if len(ts) > 0 {
		if _, err := e.workers.AdamStep(ts); err != nil {
			return err
		}
	}
	grp.normSq = 0
	for ti, nrm := range sg.norm {
		grp.normSq += nrm * nrm
		if !math.IsNaN(nrm) && !math.IsInf(nrm, 0) {
			grp.tensors[ti].state.Step++ // as AdamStep counts a tensor it updates
		}
	}
	return nil
}

// workShard is the host Adam of one shard: the norms are given, so there
// is no pre-scan (the reduce-scatter node scans the shard).
func (o *offload) workShard(grp *hostGroup, sg *shardGroup) HostWork {
	w := HostWork{Tensors: int64(len(sg.pieces)), Elems: int64(sg.hi - sg.lo)}
	w.Bytes = w.Elems * int64(host.AdamBytesPerElement(4, false, o.e.dt != backend.F32, false))
	return w
}

// gatherWeights all-gathers the group's updated weights in the model
// dtype: fp32 in place, bf16 as a broadcast of each rank's shard.
func (o *offload) gatherWeights(name string, sg *shardGroup) error {
	sh, dsize := o.shard, o.e.dt.Size()
	r := []backend.Range{hazard.HostRange(o.out, sg.off*dsize, sg.n*dsize)}
	o.e.hostAccess(name, r, r)
	if dsize == 4 {
		x := o.out.Float32()[sg.off : sg.off+sg.n]
		return sh.c.AllGather(x, o.out.Float32()[sg.lo:sg.hi])
	}
	b := o.out.Bytes()
	for k := 0; k < sh.c.Size(); k++ {
		lo, hi := comm.Shard(sg.n, sh.c.Size(), k)
		if err := sh.c.Broadcast(b[dsize*(sg.off+lo):dsize*(sg.off+hi)], k); err != nil {
			return err
		}
	}
	return nil
}

// initShard reads the device parameters into this rank's part of a bf16
// model's master (an fp32 model's master is the whole pinned weights).
func (o *offload) initShard() error {
	sh := o.shard
	for gi, grp := range o.groups {
		sg := &sh.groups[gi]
		for _, p := range sg.pieces {
			t := grp.tensors[p.t]
			vals, err := backend.Download(o.e.be, o.e.st.Compute, t.param)
			if err != nil {
				return fmt.Errorf("engine: reading %s: %w", t.name, err)
			}
			l := sg.local(p.off)
			copy(sh.master[l:l+p.n], vals[p.off-t.off:p.off-t.off+p.n])
		}
	}
	return nil
}

// shardArray is one of a rank's state arrays, by its checkpoint name.
type shardArray struct {
	name string
	v    []float32 // this rank's shard
}

// named are this rank's fp32 state arrays: the moments and (bf16
// models) the master.
func (sh *hostShard) named() []shardArray {
	out := []shardArray{{"host.m", sh.mom[:sh.n]}, {"host.v", sh.mom[sh.n:]}}
	if sh.master != nil {
		out = append(out, shardArray{"host.master", sh.master})
	}
	return out
}

// shardArrays are a sharded host optimizer's state arrays as a
// checkpoint saves them, whole: every rank reading one gathers it group
// by group (a collective) into the pinned gradients, idle between steps,
// and hands each group over from there, so that no rank holds more than
// it does for a step. An fp32 model's master is its pinned weights, whole
// after every step's all-gather.
func (o *offload) shardArrays() []StateArray {
	sh := o.shard
	var out []StateArray
	for _, a := range sh.named() {
		out = append(out, StateArray{Name: a.name, Len: o.n, collective: true, Read: func(fn func([]float32) error) error {
			pinned := o.grads.Float32()[:o.n] // fp32 with several ranks (checkComm)
			o.e.hostAccess("gather host state", nil, []backend.Range{hazard.HostRange(o.grads, 0, 4*o.n)})
			var ferr error
			for _, sg := range sh.groups {
				whole := pinned[sg.off : sg.off+sg.n]
				if err := sh.c.AllGather(whole, a.v[sg.base:sg.base+sg.hi-sg.lo]); err != nil {
					return fmt.Errorf("engine: gathering %s: %w", a.name, err)
				}
				if ferr == nil {
					ferr = fn(whole) // after an error, the other ranks' gathers still need this one's
				}
			}
			return ferr
		}})
	}
	if sh.master == nil {
		out = append(out, StateArray{Name: "host.master", Len: o.n, Read: func(fn func([]float32) error) error {
			return fn(o.out.Float32()[:o.n])
		}})
	}
	return out
}

// loadShard restores this rank's shard of the whole arrays (and, for an
// fp32 model, the whole pinned weights, which are its master), each chunk
// as it is read.
func (o *offload) loadShard(into func(string, int, func(int, []float32) error) error) error {
	sh := o.shard
	if sh.master == nil {
		err := into("host.master", o.n, func(off int, v []float32) error {
			copy(o.out.Float32()[off:o.n], v)
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, a := range sh.named() {
		err := into(a.name, o.n, func(off int, v []float32) error {
			// The part of [off, off+len(v)) that lies in each group's
			// shard [lo, hi).
			for _, sg := range sh.groups {
				lo, hi := max(sg.lo, off), min(sg.hi, off+len(v))
				if lo < hi {
					copy(a.v[sg.base+lo-sg.lo:], v[lo-off:hi-off])
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
