//go:build mpi

package mpi

/*
#cgo pkg-config: ompi-c
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// The header every collective exchanges before its data.
typedef struct {
	uint64_t seq;
	uint32_t op;
	int32_t root;
	uint64_t n;
} lspmpi_hdr;

// One message of an exchange: a receive from or a send to peer. A message
// with tag LSPMPI_HDR_TAG is the header (buf unused: sends send *want,
// receives land in a buffer of the exchange).
typedef struct {
	int peer;
	int tag;
	void* buf;
	int bytes;
} lspmpi_msg;

enum { LSPMPI_HDR_TAG = 1 };
enum { LSPMPI_TIMEOUT = -1, LSPMPI_MISMATCH = -2, LSPMPI_SHORT = -3, LSPMPI_LOST = -4 };

static MPI_Comm lspmpi_comm = MPI_COMM_NULL;

// lspmpi_dead[r] is set (by Go, from another thread) once rank r's process
// was seen to end; lspmpi_any_dead once any was. An exchange waiting for a
// message to or from such a rank gives up (LSPMPI_LOST).
static char* lspmpi_dead = NULL;
static int lspmpi_any_dead = 0;

static void lspmpi_mark_dead(int peer) {
	__atomic_store_n(&lspmpi_dead[peer], 1, __ATOMIC_RELAXED);
	__atomic_store_n(&lspmpi_any_dead, 1, __ATOMIC_RELEASE);
}

// lspmpi_load reads a flag that the MPI thread writes (an exchange's done).
static char lspmpi_load(const char* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

// lspmpi_allgather_ids gathers every rank's bytes-long record into all
// (rank r's at r*bytes), at Init.
static int lspmpi_allgather_ids(void* mine, int bytes, void* all) {
	return MPI_Allgather(mine, bytes, MPI_BYTE, all, bytes, MPI_BYTE, lspmpi_comm);
}

static int lspmpi_init(int* rank, int* size, int* provided) {
	int e = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, provided);
	if (e != MPI_SUCCESS) return e;
	// Errors come back as codes on our communicator (MPI_ERRORS_RETURN)
	// instead of aborting the job from inside a call.
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	e = MPI_Comm_dup(MPI_COMM_WORLD, &lspmpi_comm);
	if (e != MPI_SUCCESS) return e;
	MPI_Comm_set_errhandler(lspmpi_comm, MPI_ERRORS_RETURN);
	MPI_Comm_rank(lspmpi_comm, rank);
	MPI_Comm_size(lspmpi_comm, size);
	lspmpi_dead = calloc(*size, 1);
	if (!lspmpi_dead) return MPI_ERR_NO_MEM;
	return MPI_SUCCESS;
}

static int lspmpi_finalize(void) {
	MPI_Comm_free(&lspmpi_comm);
	return MPI_Finalize();
}

static int lspmpi_abort(int code) { return MPI_Abort(MPI_COMM_WORLD, code); }

static void lspmpi_error_string(int e, char* buf) {
	int n = 0;
	if (MPI_Error_string(e, buf, &n) != MPI_SUCCESS) n = 0;
	buf[n] = 0;
}

static double lspmpi_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// lspmpi_exchange posts the nrecv receives msgs[0:nrecv] and the sends
// msgs[nrecv:n], then waits for all of them, polling (MPI_Testsome) so that
// it can give up once timeout seconds pass without any completing. A
// received header is compared with *want when it completes; a received
// message is checked for its full length.
//
// done[i] is set (atomically: Comm.Waiting reads it from another thread)
// when message i completes.
//
// It returns MPI_SUCCESS; LSPMPI_TIMEOUT (done[i] says which completed);
// LSPMPI_LOST (*bad is a pending message whose peer lspmpi_dead marks);
// LSPMPI_MISMATCH (*bad is the message whose header differed, *got that
// header); LSPMPI_SHORT (*bad is the message, *got_bytes its length); or
// an MPI error code (*bad the message, or -1).
//
// On anything but success the requests still pending are left to MPI,
// which may still write into their buffers: the caller keeps them alive.
static int lspmpi_exchange(lspmpi_msg* msgs, int n, int nrecv, const lspmpi_hdr* want, double timeout,
		char* done, int* bad, lspmpi_hdr* got, int* got_bytes) {
	*bad = -1;
	if (n == 0) return MPI_SUCCESS;
	MPI_Request* req = malloc(n * sizeof *req);
	int* idx = malloc(n * sizeof *idx);
	MPI_Status* st = malloc(n * sizeof *st);
	lspmpi_hdr* hin = calloc(n, sizeof *hin); // handed to MPI: freed only on success
	if (!req || !idx || !st || !hin) {
		free(req); free(idx); free(st); free(hin);
		return MPI_ERR_NO_MEM;
	}
	int e = MPI_SUCCESS;
	for (int i = 0; i < n; i++) {
		lspmpi_msg* m = &msgs[i];
		__atomic_store_n(&done[i], 0, __ATOMIC_RELAXED);
		void* buf = m->buf;
		int bytes = m->bytes;
		if (m->tag == LSPMPI_HDR_TAG) {
			buf = i < nrecv ? (void*)&hin[i] : (void*)want;
			bytes = (int)sizeof(lspmpi_hdr);
		}
		if (i < nrecv)
			e = MPI_Irecv(buf, bytes, MPI_BYTE, m->peer, m->tag, lspmpi_comm, &req[i]);
		else
			e = MPI_Isend(buf, bytes, MPI_BYTE, m->peer, m->tag, lspmpi_comm, &req[i]);
		if (e != MPI_SUCCESS) {
			*bad = i;
			goto out;
		}
	}
	int left = n;
	double last = lspmpi_now();
	long spins = 0;
	// A data message in error (short, or longer than its buffer) is
	// reported only once its sender's header has arrived and matched: a
	// peer in another collective is the better message.
	int deferred = -1, deferred_e = MPI_SUCCESS, deferred_hdr = -1;
	while (left > 0) {
		int k = 0;
		e = MPI_Testsome(n, req, &k, idx, st);
		if (e != MPI_SUCCESS && e != MPI_ERR_IN_STATUS) goto out;
		if (k == MPI_UNDEFINED) break;
		// Headers first, then the rest.
		for (int pass = 0; pass < 2; pass++) {
			for (int j = 0; j < k; j++) {
				int i = idx[j];
				int hdr = msgs[i].tag == LSPMPI_HDR_TAG;
				if (hdr != (pass == 0)) continue;
				__atomic_store_n(&done[i], 1, __ATOMIC_RELAXED);
				left--;
				int err = e == MPI_ERR_IN_STATUS ? st[j].MPI_ERROR : MPI_SUCCESS;
				int count = 0;
				if (i < nrecv && err == MPI_SUCCESS) MPI_Get_count(&st[j], MPI_BYTE, &count);
				if (hdr && i < nrecv && err == MPI_SUCCESS &&
						(count != (int)sizeof(lspmpi_hdr) || memcmp(&hin[i], want, sizeof *want) != 0)) {
					*bad = i;
					*got = hin[i];
					*got_bytes = count;
					e = LSPMPI_MISMATCH;
					goto out;
				}
				if (err == MPI_SUCCESS && (i >= nrecv || hdr || count == msgs[i].bytes)) continue;
				if (hdr || i >= nrecv || deferred >= 0) {
					*bad = i;
					e = err;
					goto out;
				}
				deferred = i;
				deferred_e = err == MPI_SUCCESS ? LSPMPI_SHORT : err;
				*got_bytes = count;
				for (int h = 0; h < nrecv; h++)
					if (msgs[h].tag == LSPMPI_HDR_TAG && msgs[h].peer == msgs[i].peer) deferred_hdr = h;
			}
		}
		if (deferred >= 0 && (deferred_hdr < 0 || done[deferred_hdr])) {
			*bad = deferred;
			e = deferred_e;
			goto out;
		}
		e = MPI_SUCCESS;
		if (k > 0) {
			spins = 0;
			last = lspmpi_now();
			continue;
		}
		// Nothing completed. A peer whose process ended will never
		// answer.
		if (__atomic_load_n(&lspmpi_any_dead, __ATOMIC_ACQUIRE)) {
			for (int i = 0; i < n; i++) {
				if (!done[i] && __atomic_load_n(&lspmpi_dead[msgs[i].peer], __ATOMIC_RELAXED)) {
					*bad = i;
					e = LSPMPI_LOST;
					goto out;
				}
			}
		}
		// Spin a little (a peer a few microseconds
		// behind), then give the core away between polls (ranks may
		// share cores), and after 100 ms of nothing, sleep between polls.
		if (++spins < 256) continue;
		double now = lspmpi_now();
		if (now - last > timeout) {
			e = LSPMPI_TIMEOUT;
			if (deferred >= 0) {
				*bad = deferred;
				e = deferred_e;
			}
			goto out;
		}
		if (now - last > 0.1) {
			struct timespec d = {0, 50000};
			nanosleep(&d, NULL);
		} else {
			sched_yield();
		}
	}
	if (deferred >= 0) {
		*bad = deferred;
		e = deferred_e;
		goto out;
	}
	free(req); free(idx); free(st); free(hin);
	return MPI_SUCCESS;
out:
	free(req); free(idx); free(st); // hin may still be written by MPI
	return e;
}
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/train/comm"
)

// Built reports whether this binary has MPI (-tags mpi).
const Built = true

// Message tags: the header, then the data of the first and second phase
// (the all-reduce's reduce-scatter and all-gather). Messages between two
// ranks with one tag arrive in the order they were sent (MPI's
// non-overtaking rule), which keeps consecutive collectives apart.
const (
	tagHeader = C.LSPMPI_HDR_TAG
	tagData   = 2
	tagGather = 3
)

// maxMsg is the largest message in bytes (MPI counts are C ints); longer
// shards go in rounds. A variable so that the tests can make rounds.
var maxMsg = 1 << 30

// Comm is a communicator over MPI_COMM_WORLD (a duplicate of it).
type Comm struct {
	rank, size int
	timeout    time.Duration
	w          *worker

	mu      sync.Mutex // one collective at a time
	seq     uint64
	since   time.Time // when the collective in progress began
	stats   comm.Stats
	broken  error
	closed  bool
	scratch []float32

	// The peers' processes, for the peers on this host (watch is false
	// for the others): a collective that waits for a peer whose process
	// has ended gives up at once (see Lost).
	procs     []peerProc
	lmu       sync.Mutex // guards dead and flight; never held while MPI waits
	dead      []bool     // ranks whose process was seen to end
	flight    *flight    // the exchange in progress; nil between exchanges
	inFlight  atomic.Bool
	stopWatch chan struct{}
}

// peerProc is a rank's process as it said at Init.
type peerProc struct {
	proc
	host  string
	watch bool // on this host, in this pid namespace, and seen at Init
}

// flight is the exchange in progress, for Waiting and the watcher.
type flight struct {
	h     header
	since time.Time
	all   []msg
	done  []C.char // set by the MPI thread as messages complete
}

// kept holds what failed exchanges left with MPI (pinned buffers, and the
// Pinners, which must not be collected while they pin): MPI may still
// write into those buffers, so they are never freed. Package-level, so
// that dropping a broken Comm frees nothing.
var kept struct {
	sync.Mutex
	v []any
}

var (
	initMu   sync.Mutex
	initDone bool
)

// Init returns the communicator of the job mpirun launched, or
// comm.NewSingle() when mpirun did not launch this process. MPI is
// initialised once per process: a second Init under mpirun is an error.
func Init(cfg Config) (comm.Communicator, error) {
	want, ok := comm.LaunchedByMPI()
	if !ok {
		return comm.NewSingle(), nil
	}
	initMu.Lock()
	defer initMu.Unlock()
	if initDone {
		return nil, errors.New("comm/mpi: MPI was already initialised in this process (Init once per process)")
	}
	initDone = true
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("comm/mpi: timeout %v, want >= 0", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	// Open MPI's handlers of SIGSEGV, SIGBUS, SIGFPE and SIGABRT (stack
	// traces) must not replace the Go runtime's, which turns a nil
	// dereference into a panic (and they lack SA_ONSTACK, which Go
	// requires of handlers that non-Go code installs).
	if _, set := os.LookupEnv("OMPI_MCA_opal_signal"); !set {
		os.Setenv("OMPI_MCA_opal_signal", "")
	}
	c := &Comm{timeout: cfg.Timeout}
	self, err := selfProc()
	if err != nil {
		self = proc{pid: os.Getpid()} // no /proc: no peer is watched
	}
	host, _ := os.Hostname()
	mine := encodeID(self, host, pidNamespace())
	var ids []byte
	var w *worker
	w, err = startWorker(func() error {
		var rank, size, provided C.int
		if e := C.lspmpi_init(&rank, &size, &provided); e != C.MPI_SUCCESS {
			return fmt.Errorf("MPI_Init_thread: %s", errorString(e))
		}
		if provided < C.MPI_THREAD_FUNNELED {
			return fmt.Errorf("MPI_Init_thread: thread level %d, want MPI_THREAD_FUNNELED", int(provided))
		}
		c.rank, c.size = int(rank), int(size)
		// Every rank's process: host, pid namespace, pid, start time.
		ids = make([]byte, c.size*idBytes)
		if e := C.lspmpi_allgather_ids(unsafe.Pointer(&mine[0]), C.int(idBytes), unsafe.Pointer(&ids[0])); e != C.MPI_SUCCESS {
			return fmt.Errorf("MPI_Allgather of the ranks' process ids: %s", errorString(e))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("comm/mpi: %w", err)
	}
	c.w = w
	if want > 0 && c.size != want {
		return nil, fmt.Errorf("comm/mpi: MPI says %d ranks, %s says %d", c.size, comm.WorldEnv, want)
	}
	c.procs = peerProcs(ids, c.rank, c.size)
	c.dead = make([]bool, c.size)
	for _, p := range c.procs {
		if p.watch {
			c.stopWatch = make(chan struct{})
			go c.watch(c.stopWatch)
			break
		}
	}
	return c, nil
}

// idBytes is the size of a rank's process record exchanged at Init: pid
// and start time (8 bytes each), pid namespace (64), host name (256).
const idBytes = 8 + 8 + 64 + 256

func encodeID(p proc, host, ns string) []byte {
	b := make([]byte, idBytes)
	binary.LittleEndian.PutUint64(b[0:], uint64(p.pid))
	binary.LittleEndian.PutUint64(b[8:], p.start)
	copy(b[16:16+63], ns)
	copy(b[80:80+255], host)
	return b
}

// peerProcs decodes the records of every rank and marks the peers this
// process can watch: same host name and pid namespace, and a process with
// that pid and start time in its /proc now.
func peerProcs(ids []byte, rank, size int) []peerProc {
	cstr := func(b []byte) string {
		if i := bytes.IndexByte(b, 0); i >= 0 {
			b = b[:i]
		}
		return string(b)
	}
	ps := make([]peerProc, size)
	me := ids[rank*idBytes : (rank+1)*idBytes]
	for r := range ps {
		b := ids[r*idBytes : (r+1)*idBytes]
		p := peerProc{proc: proc{pid: int(binary.LittleEndian.Uint64(b[0:])), start: binary.LittleEndian.Uint64(b[8:])},
			host: cstr(b[80:])}
		ns := cstr(b[16:80])
		if r != rank && p.start != 0 && ns != "" && ns == cstr(me[16:80]) && p.host == cstr(me[80:]) {
			_, start, err := readProc(p.pid)
			p.watch = err == nil && start == p.start
		}
		ps[r] = p
	}
	return ps
}

// watchEvery is how often the watcher looks at the processes of the
// peers an exchange waits for: well inside the second that Open MPI gives
// a process between SIGTERM and SIGKILL when it ends a job
// (odls_base_sigkill_timeout), so that a rank still prints its own error.
const watchEvery = 100 * time.Millisecond

// watch looks, while an exchange waits, whether the watched peers'
// processes still run, until stop is closed.
func (c *Comm) watch(stop chan struct{}) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if c.inFlight.Load() {
			c.checkPeers()
		}
	}
}

// checkPeers marks the watched peers whose processes have ended, for the
// exchange in progress (lspmpi_dead) and for Lost.
func (c *Comm) checkPeers() {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	for r, p := range c.procs {
		if p.watch && !c.dead[r] && p.ended() {
			c.dead[r] = true
			C.lspmpi_mark_dead(C.int(r))
		}
	}
}

// Lost looks now, without MPI and from any goroutine, whether the
// processes of the peers on this host still run, and returns a
// *LostError naming those that ended (during the collective in progress,
// if any, which then fails with the same ranks at once), or nil. A
// process that catches SIGTERM calls it: Open MPI ends a job whose rank
// died with SIGTERM to the others, then SIGKILL a second later; those on
// other hosts it cannot see (a collective waiting for them fails after
// Config.Timeout, if the job lasts that long).
func (c *Comm) Lost() error {
	c.checkPeers()
	c.lmu.Lock()
	defer c.lmu.Unlock()
	var lost []int
	for r, d := range c.dead {
		if d {
			lost = append(lost, r)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	during := ""
	if c.flight != nil {
		during = c.flight.h.String()
	}
	return c.endedError(during, lost)
}

// endedError is the error naming the ranks lost, whose processes ended.
func (c *Comm) endedError(during string, lost []int) *LostError {
	pre := fmt.Sprintf("comm/mpi: rank %d of %d", c.rank, c.size)
	if during != "" {
		pre += ": " + during
	}
	whose := "its process ended"
	if len(lost) > 1 {
		whose = "their processes ended"
	}
	var which []string
	for _, r := range lost {
		w := fmt.Sprintf("pid %d on %s", c.procs[r].pid, c.procs[r].host)
		if len(lost) > 1 {
			w = fmt.Sprintf("rank %d: %s", r, w)
		}
		which = append(which, w)
	}
	return &LostError{Rank: c.rank, Size: c.size, Ranks: lost, During: during, Ended: true,
		msg: fmt.Sprintf("%s: lost %s: %s (%s)", pre, RanksText(lost), whose, strings.Join(which, "; "))}
}

// Waiting says what the collective in progress waits for: false between
// collectives. Any goroutine may call it (a signal handler's, to say
// which rank a stuck job waits for).
func (c *Comm) Waiting() (Wait, bool) {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	f := c.flight
	if f == nil {
		return Wait{}, false
	}
	w := Wait{Op: f.h.String(), For: time.Since(f.since)}
	for i, m := range f.all {
		if C.lspmpi_load(&f.done[i]) == 0 {
			w.Ranks = appendOnce(w.Ranks, m.peer)
		}
	}
	return w, true
}

func errorString(e C.int) string {
	buf := (*C.char)(C.malloc(C.MPI_MAX_ERROR_STRING + 1))
	defer C.free(unsafe.Pointer(buf))
	C.lspmpi_error_string(e, buf)
	return fmt.Sprintf("%s (MPI error %d)", C.GoString(buf), int(e))
}

// Rank implements comm.Communicator.
func (c *Comm) Rank() int { return c.rank }

// Size implements comm.Communicator.
func (c *Comm) Size() int { return c.size }

// Stats implements comm.Communicator.
func (c *Comm) Stats() comm.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// SetTimeout changes Config.Timeout for the collectives that follow (a
// longer one around work that rank 0 does alone, for instance).
func (c *Comm) SetTimeout(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.timeout = d
	}
}

// Abort ends every process of the job (MPI_Abort) with the exit code; it
// returns only if MPI could not do it. Call it when no collective is
// running (after one returned an error, for instance): it runs on the MPI
// thread, after the call in progress there.
func (c *Comm) Abort(code int) error {
	var e C.int
	if err := c.w.do(func() error { e = C.lspmpi_abort(C.int(code)); return nil }); err != nil {
		return fmt.Errorf("comm/mpi: MPI_Abort: %w", err)
	}
	return fmt.Errorf("comm/mpi: MPI_Abort: %s", errorString(e))
}

// Close implements comm.Communicator: MPI_Finalize, unless the
// communicator is broken (a peer may never get there, and MPI_Finalize
// would wait for it); then it returns the error that broke it.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.stopWatch != nil {
		close(c.stopWatch)
	}
	if c.broken != nil {
		c.w.stop()
		return c.broken
	}
	err := c.w.do(func() error {
		if e := C.lspmpi_finalize(); e != C.MPI_SUCCESS {
			return fmt.Errorf("comm/mpi: MPI_Finalize: %s", errorString(e))
		}
		return nil
	})
	c.w.stop()
	return err
}

// header is what every rank must agree on for a collective.
type header struct {
	seq  uint64
	op   comm.Op
	root int
	n    int
}

func (h header) String() string {
	s := fmt.Sprintf("%v #%d of %d", h.op, h.seq, h.n)
	switch h.op {
	case comm.Broadcast:
		s += " bytes from root " + fmt.Sprint(h.root)
	case comm.Barrier:
		s = fmt.Sprintf("%v #%d", h.op, h.seq)
	default:
		s += " elements"
	}
	return s
}

// begin starts a collective: it checks the communicator and numbers the
// call. The caller holds c.mu.
func (c *Comm) begin(op comm.Op, n, shard, root int) (header, error) {
	if c.closed {
		return header{}, fmt.Errorf("comm/mpi: %v: communicator is closed", op)
	}
	if c.broken != nil {
		return header{}, c.broken
	}
	if err := comm.CheckArgs(op, c.size, c.rank, n, shard, root); err != nil {
		return header{}, err
	}
	c.seq++
	c.since = time.Now()
	c.stats.Ops[op].Calls++
	return header{seq: c.seq, op: op, root: root, n: n}, nil
}

// msg is one message of an exchange; buf nil with tag tagHeader is the
// header.
type msg struct {
	peer, tag int
	buf       []byte
}

func f32bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

// exchange runs one round of messages and waits for all of them (see
// lspmpi_exchange). On failure the communicator is broken. The caller
// holds c.mu.
func (c *Comm) exchange(h header, recvs, sends []msg) error {
	all := append(append(make([]msg, 0, len(recvs)+len(sends)), recvs...), sends...)
	n := len(all)
	if n == 0 {
		return nil
	}
	cm := unsafe.Slice((*C.lspmpi_msg)(C.calloc(C.size_t(n), C.sizeof_lspmpi_msg)), n)
	done := unsafe.Slice((*C.char)(C.calloc(C.size_t(n), 1)), n)
	want := (*C.lspmpi_hdr)(C.calloc(1, C.sizeof_lspmpi_hdr))
	var pin runtime.Pinner
	for i, m := range all {
		cm[i].peer = C.int(m.peer)
		cm[i].tag = C.int(m.tag)
		if len(m.buf) > 0 {
			pin.Pin(&m.buf[0])
			cm[i].buf = unsafe.Pointer(&m.buf[0])
			cm[i].bytes = C.int(len(m.buf))
		}
		if m.tag == tagHeader {
			c.stats.Control += int64(C.sizeof_lspmpi_hdr)
		}
	}
	want.seq = C.uint64_t(h.seq)
	want.op = C.uint32_t(h.op)
	want.root = C.int32_t(h.root)
	want.n = C.uint64_t(h.n)
	var bad, gotBytes C.int
	var got C.lspmpi_hdr
	var e C.int
	timeout := c.timeout
	c.lmu.Lock()
	c.flight = &flight{h: h, since: c.since, all: all, done: done}
	c.lmu.Unlock()
	c.inFlight.Store(true)
	err := c.w.do(func() error {
		e = C.lspmpi_exchange(&cm[0], C.int(n), C.int(len(recvs)), want, C.double(timeout.Seconds()),
			&done[0], &bad, &got, &gotBytes)
		return nil
	})
	c.inFlight.Store(false)
	c.lmu.Lock()
	c.flight = nil // before done is freed: Waiting reads it
	c.lmu.Unlock()
	if err != nil {
		return err
	}
	if e == C.MPI_SUCCESS {
		pin.Unpin()
		C.free(unsafe.Pointer(&cm[0]))
		C.free(unsafe.Pointer(&done[0]))
		C.free(unsafe.Pointer(want))
		return nil
	}
	// MPI may still read or write the pending messages' buffers (and the
	// header it sends from want): keep them pinned and alive for good.
	kept.Lock()
	kept.v = append(kept.v, &pin, all)
	kept.Unlock()
	err = c.failure(h, e, all, len(recvs), done, int(bad), got, int(gotBytes))
	C.free(unsafe.Pointer(&cm[0]))
	C.free(unsafe.Pointer(&done[0]))
	c.broken = err
	return err
}

// failure describes why an exchange failed.
func (c *Comm) failure(h header, e C.int, all []msg, nrecv int, done []C.char, bad int, got C.lspmpi_hdr, gotBytes int) error {
	pre := fmt.Sprintf("comm/mpi: rank %d of %d: %v", c.rank, c.size, h)
	switch e {
	case C.LSPMPI_LOST:
		var lost []int
		c.lmu.Lock()
		for i, m := range all {
			if done[i] == 0 && c.dead[m.peer] {
				lost = appendOnce(lost, m.peer)
			}
		}
		c.lmu.Unlock()
		return c.endedError(h.String(), lost)
	case C.LSPMPI_TIMEOUT:
		var silent, stuck []int
		for i, m := range all {
			if done[i] != 0 {
				continue
			}
			if i < nrecv {
				silent = appendOnce(silent, m.peer)
			} else {
				stuck = appendOnce(stuck, m.peer)
			}
		}
		lost := silent
		for _, p := range stuck {
			lost = appendOnce(lost, p)
		}
		var why []string
		if len(silent) > 0 {
			why = append(why, "nothing received from "+RanksText(silent))
		}
		if len(stuck) > 0 {
			why = append(why, "nothing taken by "+RanksText(stuck))
		}
		return &LostError{Rank: c.rank, Size: c.size, Ranks: lost, During: h.String(), msg: fmt.Sprintf("%s: lost %s: %s for %v (dead, stalled, or in another part of the program)",
			pre, RanksText(lost), strings.Join(why, "; "), c.timeout)}
	case C.LSPMPI_MISMATCH:
		peer := all[bad].peer
		if gotBytes != int(C.sizeof_lspmpi_hdr) {
			return fmt.Errorf("%s: rank %d sent a header of %d bytes, want %d", pre, peer, gotBytes, int(C.sizeof_lspmpi_hdr))
		}
		theirs := header{seq: uint64(got.seq), op: comm.Op(got.op), root: int(got.root), n: int(got.n)}
		return fmt.Errorf("%s: rank %d is in %v: every rank must call the same collectives with the same sizes in the same order", pre, peer, theirs)
	case C.LSPMPI_SHORT:
		return fmt.Errorf("%s: rank %d sent %d bytes, want %d", pre, all[bad].peer, gotBytes, len(all[bad].buf))
	}
	if bad >= 0 {
		dir := "sending to"
		if bad < nrecv {
			dir = "receiving from"
		}
		return fmt.Errorf("%s: %s rank %d: %s", pre, dir, all[bad].peer, errorString(e))
	}
	return fmt.Errorf("%s: %s", pre, errorString(e))
}

func appendOnce(s []int, v int) []int {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// headers are the header messages to and from every peer in peers.
func (c *Comm) headers(peers []int) (recvs, sends []msg) {
	for _, p := range peers {
		recvs = append(recvs, msg{peer: p, tag: tagHeader})
		sends = append(sends, msg{peer: p, tag: tagHeader})
	}
	return recvs, sends
}

func (c *Comm) peers() []int {
	ps := make([]int, 0, c.size-1)
	for p := 0; p < c.size; p++ {
		if p != c.rank {
			ps = append(ps, p)
		}
	}
	return ps
}

// piece is rank r's shard of n elements cut to round k: the range
// [lo, hi) of x that goes in that round (empty once the shard is done).
func piece(n, size, r, k, per int) (lo, hi int) {
	slo, shi := comm.Shard(n, size, r)
	lo = min(slo+k*per, shi)
	hi = min(lo+per, shi)
	return lo, hi
}

// rounds is how many rounds shards of n elements among size ranks need
// with per elements a message.
func rounds(n, size, per int) int {
	_, hi := comm.Shard(n, size, 0) // rank 0's shard is the longest
	return max(1, (hi+per-1)/per)
}

// AllReduceSum implements comm.Communicator: a reduce-scatter whose sums
// stay in x, then an all-gather of them.
func (c *Comm) AllReduceSum(x []float32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.begin(comm.AllReduce, len(x), 0, 0)
	if err != nil || c.size == 1 {
		return err // one rank: x is the sum
	}
	per := maxMsg / 4
	st := &c.stats.Ops[comm.AllReduce]
	for k := 0; k < rounds(len(x), c.size, per); k++ {
		lo, hi := piece(len(x), c.size, c.rank, k, per)
		if err := c.scatterSum(h, k == 0, x[lo:hi], x, k, per, st); err != nil {
			return err
		}
		if err := c.gather(h, false, x, k, per, tagGather, st); err != nil {
			return err
		}
	}
	return nil
}

// ReduceScatterSum implements comm.Communicator.
func (c *Comm) ReduceScatterSum(shard, x []float32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if comm.Overlap(shard, x) {
		return fmt.Errorf("comm/mpi: %v: shard overlaps x", comm.ReduceScatter)
	}
	h, err := c.begin(comm.ReduceScatter, len(x), len(shard), 0)
	if err != nil {
		return err
	}
	per := maxMsg / 4
	st := &c.stats.Ops[comm.ReduceScatter]
	slo, _ := comm.Shard(len(x), c.size, c.rank)
	for k := 0; k < rounds(len(x), c.size, per); k++ {
		lo, hi := piece(len(x), c.size, c.rank, k, per)
		if err := c.scatterSum(h, k == 0, shard[lo-slo:hi-slo], x, k, per, st); err != nil {
			return err
		}
	}
	return nil
}

// scatterSum runs round k of a reduce-scatter: it sends every peer its
// piece of x, receives this rank's piece from every peer and writes their
// sum in rank order into dst (this rank's piece of x may be dst: it is
// copied first).
func (c *Comm) scatterSum(h header, withHeader bool, dst, x []float32, k, per int, st *comm.OpStats) error {
	var recvs, sends []msg
	if withHeader {
		recvs, sends = c.headers(c.peers())
	}
	m := len(dst)
	if cap(c.scratch) < c.size*m {
		c.scratch = make([]float32, c.size*m)
	}
	parts := make([][]float32, c.size)
	for r := range parts {
		parts[r] = c.scratch[r*m : (r+1)*m]
	}
	lo, hi := piece(len(x), c.size, c.rank, k, per)
	copy(parts[c.rank], x[lo:hi])
	for _, p := range c.peers() {
		if m > 0 {
			recvs = append(recvs, msg{peer: p, tag: tagData, buf: f32bytes(parts[p])})
			st.Received += 4 * int64(m)
		}
		plo, phi := piece(len(x), c.size, p, k, per)
		if phi > plo {
			sends = append(sends, msg{peer: p, tag: tagData, buf: f32bytes(x[plo:phi])})
			st.Sent += 4 * int64(phi-plo)
		}
	}
	if err := c.exchange(h, recvs, sends); err != nil {
		return err
	}
	return comm.SumInRankOrder(dst, parts...)
}

// gather runs round k of an all-gather: this rank's piece of x to every
// peer, every peer's piece into x.
func (c *Comm) gather(h header, withHeader bool, x []float32, k, per, tag int, st *comm.OpStats) error {
	var recvs, sends []msg
	if withHeader {
		recvs, sends = c.headers(c.peers())
	}
	lo, hi := piece(len(x), c.size, c.rank, k, per)
	for _, p := range c.peers() {
		plo, phi := piece(len(x), c.size, p, k, per)
		if phi > plo {
			recvs = append(recvs, msg{peer: p, tag: tag, buf: f32bytes(x[plo:phi])})
			st.Received += 4 * int64(phi-plo)
		}
		if hi > lo {
			sends = append(sends, msg{peer: p, tag: tag, buf: f32bytes(x[lo:hi])})
			st.Sent += 4 * int64(hi-lo)
		}
	}
	return c.exchange(h, recvs, sends)
}

// AllGather implements comm.Communicator.
func (c *Comm) AllGather(x, shard []float32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.begin(comm.AllGather, len(x), len(shard), 0)
	if err != nil {
		return err
	}
	lo, _ := comm.Shard(len(x), c.size, c.rank)
	copy(x[lo:], shard) // copy handles shard == x[lo:hi]
	per := maxMsg / 4
	st := &c.stats.Ops[comm.AllGather]
	for k := 0; k < rounds(len(x), c.size, per); k++ {
		if err := c.gather(h, k == 0, x, k, per, tagData, st); err != nil {
			return err
		}
	}
	return nil
}

// Broadcast implements comm.Communicator: root sends b to every other rank
// (the bytes counted are those of this flat broadcast).
func (c *Comm) Broadcast(b []byte, root int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.begin(comm.Broadcast, len(b), 0, root)
	if err != nil {
		return err
	}
	st := &c.stats.Ops[comm.Broadcast]
	peers := []int{root}
	if c.rank == root {
		peers = c.peers()
	}
	for k, lo := 0, 0; k == 0 || lo < len(b); k, lo = k+1, lo+maxMsg {
		var recvs, sends []msg
		if k == 0 && c.size > 1 {
			recvs, sends = c.headers(peers)
		}
		if hi := min(lo+maxMsg, len(b)); hi > lo {
			for _, p := range peers {
				if c.rank == root {
					sends = append(sends, msg{peer: p, tag: tagData, buf: b[lo:hi]})
					st.Sent += int64(hi - lo)
				} else {
					recvs = append(recvs, msg{peer: p, tag: tagData, buf: b[lo:hi]})
					st.Received += int64(hi - lo)
				}
			}
		}
		if c.size == 1 {
			break
		}
		if err := c.exchange(h, recvs, sends); err != nil {
			return err
		}
	}
	return nil
}

// Barrier implements comm.Communicator: a header from every rank to every
// other.
func (c *Comm) Barrier() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.begin(comm.Barrier, 0, 0, 0)
	if err != nil {
		return err
	}
	recvs, sends := c.headers(c.peers())
	return c.exchange(h, recvs, sends)
}

// worker is the goroutine, locked to its OS thread, that makes every MPI
// call (MPI_THREAD_FUNNELED: the thread of MPI_Init_thread).
type worker struct {
	calls   chan func()
	mu      sync.Mutex
	stopped bool
}

func startWorker(init func() error) (*worker, error) {
	w := &worker{calls: make(chan func())}
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine.
		runtime.LockOSThread()
		if err := init(); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range w.calls {
			f()
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return w, nil
}

func (w *worker) do(f func() error) error {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return errors.New("the MPI thread has stopped (communicator closed)")
	}
	done := make(chan error, 1)
	w.calls <- func() { done <- f() }
	w.mu.Unlock()
	return <-done
}

func (w *worker) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		close(w.calls)
	}
}
