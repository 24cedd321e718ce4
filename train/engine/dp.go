// Data parallelism (mpirun -np N): several processes, one rank each, train
// one model on their own micro-batches of every global batch and keep
// bit-identical weights and optimizer state by summing what each step
// updates from across ranks (train/comm).
//
// lsp mode: each layer's S goes down to its pinned host buffer as in one
// process; then a host node all-reduces the layer's S (d^2 per matrix, not
// the m n of a dense gradient), and the subspace Adam runs on the sum on
// every rank. The random projectors come from the seed; a projector check
// (--fit) on the same calibration batches on every rank, with the same
// weights, fits the same projectors on every rank (the caller's part:
// lsp-train draws them from the seed and the step). With --dense-params
// host, each dense group's gradients are all-reduced on the host before
// its host Adam in the same way; with device, as native mode's below,
// before the device AdamW.
//
// native mode: per group of parameters (a block from the last, then the
// embeddings and head), the gradients go down to a pinned buffer once the
// group's backward is done, are all-reduced on the host (m n per matrix)
// and go back up before the device AdamW (dpGrads). The backward kernels
// of one process accumulate micro-batches into one running sum, an order
// a sum over ranks cannot repeat without changing the single process, so
// native (like lsp's dense gradients) agrees with --grad-accum N to
// rounding, not bit for bit (the test bounds the difference).
//
// zero mode: ZeRO's sharding of the host optimizer (shard.go): each
// group's gradients are reduce-scattered on the host between their copy
// down and the host Adam, each rank updates its shard of the group, and
// the updated weights are all-gathered before the copy up.
//
// With a device communicator (Config.DeviceComm, NCCL on the CUDA
// backend), what the device reads back is summed there instead, by nodes
// on a stream of their own (Comm): each layer's S before its copy down
// (which then copies the sum), and dpGrads' groups in place of their
// round trip through pinned memory. The device communicator sums in rank
// order too, so both paths give the same bits. Those nodes are enqueued
// in list order on one stream, so every rank issues the device
// collectives in the same order, and they share one scratch buffer (the
// stream orders them); the copies of other layers overlap them.
//
// Every rank calls the same collectives in the same order: the collective
// nodes form one chain in list order (each depends on the one before), so
// two host goroutines never race to the communicator and ranks cannot
// pair up different buffers of one size (comm's package doc). The chain
// starts with the step's non-finite flag, summed over ranks and copied
// back to the device, so a NaN on any rank skips the step on every rank
// (the host Adam nodes and the device applies read the agreed flag).
//
// The loss is scaled by the global number of targets (an all-reduce
// before the graph runs), so a rank's S is its micro-batch's share of the
// global mean. With one micro-batch per rank, rank r's S is the sum over
// tokens of micro-batch r, written from +0 (SparseS without accumulate),
// and the rank-order sum ((S0 + S1) + S2) has the bits a single process
// with --grad-accum N computes over the same micro-batches: SparseS there
// sums each micro-batch from +0 and adds it to S (S = acc + S), and fp32
// addition is commutative. Several micro-batches per rank sum per rank
// first, a different order: equal up to rounding, not bit for bit.

package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// checkComm checks what data parallelism supports, naming the flag at
// fault; c has more than one rank.
func (c Config) checkComm() error {
	var errs []error
	n := c.Comm.Size()
	if (c.Mode == Native || c.Mode == Zero) && c.GradDType != backend.F32 {
		errs = append(errs, fmt.Errorf("--grad-dtype %v: --mode %s with %d ranks all-reduces fp32 gradients; use --grad-dtype fp32", c.GradDType, c.Mode, n))
	}
	if c.Mode == LoRA && c.GradDType != backend.F32 {
		errs = append(errs, fmt.Errorf("--grad-dtype %v: --mode lora with %d ranks all-reduces the adapters' fp32 gradients; use --grad-dtype fp32", c.GradDType, n))
	}
	if c.Mode == LSP {
		if c.DenseParams != DenseFrozen && c.GradDType != backend.F32 {
			errs = append(errs, fmt.Errorf("--grad-dtype %v: --dense-params %s with %d ranks all-reduces fp32 gradients; use --grad-dtype fp32", c.GradDType, c.DenseParams, n))
		}
	}
	return errors.Join(errs...)
}

// dp is the engine's data-parallel state: nil in a single process.
type dp struct {
	c comm.Communicator
	// dev sums on the device (nil: on the host through c); scratch is
	// its workspace, sized for the longest sum (allocScratch).
	dev     DeviceComm
	scratch backend.Tensor
	// one is a 1-element buffer for the global target count; loss is
	// 2 x size floats, every rank's float64 loss sum gathered as bits.
	one, loss []float32
	// last is the latest collective node of the graph being built.
	last NodeID
}

// DeviceComm is a communicator on device tensors: its collectives are
// enqueued on a backend stream and ordered by events like any op
// (cuda.NCCL).
type DeviceComm interface {
	Rank() int
	Size() int
	// AllReduceSum enqueues on s the sum over ranks of the F32 tensor t
	// into t, in rank order (((t0 + t1) + t2) ...), the order of
	// comm.SumInRankOrder; scratch holds comm.ReduceScratch(t.Len(),
	// Size()) F32 elements and does not overlap t.
	AllReduceSum(s backend.Stream, t, scratch backend.Tensor) error
}

func newDP(c comm.Communicator, dev DeviceComm) *dp {
	if c == nil || c.Size() <= 1 {
		return nil
	}
	return &dp{c: c, dev: dev, one: make([]float32, 1), loss: make([]float32, 2*c.Size())}
}

// onDevice says whether the engine's sums of device tensors run on the
// device (Config.DeviceComm).
func (d *dp) onDevice() bool { return d != nil && d.dev != nil }

// scratchElems is the scratch the device communicator needs among size
// ranks for sums of at most sums elements each (a layer's S, a group's
// gradients: one collective each when contiguous, more when not, none
// longer).
func scratchElems(sums []int, size int) int {
	n := 0
	for _, s := range sums {
		n = max(n, comm.ReduceScratch(s, size))
	}
	return n
}

// allocScratch allocates the device communicator's scratch, as
// collectiveScratch plans it.
func (d *dp) allocScratch(e *Engine) error {
	if !d.onDevice() {
		return nil
	}
	var sums []int
	if e.lsp != nil {
		for l := range e.lsp.Mats {
			_, _, n := e.lsp.HostS(l)
			sums = append(sums, n)
		}
	}
	if e.dpg != nil {
		for _, grp := range e.dpg.groups {
			sums = append(sums, grp.n)
		}
	}
	n := scratchElems(sums, d.dev.Size())
	if n == 0 {
		return nil
	}
	var err error
	if d.scratch, err = e.be.Alloc("device collectives' scratch", n, backend.F32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

func (d *dp) free(be backend.Backend) {
	if d != nil && d.scratch.Buf != nil {
		be.Free(d.scratch)
		d.scratch = backend.Tensor{}
	}
}

// deviceSum adds a node on the collectives' stream that sums spans over
// ranks on the device, after deps.
func (e *Engine) deviceSum(g *Graph, name string, spans []backend.Tensor, deps ...NodeID) NodeID {
	d := e.dp
	n := 0
	for _, t := range spans {
		n += t.Len()
	}
	id := g.Add(name, Comm, func(s backend.Stream) error {
		for _, t := range spans {
			if err := d.dev.AllReduceSum(s, t, d.scratch); err != nil {
				return fmt.Errorf("engine: %s: %w", name, err)
			}
		}
		return nil
	}, deps...)
	g.Nodes[id].AllReduce = 4 * int64(n)
	return id
}

// spans merges tensors that follow each other in one buffer into F32
// spans, so that a group is summed in as few collectives as its layout
// allows.
func spans(ts []backend.Tensor) []backend.Tensor {
	var out []backend.Tensor
	for _, t := range ts {
		if k := len(out) - 1; k >= 0 && out[k].Buf == t.Buf && out[k].Off+out[k].Len() == t.Off {
			out[k].Shape[0] += t.Len()
			continue
		}
		out = append(out, backend.Tensor{Buf: t.Buf, Off: t.Off, Shape: []int{t.Len()}, DType: t.DType})
	}
	return out
}

// globalTargets sums the step's targets over ranks. The count is exact
// in float32 below 2^24 tokens per step.
func (d *dp) globalTargets(local int) (int, error) {
	if local >= 1<<24 {
		return 0, fmt.Errorf("engine: %d targets in one step: more than float32 counts exactly", local)
	}
	d.one[0] = float32(local)
	if err := d.c.AllReduceSum(d.one); err != nil {
		return 0, fmt.Errorf("engine: summing the step's targets over ranks: %w", err)
	}
	n := int(d.one[0])
	if float32(n) != d.one[0] || n >= 1<<24 {
		return 0, fmt.Errorf("engine: the step's targets over ranks sum to %g: not an exact count", d.one[0])
	}
	return n, nil
}

// globalLoss sums every rank's loss sum, in rank order, in float64: each
// rank's value is gathered bit for bit (two float32 slots per rank).
func (d *dp) globalLoss(local float64) (float64, error) {
	r := d.c.Rank()
	bits := math.Float64bits(local)
	d.loss[2*r] = math.Float32frombits(uint32(bits))
	d.loss[2*r+1] = math.Float32frombits(uint32(bits >> 32))
	if err := d.c.AllGather(d.loss, d.loss[2*r:2*r+2]); err != nil {
		return 0, fmt.Errorf("engine: gathering the ranks' losses: %w", err)
	}
	var sum float64
	for i := 0; i < d.c.Size(); i++ {
		sum += math.Float64frombits(uint64(math.Float32bits(d.loss[2*i])) | uint64(math.Float32bits(d.loss[2*i+1]))<<32)
	}
	return sum, nil
}

// collective adds a host node that all-reduces elems float32 after deps
// and after the previous collective node of the graph (the chain).
func (d *dp) collective(g *Graph, name string, elems int, run func() error, deps ...NodeID) NodeID {
	if d.last >= 0 {
		deps = append(deps, d.last)
	}
	d.last = g.Add(name, Host, func(backend.Stream) error { return run() }, deps...)
	g.Nodes[d.last].AllReduce = 4 * int64(elems)
	return d.last
}

// addFlag adds the agreement on the non-finite flag after its copy down
// (d2hFlag): the ranks' flags summed on the host (non-zero: some rank saw
// a non-finite loss). It starts the graph's chain of collectives and
// returns its node; addFlagUp copies the agreed flag back.
func (e *Engine) addFlag(g *Graph, d2hFlag NodeID) NodeID {
	d := e.dp
	d.last = -1
	const name = "all-reduce non-finite flag"
	return d.collective(g, name, 1, func() error {
		r := []backend.Range{hazard.HostRange(e.flagHost, 0, 4)}
		e.hostAccess(name, r, r)
		if err := d.c.AllReduceSum(e.flagHost.Float32()[:1]); err != nil {
			return err
		}
		return nil
	}, d2hFlag)
}

// addFlagUp copies the agreed flag over the device's, ahead (on the h2d
// stream) of every copy whose update the device applies reading it, and
// so of those updates; the losses come back with it after the step.
func (e *Engine) addFlagUp(g *Graph, flag NodeID) {
	g.Add("h2d non-finite flag", H2D, func(s backend.Stream) error {
		return e.be.CopyH2D(s, e.skipFlag, e.flagHost, 0)
	}, flag)
}

// allReduceHost all-reduces a range of a pinned host buffer of fp32
// (bytes [off, off+4n)).
func (e *Engine) allReduceHost(name string, h backend.HostBuffer, off, n int) error {
	r := []backend.Range{hazard.HostRange(h, off, 4*n)}
	e.hostAccess(name, r, r)
	return e.dp.c.AllReduceSum(h.Float32()[off/4 : off/4+n])
}

// dpGrads is the all-reduce of the gradients a device AdamW updates from
// (native mode's, lsp's with --dense-params device): per group of
// parameters (a block from the last, then the embeddings and head, as
// zero mode groups them), the gradients go down into a pinned fp32 buffer
// once the group's backward is done, are summed over ranks on the host,
// and go back up over the device's before the AdamW reads them.
type dpGrads struct {
	groups []dpGroup
	buf    backend.HostBuffer // fp32, every gradient; nil when summed on the device
}

type dpGroup struct {
	name    string
	layer   int // -1: outside the blocks
	tensors []dpTensor
	spans   []backend.Tensor // the gradients as the device sums them
	off, n  int              // elements of buf
}

type dpTensor struct {
	grad   backend.Tensor
	off, n int
}

func newDPGrads(e *Engine, specs []groupSpec) (*dpGrads, error) {
	groups := make([]gradGroup, len(specs))
	for gi, sp := range specs {
		groups[gi] = gradGroup{name: sp.name, layer: sp.layer}
		for _, i := range sp.params {
			gv, ok := e.Model.GradView(i)
			if !ok {
				return nil, fmt.Errorf("engine: %s has no gradient to all-reduce", e.idx.Layout[i].Name)
			}
			groups[gi].grads = append(groups[gi].grads, gv)
		}
	}
	return newDPGradsOf(e, groups)
}

// gradGroup is the gradients of one group of dpGrads: the model's
// parameters of one block (or outside the blocks), and in lora mode that
// block's adapters.
type gradGroup struct {
	name  string
	layer int
	grads []backend.Tensor
}

// loraGradGroups are lora mode's gradients to all-reduce, by block from
// the last: each block's adapters, with --dense-params device its dense
// parameters too, then those outside the blocks.
func loraGradGroups(e *Engine) []gradGroup {
	var dense []groupSpec
	if e.cfg.DenseParams == DenseDevice {
		dense = groupsDense(e.idx)
	}
	L := len(e.idx.Blocks)
	groups := make([]gradGroup, 0, L+1)
	for l := L - 1; l >= 0; l-- {
		groups = append(groups, gradGroup{name: fmt.Sprintf("layer %d", l), layer: l, grads: e.lora.LayerGrads(l)})
	}
	groups = append(groups, gradGroup{name: "embeddings and head", layer: -1})
	for _, sp := range dense {
		gi := len(groups) - 1 // outside the blocks
		if sp.layer >= 0 {
			gi = L - 1 - sp.layer
		}
		for _, i := range sp.params {
			if gv, ok := e.Model.GradView(i); ok {
				groups[gi].grads = append(groups[gi].grads, gv)
			}
		}
	}
	return groups
}

func newDPGradsOf(e *Engine, groups []gradGroup) (*dpGrads, error) {
	d := &dpGrads{}
	n := 0
	for _, gg := range groups {
		if len(gg.grads) == 0 {
			continue
		}
		grp := dpGroup{name: gg.name, layer: gg.layer, off: n}
		for _, gv := range gg.grads {
			grp.tensors = append(grp.tensors, dpTensor{grad: gv, off: n, n: gv.Len()})
			n += gv.Len()
		}
		grp.n = n - grp.off
		grp.spans = spans(gg.grads)
		d.groups = append(d.groups, grp)
	}
	if e.dp.onDevice() {
		return d, nil
	}
	var err error
	if d.buf, err = e.be.AllocHost("data-parallel gradients", 4*n); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return d, nil
}

func (d *dpGrads) free(be backend.Backend) {
	if d != nil && d.buf != nil {
		be.FreeHost(d.buf)
	}
}

// addGradsDown adds the copies down and the all-reduces of dpGrads and
// returns the all-reduces. Add every copy down and collective before the
// copies up (addGradsUp): the launcher blocks on a host result before it
// enqueues what needs it, and should do so only after all the work that
// overlaps with it.
//
// With a device communicator the groups are summed in place on the device
// instead, and those sums are what the AdamW follows (addGradsUp adds
// nothing).
func (e *Engine) addGradsDown(g *Graph, bwd []NodeID, bwdEmbed NodeID) []NodeID {
	d := e.dpg
	reduced := make([]NodeID, len(d.groups))
	for gi := range d.groups {
		grp := &d.groups[gi]
		done := bwdEmbed
		if grp.layer >= 0 {
			done = bwd[grp.layer]
		}
		if e.dp.onDevice() {
			reduced[gi] = e.deviceSum(g, "all-reduce grads "+grp.name, grp.spans, done)
			continue
		}
		d2h := g.Add("d2h grads "+grp.name, D2H, func(s backend.Stream) error {
			for _, t := range grp.tensors {
				if err := e.be.CopyD2H(s, d.buf, 4*t.off, t.grad); err != nil {
					return err
				}
			}
			return nil
		}, done)
		name := "all-reduce grads " + grp.name
		reduced[gi] = e.dp.collective(g, name, grp.n, func() error {
			return e.allReduceHost(name, d.buf, 4*grp.off, grp.n)
		}, d2h)
	}
	return reduced
}

// addGradsUp adds the copies up of the summed gradients after their
// all-reduces and returns them: the AdamW must follow them.
func (e *Engine) addGradsUp(g *Graph, reduced []NodeID) []NodeID {
	d := e.dpg
	if e.dp.onDevice() {
		return reduced // summed in place
	}
	ups := make([]NodeID, len(d.groups))
	for gi := range d.groups {
		grp := &d.groups[gi]
		ups[gi] = g.Add("h2d grads "+grp.name, H2D, func(s backend.Stream) error {
			for _, t := range grp.tensors {
				if err := e.be.CopyH2D(s, t.grad, d.buf, 4*t.off); err != nil {
					return err
				}
			}
			return nil
		}, reduced[gi])
	}
	return ups
}

// CommStep is what one step of a data-parallel engine all-reduces.
type CommStep struct {
	// Elems is every element the step's collectives all-reduce: the
	// targets' count and the non-finite flag, then S (lsp) or the
	// matrices' gradients (native, zero), and the dense gradients (but
	// with --dense-params frozen). Each all-reduce of n elements sends
	// 2 (ranks-1) n of them over the link, summed over ranks (comm/mpi's
	// reduce-scatter and all-gather).
	Elems int
	// Matrices are one block's matrices with what this mode all-reduces
	// (or, sharded, reduce-scatters) for each per step: d^2 in lsp, m n
	// in native and zero (the same every block).
	Matrices []MatrixComm
	// Sharded is, in zero mode (ZeRO's sharded host optimizer, shard.go),
	// every parameter: its gradient is reduce-scattered (fp32) and its
	// updated weight all-gathered (model dtype) each step instead of
	// all-reduced, so summed over ranks each sends (ranks-1) Sharded
	// elements; Elems is then the targets and the flag alone.
	Sharded int
}

// MatrixComm is one block matrix's share of a step's all-reduce.
type MatrixComm struct {
	Name  string
	M, N  int
	Elems int
}

// CommPerStep is what each step all-reduces (and, in zero mode,
// reduce-scatters and all-gathers); zero alone.
func (e *Engine) CommPerStep() CommStep {
	if e.dp == nil {
		return CommStep{}
	}
	c := CommStep{Elems: 2} // the targets and the flag
	var d []int
	if e.lsp != nil {
		d, _ = lsp.Dims(e.idx, e.lsp.Config)
	}
	for k, mt := range e.idx.Mats {
		m := MatrixComm{Name: mt.Name, M: mt.M, N: mt.N, Elems: mt.M * mt.N}
		switch {
		case d != nil:
			m.Elems = d[k] * d[k]
		case e.lora != nil:
			// The adapters' gradients (every block has the same).
			m.Elems = 0
			for _, s := range e.lora.Sites {
				if s.Layer == 0 && s.K == k {
					m.Elems = e.lora.Cfg.R * (mt.M + mt.N)
				}
			}
		}
		c.Matrices = append(c.Matrices, m)
		c.Elems += len(e.idx.Blocks) * m.Elems
	}
	if e.off != nil && e.off.shard != nil {
		c.Elems, c.Sharded = 2, e.off.n
		return c
	}
	// The dense gradients: every mode all-reduces them but lsp and lora
	// with --dense-params frozen.
	if !e.cfg.Mode.FrozenMatrices() || e.cfg.DenseParams != DenseFrozen {
		for i, p := range e.idx.Layout {
			if !e.idx.IsMat[i] {
				c.Elems += p.Len()
			}
		}
	}
	return c
}

// PlannedDevice is a device communicator of Ranks ranks for planning
// (MemoryOf, a traced step): it has a size and moves nothing (a traced
// step prices its nodes by Node.AllReduce).
type PlannedDevice struct{ Ranks int }

// Rank is 0: a plan is rank 0's.
func (p PlannedDevice) Rank() int { return 0 }

// Size is Ranks.
func (p PlannedDevice) Size() int { return p.Ranks }

// AllReduceSum does nothing.
func (p PlannedDevice) AllReduceSum(backend.Stream, backend.Tensor, backend.Tensor) error { return nil }
