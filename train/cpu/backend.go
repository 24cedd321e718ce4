// Package cpu is the CPU implementation of the Backend contract
// (train/backend): the readable, deterministic reference that the CUDA
// kernels are tested against, and a way to train with no GPU at all.
//
// Each stream is a goroutine running its ops in order. Device memory is
// ordinary host memory accounted against a byte budget with a high-water
// mark. Device-host copies can be charged at a link bandwidth and latency so
// that overlap shows in step times. A test mode adds seeded random delays to
// every op and checks every declared access for hazards (see hazard.go).
//
// Results never depend on the number of threads: every reduction runs in a
// fixed order, and parallel loops split work so that each output element is
// computed by exactly one iteration.
//
// Files: backend.go (set-up, memory, host buffers), stream.go (streams and
// events; op, which checks every op's call against the op table and
// enqueues it with the table's declared accesses), hazard.go (the test
// mode's checks), ops.go, ops_sparse.go and ops_fit.go (the compute ops:
// dtype conversions around the references), parallel.go (their parallel
// loops), and one ref_<family>.go per kernels/<family>.cu holding the CPU
// reference of each of that file's launchers, under the launcher's name,
// which the ops run and the kernel tests compare with (some run package
// host's C, for speed, and say why; ref_dense.go holds its ops' Backend
// methods too, as an op added since the op table does). Tests of a
// reference are in ref_<family>_test.go.
package cpu

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// Config sets up a CPU backend. The zero value is a plain, unlimited backend.
type Config struct {
	// MemBudget is the device memory budget in bytes (0: unlimited).
	MemBudget int64
	// LinkBandwidth in bytes/s and LinkLatency charge every device-host
	// copy (0: copies are free).
	LinkBandwidth float64
	LinkLatency   time.Duration
	// Threads used by compute ops (0: runtime.NumCPU()).
	Threads int
	// HazardCheck declares and checks every access; hazards become errors
	// at Synchronize and are listed by Hazards.
	HazardCheck bool
	// MaxDelay > 0 sleeps a seeded random time in [0, MaxDelay) before every
	// op, to shake out missing synchronisation.
	MaxDelay time.Duration
	Seed     uint64
	// KernelDTypes refuses, when an op is enqueued, the storage types the
	// CUDA kernels do not take (backend.CheckDTypes), as the CUDA backend
	// does: a schedule that runs here in this mode has the dtypes to run
	// on the GPU.
	KernelDTypes bool
}

// Backend is the CPU backend. It implements backend.Backend.
type Backend struct {
	cfg     Config
	threads int

	mu         sync.Mutex // guards the fields below
	nextID     int
	inUse      int64
	highWater  int64
	live       map[int]*buffer
	streams    []*stream // live streams, the default first
	nextStream int       // stream ids handed out (hazard actors)
	h2d, d2h   int64
	hostAllocs int64

	failed  backend.StickyError // first async error: sticky, as in CUDA
	haz     *hazards            // nil unless cfg.HazardCheck
	owner   uint64              // the device goroutine (hazard mode only)
	dflt    *stream
	staging *backend.Staging
	views   backend.ViewCheck // checks the tensors the calls are given
	closed  bool
}

var _ backend.Backend = (*Backend)(nil)

// New starts a CPU backend.
func New(cfg Config) *Backend {
	b := &Backend{cfg: cfg, threads: cfg.Threads, live: map[int]*buffer{}}
	if b.threads <= 0 {
		b.threads = runtime.NumCPU()
	} else {
		// The matrix multiply's pool is process-wide; results do not depend
		// on its size, only speed does.
		host.SetThreads(b.threads)
	}
	if cfg.HazardCheck {
		b.haz = newHazards()
		b.owner = hazard.GoroutineID()
	}
	b.views = backend.ViewCheck{Prefix: "cpu", Kind: "CPU", Buffer: b.bufferState}
	b.dflt = b.newStream("default")
	b.staging = backend.NewStaging(b, backend.StagingBytes)
	return b
}

// Staging implements backend.Backend.
func (b *Backend) Staging() *backend.Staging { return b.staging }

// Name implements backend.Backend.
func (b *Backend) Name() string { return "cpu" }

// Threads is the number of threads compute ops use.
func (b *Backend) Threads() int { return b.threads }

// buffer is a device allocation: 64-byte aligned host memory.
type buffer struct {
	owner *Backend // ops refuse buffers of other backends
	id    int
	name  string
	raw   []byte // owns the memory; data is an aligned window of it
	data  []byte
}

func (u *buffer) ID() int        { return u.id }
func (u *buffer) Name() string   { return u.name }
func (u *buffer) Bytes() int64   { return int64(len(u.data)) }
func (u *buffer) String() string { return u.name }

func alignedBytes(n int) (raw, data []byte) {
	raw = make([]byte, n+64)
	off := int((64 - uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%64) % 64)
	return raw, raw[off : off+n : off+n]
}

// Alloc implements backend.Backend: a zeroed buffer charged to the budget.
func (b *Backend) Alloc(name string, n int, dt backend.DType) (backend.Tensor, error) {
	if err := b.onDevice(); err != nil {
		return backend.Tensor{}, err
	}
	if n < 0 || dt.Size() == 0 {
		return backend.Tensor{}, fmt.Errorf("cpu: alloc %s: bad size %d or dtype %v", name, n, dt)
	}
	bytes := int64(n) * int64(dt.Size())
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cfg.MemBudget > 0 && b.inUse+bytes > b.cfg.MemBudget {
		return backend.Tensor{}, &OutOfMemoryError{Name: name, Need: bytes, InUse: b.inUse, Budget: b.cfg.MemBudget}
	}
	b.nextID++
	u := &buffer{owner: b, id: b.nextID, name: name}
	u.raw, u.data = alignedBytes(int(bytes))
	b.live[u.id] = u
	b.inUse += bytes
	b.highWater = max(b.highWater, b.inUse)
	return backend.Tensor{Buf: u, Shape: []int{n}, DType: dt}, nil
}

// OutOfMemoryError says which allocation did not fit in the budget.
type OutOfMemoryError struct {
	Name                string
	Need, InUse, Budget int64
}

func (e *OutOfMemoryError) Error() string {
	return fmt.Sprintf("cpu: device memory budget exceeded allocating %s: need %d bytes, %d in use, budget %d bytes",
		e.Name, e.Need, e.InUse, e.Budget)
}

// Free implements backend.Backend. Freeing a buffer that ops still use is
// the caller's error, as in CUDA: synchronize first.
func (b *Backend) Free(t backend.Tensor) {
	_ = b.onDevice() // kept: reported at the next Synchronize
	u, ok := t.Buf.(*buffer)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.live[u.id] == u { // not a buffer of another backend that shares the id
		delete(b.live, u.id)
		b.inUse -= int64(len(u.data))
	}
}

// MemStats implements backend.Backend.
func (b *Backend) MemStats() backend.MemStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.MemStats{InUse: b.inUse, HighWater: b.highWater, Budget: b.cfg.MemBudget}
}

// Traffic implements backend.Backend.
func (b *Backend) Traffic() backend.Traffic {
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.Traffic{H2D: b.h2d, D2H: b.d2h}
}

// hostBuffer is pinned host memory; on the CPU backend it is just aligned
// memory, with a negative id so its ranges never collide with device ones.
type hostBuffer struct {
	id   int
	name string
	raw  []byte
	backend.HostBytes
}

func (h *hostBuffer) ID() int { return h.id }

// AllocHost implements backend.Backend.
func (b *Backend) AllocHost(name string, bytes int) (backend.HostBuffer, error) {
	if err := b.onDevice(); err != nil {
		return nil, err
	}
	if bytes < 0 {
		return nil, fmt.Errorf("cpu: host alloc %s: negative size %d", name, bytes)
	}
	b.mu.Lock()
	b.hostAllocs++
	b.nextID++
	id := -b.nextID
	b.mu.Unlock()
	h := &hostBuffer{id: id, name: name}
	h.raw, h.HostBytes = alignedBytes(bytes)
	return h, nil
}

// FreeHost implements backend.Backend.
func (b *Backend) FreeHost(h backend.HostBuffer) {
	_ = b.onDevice() // kept: reported at the next Synchronize
}

// HostAllocs counts the AllocHost calls so far, the staging buffer's
// included: pinning memory is costly on a GPU, and a step should do none.
func (b *Backend) HostAllocs() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hostAllocs
}

// ThreadViolations lists the calls made off the device goroutine so far
// (hazard mode only), each an error naming the method.
func (b *Backend) ThreadViolations() []error {
	if b.haz == nil {
		return nil
	}
	return b.haz.violations()
}

// Hazards lists the hazards found so far (test mode only).
func (b *Backend) Hazards() []Hazard {
	if b.haz == nil {
		return nil
	}
	return b.haz.Hazards()
}

// HostAccess declares that host code is about to read and write the given
// ranges of pinned host memory, so that hazard mode checks that the device
// work touching them is ordered before (by Synchronize or EventSynchronize).
func (b *Backend) HostAccess(name string, reads, writes []backend.Range) {
	if b.haz != nil {
		b.haz.Access(hazard.Host, name, reads, writes)
	}
}

// HostSnapshot and HostJoin tell hazard mode where goroutines hand work
// to each other (the pipelined schedule's host nodes), which it cannot
// see: see hazard.Checker.Snapshot. Without hazard mode they do nothing.
func (b *Backend) HostSnapshot() hazard.Clock {
	if b.haz == nil {
		return hazard.Clock{}
	}
	return b.haz.Snapshot()
}

// HostJoin: see HostSnapshot.
func (b *Backend) HostJoin(c hazard.Clock) {
	if b.haz != nil {
		b.haz.Join(c)
	}
}

// Close implements backend.Backend: it returns once every stream's
// goroutine has ended.
func (b *Backend) Close() error {
	if err := b.onDevice(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return b.failed.Err()
	}
	b.closed = true
	streams := append([]*stream(nil), b.streams...)
	b.mu.Unlock()
	var errs []error
	for _, s := range streams {
		errs = append(errs, s.sync())
		s.stop()
		<-s.exited
	}
	b.staging.Free()
	b.mu.Lock()
	b.live = map[int]*buffer{}
	b.inUse = 0
	b.mu.Unlock()
	return errors.Join(append(errs, b.failed.Err())...)
}

// delay sleeps the test-mode random delay of one op.
func (s *stream) delay() {
	if s.b.cfg.MaxDelay > 0 {
		time.Sleep(time.Duration(s.rng.Int64N(int64(s.b.cfg.MaxDelay))))
	}
}

func newRNG(seed uint64, id int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(id)*0x9e3779b97f4a7c15+1))
}
