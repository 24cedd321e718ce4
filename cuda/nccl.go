//go:build cuda || cudasim

// NCCL: the communicator between the GPUs of the ranks of a job, one GPU a
// rank (each rank's Backend). NCCL is not in Debian, so the build has only
// its header (third_party/nccl/nccl.h, for the prototypes) and loads
// libnccl.so.2 when a communicator is made (dlopen): a binary built with
// -tags cuda starts, and trains on one GPU, where NCCL is not installed.
//
// A cudasim build binds the simulated NCCL instead (kernels/sim/nccl.cpp,
// compiled into this package with the simulated runtime; no dlopen): the
// same Go code below runs, its sends and receives queued on the simulated
// streams and carried between the ranks' processes over local sockets, so
// every CI run tests it (cuda/nccltest). What the simulation leaves out:
// NCCL's own collectives, ranks on several hosts, and NCCL's speed (see the
// header comment of nccl.cpp).
//
// The collectives are enqueued on a stream of the backend, ordered by its
// events like any other op, and run on the device thread. The sums are in
// rank order, bit for bit those of the MPI communicator and of
// comm.SumInRankOrder: NCCL's own all-reduce sums in the order of its ring
// or tree, so it is not used; instead grouped ncclSend/ncclRecv bring
// every rank its shard of every rank's tensor, the backend's Accumulate
// sums them in rank order (a plain float32 add on the device), and
// grouped sends and receives hand the sums to every rank. The unique id
// that joins the ranks goes from rank 0 to the others through the host
// communicator's Broadcast (MPI).

package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../third_party/nccl
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nccl.h"

// The entry points, typed by the header's prototypes.
static __typeof__(ncclGetVersion)* lspnccl_get_version;
static __typeof__(ncclGetUniqueId)* lspnccl_get_unique_id;
static __typeof__(ncclCommInitRank)* lspnccl_comm_init_rank;
static __typeof__(ncclCommDestroy)* lspnccl_comm_destroy;
static __typeof__(ncclCommAbort)* lspnccl_comm_abort;
static __typeof__(ncclCommGetAsyncError)* lspnccl_comm_get_async_error;
static __typeof__(ncclGetErrorString)* lspnccl_get_error_string;
static __typeof__(ncclSend)* lspnccl_send;
static __typeof__(ncclRecv)* lspnccl_recv;
static __typeof__(ncclBroadcast)* lspnccl_broadcast;
static __typeof__(ncclGroupStart)* lspnccl_group_start;
static __typeof__(ncclGroupEnd)* lspnccl_group_end;

static char lspnccl_err[512];

#ifdef LSP_CUDASIM
// The simulated NCCL is linked in (kernels/sim/nccl.cpp): name only names it.
static const char* lspnccl_load(const char* name) {
	(void)name;
	lspnccl_get_version = ncclGetVersion;
	lspnccl_get_unique_id = ncclGetUniqueId;
	lspnccl_comm_init_rank = ncclCommInitRank;
	lspnccl_comm_destroy = ncclCommDestroy;
	lspnccl_comm_abort = ncclCommAbort;
	lspnccl_comm_get_async_error = ncclCommGetAsyncError;
	lspnccl_get_error_string = ncclGetErrorString;
	lspnccl_send = ncclSend;
	lspnccl_recv = ncclRecv;
	lspnccl_broadcast = ncclBroadcast;
	lspnccl_group_start = ncclGroupStart;
	lspnccl_group_end = ncclGroupEnd;
	return NULL;
}
#else
// lspnccl_load opens name and finds every entry point; it returns NULL, or
// what failed.
static const char* lspnccl_load(const char* name) {
	void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char* e = dlerror();
		snprintf(lspnccl_err, sizeof lspnccl_err, "dlopen %s: %s", name, e ? e : "failed");
		return lspnccl_err;
	}
#define LSPNCCL_SYM(var, sym) \
	do { \
		*(void**)(&var) = dlsym(h, #sym); \
		if (!var) { \
			snprintf(lspnccl_err, sizeof lspnccl_err, "%s has no %s", name, #sym); \
			return lspnccl_err; \
		} \
	} while (0)
	LSPNCCL_SYM(lspnccl_get_version, ncclGetVersion);
	LSPNCCL_SYM(lspnccl_get_unique_id, ncclGetUniqueId);
	LSPNCCL_SYM(lspnccl_comm_init_rank, ncclCommInitRank);
	LSPNCCL_SYM(lspnccl_comm_destroy, ncclCommDestroy);
	LSPNCCL_SYM(lspnccl_comm_abort, ncclCommAbort);
	LSPNCCL_SYM(lspnccl_comm_get_async_error, ncclCommGetAsyncError);
	LSPNCCL_SYM(lspnccl_get_error_string, ncclGetErrorString);
	LSPNCCL_SYM(lspnccl_send, ncclSend);
	LSPNCCL_SYM(lspnccl_recv, ncclRecv);
	LSPNCCL_SYM(lspnccl_broadcast, ncclBroadcast);
	LSPNCCL_SYM(lspnccl_group_start, ncclGroupStart);
	LSPNCCL_SYM(lspnccl_group_end, ncclGroupEnd);
#undef LSPNCCL_SYM
	return NULL;
}
#endif

static int lspnccl_version(int* v) { return (int)lspnccl_get_version(v); }

static const char* lspnccl_error_string(int r) { return lspnccl_get_error_string((ncclResult_t)r); }

static int lspnccl_unique_id(void* id) { return (int)lspnccl_get_unique_id((ncclUniqueId*)id); }

static int lspnccl_init_rank(uintptr_t* comm, int size, const void* id, int rank) {
	ncclComm_t c = NULL;
	ncclUniqueId u;
	memcpy(&u, id, sizeof u);
	int r = (int)lspnccl_comm_init_rank(&c, size, u, rank);
	*comm = (uintptr_t)c;
	return r;
}

static int lspnccl_destroy(uintptr_t comm) { return (int)lspnccl_comm_destroy((ncclComm_t)comm); }
static int lspnccl_abort(uintptr_t comm) { return (int)lspnccl_comm_abort((ncclComm_t)comm); }

static int lspnccl_async_error(uintptr_t comm, int* e) {
	ncclResult_t a = ncclSuccess;
	int r = (int)lspnccl_comm_get_async_error((ncclComm_t)comm, &a);
	*e = (int)a;
	return r;
}

// One point-to-point transfer of a group: a send (recv 0) or a receive of
// count float32 to or from peer.
typedef struct {
	uintptr_t ptr;
	size_t count;
	int peer;
	int recv;
} lspnccl_p2p;

// lspnccl_exchange enqueues the transfers on stream as one group (NCCL
// runs a group's sends and receives together, so the order within it
// cannot deadlock).
static int lspnccl_exchange(uintptr_t comm, const lspnccl_p2p* t, int n, uintptr_t stream) {
	int r = (int)lspnccl_group_start();
	if (r != ncclSuccess) return r;
	for (int i = 0; i < n; i++) {
		if (t[i].recv)
			r = (int)lspnccl_recv((void*)t[i].ptr, t[i].count, ncclFloat32, t[i].peer, (ncclComm_t)comm, (cudaStream_t)stream);
		else
			r = (int)lspnccl_send((const void*)t[i].ptr, t[i].count, ncclFloat32, t[i].peer, (ncclComm_t)comm, (cudaStream_t)stream);
		if (r != ncclSuccess) {
			lspnccl_group_end();
			return r;
		}
	}
	return (int)lspnccl_group_end();
}

static int lspnccl_bcast(uintptr_t comm, uintptr_t p, size_t bytes, int root, uintptr_t stream) {
	return (int)lspnccl_broadcast((const void*)p, (void*)p, bytes, ncclUint8, root, (ncclComm_t)comm, (cudaStream_t)stream);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
)

var nccl struct {
	once    sync.Once
	err     error
	version int
}

// LoadNCCL loads NCCLLibrary once per process and returns its version
// code (NCCL_VERSION_CODE: 23007 is 2.30.7), or why it cannot be used:
// absent, lacking an entry point, or older than 2.7 (no send and receive).
// In a cudasim build it binds the simulated NCCL, which reports the
// header's version, and does not fail.
func LoadNCCL() (int, error) {
	nccl.once.Do(func() {
		name := C.CString(NCCLLibrary)
		defer C.free(unsafe.Pointer(name))
		if msg := C.lspnccl_load(name); msg != nil {
			nccl.err = fmt.Errorf("cuda: NCCL: %s", C.GoString(msg))
			return
		}
		var v C.int
		if r := C.lspnccl_version(&v); r != 0 {
			nccl.err = fmt.Errorf("cuda: NCCL: ncclGetVersion: %s", ncclError(r))
			return
		}
		nccl.version = int(v)
		// 2.7.0 is 2700 in NCCL's old code (X*1000+Y*100+Z up to 2.8),
		// and every later code is larger.
		if nccl.version < 2700 {
			nccl.err = fmt.Errorf("cuda: NCCL: %s is version code %d, older than 2.7 (no ncclSend/ncclRecv)", NCCLLibrary, nccl.version)
		}
	})
	return nccl.version, nccl.err
}

func ncclError(r C.int) string {
	msg := fmt.Sprintf("%s (ncclResult_t %d)", C.GoString(C.lspnccl_error_string(r)), int(r))
	if d := ncclDetail(); d != "" {
		msg += ": " + d
	}
	return msg
}

// NCCL is a communicator of NCCL among the GPUs of the ranks of a host
// communicator, one GPU (this backend's device) a rank, with the same rank
// numbers. Its methods enqueue work on a stream of the backend and, like
// the backend's ops, are called from the device goroutine; every rank must
// enqueue the same collectives with the same sizes in the same order.
type NCCL struct {
	b          *Backend
	h          uintptr // ncclComm_t
	rank, size int

	mu     sync.Mutex
	stats  comm.Stats
	closed bool
}

// NewNCCL joins the ranks of c in an NCCL communicator over this backend's
// device: rank 0 makes NCCL's unique id, c.Broadcast hands it to the
// others, and every rank calls ncclCommInitRank (which waits for all of
// them). Every rank of c must call it.
func (b *Backend) NewNCCL(c comm.Communicator) (*NCCL, error) {
	if err := b.onDevice("NewNCCL"); err != nil {
		return nil, err
	}
	if err := b.open("new NCCL communicator"); err != nil {
		return nil, err
	}
	// Every rank learns whether all of them could load NCCL (and rank 0
	// make the id) before any of them waits in ncclCommInitRank for
	// ranks that will not come.
	_, lerr := LoadNCCL()
	id := make([]byte, C.NCCL_UNIQUE_ID_BYTES)
	if c.Rank() == 0 && lerr == nil {
		if r := C.lspnccl_unique_id(unsafe.Pointer(&id[0])); r != 0 {
			lerr = fmt.Errorf("cuda: NCCL: ncclGetUniqueId: %s", ncclError(r))
		}
	}
	failed := []float32{0}
	if lerr != nil {
		failed[0] = 1
	}
	if err := c.AllReduceSum(failed); err != nil {
		return nil, fmt.Errorf("cuda: NCCL: agreeing to start: %w", err)
	}
	if lerr != nil {
		return nil, lerr
	}
	if failed[0] != 0 {
		return nil, fmt.Errorf("cuda: NCCL: %v of %d ranks could not start NCCL (see their errors)", failed[0], c.Size())
	}
	if err := c.Broadcast(id, 0); err != nil {
		return nil, fmt.Errorf("cuda: NCCL: broadcasting the unique id: %w", err)
	}
	n := &NCCL{b: b, rank: c.Rank(), size: c.Size()}
	var r C.int
	var h C.uintptr_t
	if err := b.w.do(func() error {
		r = C.lspnccl_init_rank(&h, C.int(n.size), unsafe.Pointer(&id[0]), C.int(n.rank))
		return nil
	}); err != nil {
		return nil, fmt.Errorf("cuda: NCCL: %w", err)
	}
	if r != 0 {
		return nil, fmt.Errorf("cuda: NCCL: ncclCommInitRank (rank %d of %d): %s", n.rank, n.size, ncclError(r))
	}
	n.h = uintptr(h)
	return n, nil
}

// Rank is this rank.
func (n *NCCL) Rank() int { return n.rank }

// Size is the number of ranks.
func (n *NCCL) Size() int { return n.size }

// Stats counts the collectives enqueued and the payload bytes this rank
// sends and receives (as comm.OpStats; a broadcast is counted as root
// sending to every rank, which over all ranks is what NCCL's ring moves).
func (n *NCCL) Stats() comm.Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// ncclArg is a tensor argument of a collective, with the name its errors
// give it.
type ncclArg struct {
	name string
	t    backend.Tensor
}

// begin checks that op may start: on the device goroutine, before Close,
// and each of args an F32 tensor of this backend.
func (n *NCCL) begin(op comm.Op, args ...ncclArg) error {
	if err := n.b.onDevice("NCCL " + op.String()); err != nil {
		return err
	}
	if n.closed {
		return fmt.Errorf("cuda: NCCL %v: communicator is closed", op)
	}
	for _, a := range args {
		if err := n.f32(op, a.name, a.t); err != nil {
			return err
		}
	}
	return nil
}

// f32 checks that t is an F32 tensor of this backend.
func (n *NCCL) f32(op comm.Op, name string, t backend.Tensor) error {
	if err := n.b.views.Tensor(fmt.Sprintf("NCCL %v %s", op, name), t); err != nil {
		return err
	}
	if t.DType != backend.F32 {
		return fmt.Errorf("cuda: NCCL %v: %s has dtype %v, want F32", op, name, t.DType)
	}
	return nil
}

type p2p = C.lspnccl_p2p

// exchange enqueues one group of transfers on s.
func (n *NCCL) exchange(op comm.Op, s backend.Stream, ts []p2p) error {
	if len(ts) == 0 {
		return nil
	}
	st, err := n.b.stream(s)
	if err != nil {
		return err
	}
	// The array goes to C, which reads it during the call only.
	cts := (*p2p)(C.calloc(C.size_t(len(ts)), C.sizeof_lspnccl_p2p))
	defer C.free(unsafe.Pointer(cts))
	copy(unsafe.Slice(cts, len(ts)), ts)
	if err := n.call(func() C.int {
		return C.lspnccl_exchange(C.uintptr_t(n.h), cts, C.int(len(ts)), C.uintptr_t(st.h))
	}); err != nil {
		return fmt.Errorf("cuda: NCCL %v on stream %s: %w", op, st.name, err)
	}
	return nil
}

// call runs f, a call of the NCCL shim, on the device thread. Its error,
// if the call fails to run or NCCL returns one, is wrapped by the caller,
// so that a collective that succeeds formats nothing.
func (n *NCCL) call(f func() C.int) error {
	var r C.int
	if err := n.b.w.do(func() error { r = f(); return nil }); err != nil {
		return err
	}
	if r != 0 {
		return errors.New(ncclError(r))
	}
	return nil
}

func (n *NCCL) addr(t backend.Tensor) C.uintptr_t { return C.uintptr_t(n.b.ptr(t)) }

// scatterSum enqueues the reduce-scatter of t: every peer's shard of t to
// it, this rank's shard from every peer into scratch, and the sum in rank
// order into dst (this rank's shard of t may be dst: it is copied into
// scratch first).
func (n *NCCL) scatterSum(op comm.Op, s backend.Stream, dst, t, scratch backend.Tensor) error {
	L := t.Len()
	lo, hi := comm.Shard(L, n.size, n.rank)
	m := hi - lo
	part := func(r int) backend.Tensor { return scratch.Slice(r*m, m) }
	var ts []p2p
	st := &n.stats.Ops[op]
	for p := 0; p < n.size; p++ {
		if p == n.rank {
			continue
		}
		plo, phi := comm.Shard(L, n.size, p)
		if phi > plo {
			ts = append(ts, p2p{ptr: n.addr(t.Slice(plo, phi-plo)), count: C.size_t(phi - plo), peer: C.int(p)})
			st.Sent += 4 * int64(phi-plo)
		}
		if m > 0 {
			ts = append(ts, p2p{ptr: n.addr(part(p)), count: C.size_t(m), peer: C.int(p), recv: 1})
			st.Received += 4 * int64(m)
		}
	}
	if m == 0 {
		return n.exchange(op, s, ts)
	}
	if err := n.b.CopyD2D(s, part(n.rank), t.Slice(lo, m)); err != nil {
		return err
	}
	if err := n.exchange(op, s, ts); err != nil {
		return err
	}
	if err := n.b.CopyD2D(s, dst, part(0)); err != nil {
		return err
	}
	for r := 1; r < n.size; r++ {
		if err := n.b.Accumulate(s, dst, part(r)); err != nil {
			return err
		}
	}
	return nil
}

// gather enqueues the all-gather of this rank's shard of t (already in
// place) to every peer and of every peer's shard into t.
func (n *NCCL) gather(op comm.Op, s backend.Stream, t backend.Tensor) error {
	L := t.Len()
	lo, hi := comm.Shard(L, n.size, n.rank)
	var ts []p2p
	st := &n.stats.Ops[op]
	for p := 0; p < n.size; p++ {
		if p == n.rank {
			continue
		}
		if hi > lo {
			ts = append(ts, p2p{ptr: n.addr(t.Slice(lo, hi-lo)), count: C.size_t(hi - lo), peer: C.int(p)})
			st.Sent += 4 * int64(hi-lo)
		}
		plo, phi := comm.Shard(L, n.size, p)
		if phi > plo {
			ts = append(ts, p2p{ptr: n.addr(t.Slice(plo, phi-plo)), count: C.size_t(phi - plo), peer: C.int(p), recv: 1})
			st.Received += 4 * int64(phi-plo)
		}
	}
	return n.exchange(op, s, ts)
}

func (n *NCCL) checkScratch(op comm.Op, t, scratch backend.Tensor) error {
	if err := n.f32(op, "scratch", scratch); err != nil {
		return err
	}
	if need := comm.ReduceScratch(t.Len(), n.size); scratch.Len() < need {
		return fmt.Errorf("cuda: NCCL %v: scratch has %d elements, want comm.ReduceScratch(%d, %d) = %d", op, scratch.Len(), t.Len(), n.size, need)
	}
	if scratch.Range().Overlaps(t.Range()) {
		return fmt.Errorf("cuda: NCCL %v: scratch overlaps the tensor", op)
	}
	return nil
}

// AllReduceSum enqueues on s the sum over ranks of the F32 tensor t, in
// rank order, into t on every rank; scratch holds comm.ReduceScratch(t.Len(),
// Size()) F32 elements (overwritten) and does not overlap t.
func (n *NCCL) AllReduceSum(s backend.Stream, t, scratch backend.Tensor) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	op := comm.AllReduce
	if err := n.begin(op, ncclArg{"t", t}); err != nil {
		return err
	}
	if err := n.checkScratch(op, t, scratch); err != nil {
		return err
	}
	n.stats.Ops[op].Calls++
	if n.size == 1 {
		return nil // the sum over one rank
	}
	lo, hi := comm.Shard(t.Len(), n.size, n.rank)
	if err := n.scatterSum(op, s, t.Slice(lo, hi-lo), t, scratch); err != nil {
		return err
	}
	return n.gather(op, s, t)
}

// ReduceScatterSum enqueues on s this rank's shard of the rank-order sum
// of the F32 tensor t into shard (comm.Shard's range of t; shard does not
// overlap t or scratch); scratch as for AllReduceSum.
func (n *NCCL) ReduceScatterSum(s backend.Stream, shard, t, scratch backend.Tensor) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	op := comm.ReduceScatter
	if err := n.begin(op, ncclArg{"shard", shard}, ncclArg{"t", t}); err != nil {
		return err
	}
	if err := comm.CheckArgs(op, n.size, n.rank, t.Len(), shard.Len(), 0); err != nil {
		return err
	}
	if err := n.checkScratch(op, t, scratch); err != nil {
		return err
	}
	if shard.Range().Overlaps(t.Range()) || shard.Range().Overlaps(scratch.Range()) {
		return fmt.Errorf("cuda: NCCL %v: shard overlaps t or scratch", op)
	}
	n.stats.Ops[op].Calls++
	return n.scatterSum(op, s, shard, t, scratch)
}

// AllGather enqueues on s the gather of every rank's shard (comm.Shard's
// range of t) into the F32 tensor t; shard may be that range of t itself.
func (n *NCCL) AllGather(s backend.Stream, t, shard backend.Tensor) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	op := comm.AllGather
	if err := n.begin(op, ncclArg{"t", t}, ncclArg{"shard", shard}); err != nil {
		return err
	}
	if err := comm.CheckArgs(op, n.size, n.rank, t.Len(), shard.Len(), 0); err != nil {
		return err
	}
	n.stats.Ops[op].Calls++
	lo, hi := comm.Shard(t.Len(), n.size, n.rank)
	own := t.Slice(lo, hi-lo)
	if hi > lo && (shard.Buf != own.Buf || shard.Off != own.Off) {
		if shard.Range().Overlaps(own.Range()) {
			return fmt.Errorf("cuda: NCCL %v: shard overlaps this rank's range of t without being it", op)
		}
		if err := n.b.CopyD2D(s, own, shard); err != nil {
			return err
		}
	}
	return n.gather(op, s, t)
}

// Broadcast enqueues on s the copy of root's t (any dtype, as bytes) into
// t on every other rank.
func (n *NCCL) Broadcast(s backend.Stream, t backend.Tensor, root int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	op := comm.Broadcast
	if err := n.begin(op); err != nil {
		return err
	}
	if err := n.b.views.Tensor("NCCL Broadcast t", t); err != nil {
		return err
	}
	if err := comm.CheckArgs(op, n.size, n.rank, 0, 0, root); err != nil {
		return err
	}
	st, err := n.b.stream(s)
	if err != nil {
		return err
	}
	n.stats.Ops[op].Calls++
	bytes := t.Bytes()
	if bytes == 0 || n.size == 1 {
		return nil // every rank has the same length, so every rank skips
	}
	if n.rank == root {
		n.stats.Ops[op].Sent += int64(n.size-1) * bytes
	} else {
		n.stats.Ops[op].Received += bytes
	}
	if err := n.call(func() C.int {
		return C.lspnccl_bcast(C.uintptr_t(n.h), n.addr(t), C.size_t(bytes), C.int(root), C.uintptr_t(st.h))
	}); err != nil {
		return fmt.Errorf("cuda: NCCL %v on stream %s: %w", op, st.name, err)
	}
	return nil
}

// Err is NCCL's asynchronous error of the communicator (a peer lost, a
// network failure), nil while there is none. On a GPU a wait on a stream
// with NCCL work from a lost peer does not end by itself: a watchdog polls
// Err and calls Abort. The simulated NCCL (cudasim) ends it: the lost peer's
// closed connection, or LSP_CUDASIM_NCCL_TIMEOUT without progress, fails
// the operation, which becomes Err and the device's sticky error.
func (n *NCCL) Err() error {
	var a C.int
	var r C.int
	if err := n.b.w.do(func() error { r = C.lspnccl_async_error(C.uintptr_t(n.h), &a); return nil }); err != nil {
		return err
	}
	if r != 0 {
		return fmt.Errorf("cuda: NCCL: ncclCommGetAsyncError: %s", ncclError(r))
	}
	if a != 0 {
		return fmt.Errorf("cuda: NCCL: %s", ncclError(a))
	}
	return nil
}

// Abort ends the communicator without waiting for its peers
// (ncclCommAbort): the work it has enqueued ends with an error.
func (n *NCCL) Abort() error { return n.end("ncclCommAbort", true) }

// Close destroys the communicator (ncclCommDestroy) once the work it has
// enqueued is done.
func (n *NCCL) Close() error { return n.end("ncclCommDestroy", false) }

func (n *NCCL) end(what string, abort bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	if err := n.call(func() C.int {
		if abort {
			return C.lspnccl_abort(C.uintptr_t(n.h))
		}
		return C.lspnccl_destroy(C.uintptr_t(n.h))
	}); err != nil {
		return fmt.Errorf("cuda: NCCL: %s: %w", what, err)
	}
	return nil
}
