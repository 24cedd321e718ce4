// Package comm is the communicator layer of data-parallel training: the
// collectives that ranks of one job run together (all-reduce, reduce-scatter,
// all-gather, broadcast, barrier) over host buffers, behind one interface,
// with a single-process implementation (Single, world size 1) for a run
// that was not launched by mpirun. The MPI implementation between processes
// is package train/comm/mpi (cgo, build tag mpi); NCCL between GPUs is in
// package cuda (build tag cuda).
//
// # Order of the sums
//
// Every reduction sums in rank order: element i of the result is
// ((x0[i] + x1[i]) + x2[i]) + ..., in float32, where xr is rank r's input,
// on every rank, whatever the timing. A single process that accumulates
// micro-batch 0, 1, 2 in that order (SumInRankOrder) gets the same bits,
// which is what lets a data-parallel run be compared bit for bit with one
// process doing gradient accumulation. The sum starts from x0, not from
// zero: the two differ only in the sign of a zero (0 + -0 is +0).
//
// MPI_Allreduce does not promise an order, so the MPI implementation does
// not use it: each rank owns one shard of the buffer (Shard), receives that
// shard from every rank, sums the copies in rank order and sends the sum to
// every rank.
//
// # Calling the collectives
//
// Every rank must call the same collectives with the same sizes in the
// same order; the MPI implementation checks op, size, root and sequence
// number against every peer and returns an error on a mismatch instead of
// mixing data. A Communicator serialises its calls (one collective at a
// time), so a schedule that runs collectives from several host goroutines
// must still order them the same way on every rank (one chain of nodes).
// After an error (a mismatch, a lost rank) the communicator is broken: every
// later call returns the same error, and the process should exit non-zero
// (mpirun then ends the other ranks).
//
// The check cannot tell two collectives of the same kind and size apart:
// if rank 0 all-reduces matrix A then B and rank 1 B then A, with A and B
// of one shape, the sums mix silently. A schedule must therefore fix the
// order of its collectives, the same on every rank.
//
// # In the schedule graph (train/engine)
//
// On the CPU backend a collective is a blocking call on host memory, so it
// is a host node: in lsp mode, after the copy of a matrix's S to its pinned
// host buffer (a D2H node), a host node calls AllReduceSum on that
// buffer's Float32 view, and the subspace Adam node follows it. The
// collective nodes form one chain (an edge from each to the next, in the
// order of the backward), which fixes their order on every rank and keeps
// two host goroutines from calling the communicator at once in a timing-
// dependent order. On the CUDA backend the NCCL communicator (package
// cuda) enqueues the same collectives on a device stream instead, ordered
// by events like any device op.
package comm

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"
)

// Communicator is a group of ranks that run collectives together. The
// buffers are host memory (a pinned host buffer's Float32 view is fine).
// Each call blocks until this rank's part of the collective is done.
type Communicator interface {
	// Rank is this process's rank, 0 <= Rank < Size.
	Rank() int
	// Size is the number of ranks.
	Size() int

	// AllReduceSum replaces x on every rank by the sum over ranks, in rank
	// order (see the package doc). Every rank passes the same len(x).
	AllReduceSum(x []float32) error
	// ReduceScatterSum writes this rank's shard of the rank-order sum of x
	// into shard: with lo, hi = Shard(len(x), Size(), Rank()), shard (of
	// length hi-lo) gets the sum of x[lo:hi] over ranks. shard must not
	// overlap x. x is left as it was.
	ReduceScatterSum(shard, x []float32) error
	// AllGather is the inverse: every rank passes its shard (of length
	// hi-lo as above) and gets every rank's shard in x, in rank order.
	// shard may be x[lo:hi] itself.
	AllGather(x, shard []float32) error
	// Broadcast copies root's b into b on every other rank. Every rank
	// passes the same len(b). BroadcastFloat32 and BroadcastInt32 view
	// other slices as bytes.
	Broadcast(b []byte, root int) error
	// Barrier returns once every rank has called it.
	Barrier() error

	// Stats counts the calls and bytes so far.
	Stats() Stats
	// Close releases the communicator (MPI_Finalize for MPI); after it
	// no call may be made. A broken communicator is not finalised.
	Close() error
}

// Op names a collective in Stats and errors.
type Op int

// The collectives.
const (
	AllReduce Op = iota
	ReduceScatter
	AllGather
	Broadcast
	Barrier
	NumOps
)

func (o Op) String() string {
	if o < 0 || o >= NumOps {
		return "Op(" + strconv.Itoa(int(o)) + ")"
	}
	return [...]string{"AllReduceSum", "ReduceScatterSum", "AllGather", "Broadcast", "Barrier"}[o]
}

// OpStats counts one collective's calls on this rank and the payload bytes
// this rank sent to and received from other ranks: the data of the
// algorithm the implementation runs, which is what crosses the
// inter-process link (a copy within the rank is not counted). Summed over
// ranks, Sent equals Received.
type OpStats struct {
	Calls, Sent, Received int64
}

// Stats is a communicator's counts per collective, indexed by Op. Control
// is the bytes of the headers that check that ranks agree (not payload).
type Stats struct {
	Ops     [NumOps]OpStats
	Control int64
}

// Sent is the payload bytes this rank sent, over every collective.
func (s Stats) Sent() int64 {
	var n int64
	for _, o := range s.Ops {
		n += o.Sent
	}
	return n
}

// Received is the payload bytes this rank received, over every collective.
func (s Stats) Received() int64 {
	var n int64
	for _, o := range s.Ops {
		n += o.Received
	}
	return n
}

// Sub is s less an earlier snapshot t: the counts of what ran between them
// (a step's bytes, for instance).
func (s Stats) Sub(t Stats) Stats {
	for i := range s.Ops {
		s.Ops[i].Calls -= t.Ops[i].Calls
		s.Ops[i].Sent -= t.Ops[i].Sent
		s.Ops[i].Received -= t.Ops[i].Received
	}
	s.Control -= t.Control
	return s
}

// Shard is the range [lo, hi) of the n elements that rank owns in a
// reduce-scatter or all-gather among size ranks: contiguous, in rank order,
// the first n%size ranks one element longer than the others (a rank owns
// nothing when n < size and rank >= n).
func Shard(n, size, rank int) (lo, hi int) {
	q, r := n/size, n%size
	lo = rank*q + min(rank, r)
	hi = lo + q
	if rank < r {
		hi++
	}
	return lo, hi
}

// ReduceScratch is the number of elements of workspace that a device
// communicator (cuda.NCCL) needs to all-reduce or reduce-scatter n
// elements among size ranks: one shard from every rank, each as long as
// the longest (rank 0's).
func ReduceScratch(n, size int) int {
	lo, hi := Shard(n, size, 0)
	return size * (hi - lo)
}

// SumInRankOrder sets dst[i] = ((parts[0][i] + parts[1][i]) + parts[2][i])
// + ..., in float32: the reduction every Communicator computes, for a single
// process that must get the same bits (gradient accumulation over
// micro-batches in the order of the ranks that would hold them). Every part
// has len(dst) elements; dst may be parts[0] but no later part.
func SumInRankOrder(dst []float32, parts ...[]float32) error {
	if len(parts) == 0 {
		return fmt.Errorf("comm: SumInRankOrder: no parts")
	}
	for r, p := range parts {
		if len(p) != len(dst) {
			return fmt.Errorf("comm: SumInRankOrder: part %d has %d elements, dst %d", r, len(p), len(dst))
		}
		if r > 0 && len(p) > 0 && Overlap(dst, p) {
			return fmt.Errorf("comm: SumInRankOrder: dst overlaps part %d", r)
		}
	}
	copy(dst, parts[0])
	for _, p := range parts[1:] {
		p = p[:len(dst)]
		for i, v := range p {
			dst[i] += v
		}
	}
	return nil
}

// Overlap reports whether two non-empty float32 slices share memory (for
// implementations that must refuse aliased arguments).
func Overlap(a, b []float32) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(&a[0]))
	b0 := uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b))*4 && b0 < a0+uintptr(len(a))*4
}

// BroadcastFloat32 broadcasts x from root through c.Broadcast.
func BroadcastFloat32(c Communicator, x []float32, root int) error {
	if len(x) == 0 {
		return c.Broadcast(nil, root)
	}
	return c.Broadcast(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x)), root)
}

// BroadcastInt32 broadcasts x from root through c.Broadcast (a sparse
// projector's indices, for instance).
func BroadcastInt32(c Communicator, x []int32, root int) error {
	if len(x) == 0 {
		return c.Broadcast(nil, root)
	}
	return c.Broadcast(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x)), root)
}

// WorldEnv is the variable mpirun (Open MPI) sets to the world size in
// every process it launches.
const WorldEnv = "OMPI_COMM_WORLD_SIZE"

// LaunchedByMPI reports whether mpirun launched this process (WorldEnv is
// set), and the world size it says.
func LaunchedByMPI() (size int, ok bool) {
	v, ok := os.LookupEnv(WorldEnv)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, true
	}
	return n, true
}

// CheckArgs checks the arguments of a collective on a communicator of the
// given size and rank, for implementations: root in range, and a shard of
// the right length. n is len(x).
func CheckArgs(op Op, size, rank, n, shard, root int) error {
	switch op {
	case Broadcast:
		if root < 0 || root >= size {
			return fmt.Errorf("comm: %v: root %d out of range [0, %d)", op, root, size)
		}
	case ReduceScatter, AllGather:
		lo, hi := Shard(n, size, rank)
		if shard != hi-lo {
			return fmt.Errorf("comm: %v: rank %d's shard of %d elements among %d ranks has %d elements, got %d",
				op, rank, n, size, hi-lo, shard)
		}
	}
	return nil
}
