//go:build cuda || cudasim

// The Backend: opening a device, its arena and the buffers carved from it,
// pinned host buffers, sticky errors, the goroutine check and Close. The
// streams and events are in stream.go, the ops in ops.go.

package cuda

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// Config opens a CUDA backend. The zero value is device 0 with an arena of
// its free memory.
type Config struct {
	Device int // the ordinal: --device cuda:N
	// MemBudget is the --device-mem budget in bytes: the arena is this
	// much (and a little slack for alignment) and Alloc refuses what would
	// exceed it, as the CPU backend does. 0: the arena is the device's
	// free memory less backend.DeviceHeadroom (at most 512 MiB on the
	// simulated runtime, whose device memory is real memory).
	MemBudget int64
	// CheckGoroutine refuses, as the CPU backend's hazard mode does, the
	// calls only the device goroutine (the one that called New) may make
	// when another goroutine makes them, naming the method; violations are
	// also reported by the next Synchronize.
	CheckGoroutine bool
}

// arenaSlack is added to a budget's arena so that 256-byte alignment never
// makes a plan that fits the budget fail in the arena (4096 buffers' worth).
const arenaSlack = 1 << 20

// Backend is the CUDA backend. It implements backend.Backend.
type Backend struct {
	backend.OpsFunc // the ops: each checked and launched by op (ops.go)

	cfg  Config
	info DeviceInfo
	w    *worker

	base   devPtr // the arena's device memory
	budget int64  // what Alloc accounts against (MemStats.Budget)
	// freeAtOpen and totalAtOpen: see MemAtOpen.
	freeAtOpen, totalAtOpen int64

	mu         sync.Mutex // guards the fields below
	arena      *arena
	nextID     int
	inUse      int64
	highWater  int64
	live       map[int]*buffer
	hosts      map[int]*hostBuffer
	streams    map[*stream]struct{} // live, the default and the internal one included
	events     map[*event]struct{}  // live
	h2d, d2h   int64
	hostAllocs int64
	violations []error // calls off the device goroutine (CheckGoroutine)
	closed     bool

	failed backend.StickyError // the first async error: sticky, as in CUDA

	owner    uint64  // the device goroutine (CheckGoroutine only)
	dflt     *stream // DefaultStream
	internal *stream // zeroes new buffers; never handed out
	staging  *backend.Staging
	views    backend.ViewCheck // checks the tensors the calls are given
}

var _ backend.Backend = (*Backend)(nil)

// Devices lists the CUDA devices of this machine. The error wraps
// ErrNoDevice when there are none.
func Devices() ([]DeviceInfo, error) { return devices() }

// Simulated says whether this build runs on the simulated CUDA runtime
// (-tags cudasim), whose one device is every process's own.
func Simulated() bool { return simulated }

// New opens device cfg.Device: it refuses a device older than sm_80,
// starts the device thread, reserves the arena (an *OutOfMemoryError when
// the device lacks the memory) and creates the default stream.
func New(cfg Config) (*Backend, error) {
	devs, err := devices()
	if err != nil {
		return nil, err
	}
	info, err := pick(devs, cfg.Device)
	if err != nil {
		return nil, err
	}
	if cfg.MemBudget < 0 {
		return nil, fmt.Errorf("cuda: negative memory budget %d", cfg.MemBudget)
	}
	w, err := startWorker(cfg.Device)
	if err != nil {
		return nil, err
	}
	b := &Backend{cfg: cfg, info: info, w: w, live: map[int]*buffer{}, hosts: map[int]*hostBuffer{},
		streams: map[*stream]struct{}{}, events: map[*event]struct{}{}}
	b.OpsFunc = b.op
	b.views = backend.ViewCheck{Prefix: "cuda", Kind: "CUDA", Buffer: b.bufferState}
	if cfg.CheckGoroutine {
		b.owner = hazard.GoroutineID()
	}
	if err := b.start(); err != nil {
		b.release()
		w.stop()
		return nil, err
	}
	b.staging = backend.NewStaging(b, backend.StagingBytes)
	return b, nil
}

// start reserves the arena and creates the backend's two streams.
func (b *Backend) start() error {
	err := b.w.do(func() error {
		free, total, err := rtMemGetInfo()
		if err != nil {
			return fmt.Errorf("cuda: %s: %w", b.info, err)
		}
		b.freeAtOpen, b.totalAtOpen = free, total
		size, hint := b.cfg.MemBudget+arenaSlack, "lower --device-mem"
		if b.cfg.MemBudget == 0 {
			size = min(free-backend.DeviceHeadroom(free), maxDefaultArena)
			hint = fmt.Sprintf("with no --device-mem the arena takes the free memory less %d bytes for CUDA itself; is another process using the device?", backend.DeviceHeadroom(free))
		}
		size &^= arenaAlign - 1
		oom := &OutOfMemoryError{Device: b.info.String(), What: "the device arena", Asked: size, Free: free,
			Where: fmt.Sprintf("on the device (of %d bytes)", total), Hint: hint}
		if size <= 0 {
			return oom
		}
		p, err := rtMalloc(size)
		if err != nil {
			if codeOf(err) == codeOOM {
				oom.Hint += " (" + err.Error() + ")"
				return oom
			}
			return fmt.Errorf("cuda: %s: reserving the arena of %d bytes: %w", b.info, size, err)
		}
		b.base, b.arena = p, newArena(size)
		b.budget = b.cfg.MemBudget
		if b.budget == 0 {
			b.budget = size
		}
		return nil
	})
	if err != nil {
		return err
	}
	if b.dflt, err = b.newStream("default"); err != nil {
		return err
	}
	b.internal, err = b.newStream("internal")
	return err
}

// MemAtOpen is the device's free and total memory as cudaMemGetInfo
// reported them when the backend opened: after CUDA created its context,
// before the arena. On an otherwise idle device total - free is the
// context's size (the driver's state and the loaded kernels), the figure
// the memory plan assumes (train/plan's GPU.Context); another process on
// the device adds its own.
func (b *Backend) MemAtOpen() (free, total int64) { return b.freeAtOpen, b.totalAtOpen }

// Name implements backend.Backend: "cuda:N".
func (b *Backend) Name() string { return "cuda:" + strconv.Itoa(b.info.Ordinal) }

// Device describes the device the backend runs on.
func (b *Backend) Device() DeviceInfo { return b.info }

// Staging implements backend.Backend.
func (b *Backend) Staging() *backend.Staging { return b.staging }

// buffer is a block of the arena.
type buffer struct {
	owner *Backend
	id    int
	name  string
	off   int64 // in the arena
	bytes int64
}

func (u *buffer) ID() int        { return u.id }
func (u *buffer) Name() string   { return u.name }
func (u *buffer) Bytes() int64   { return u.bytes }
func (u *buffer) String() string { return u.name }

// ptr is the device address of the view t of a buffer (checked by
// b.views), or 0 for an absent tensor.
func (b *Backend) ptr(t backend.Tensor) kernels.Ptr {
	u, ok := t.Buf.(*buffer)
	if !ok || u == nil {
		return 0
	}
	return kernels.Ptr(uintptr(b.base) + uintptr(u.off) + uintptr(t.Off*t.DType.Size()))
}

// Alloc implements backend.Backend: a zeroed block of the arena, charged to
// the budget.
func (b *Backend) Alloc(name string, n int, dt backend.DType) (backend.Tensor, error) {
	if err := b.onDevice("Alloc"); err != nil {
		return backend.Tensor{}, err
	}
	if n < 0 || dt.Size() == 0 {
		return backend.Tensor{}, fmt.Errorf("cuda: alloc %s: bad size %d or dtype %v", name, n, dt)
	}
	bytes := int64(n) * int64(dt.Size())
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.Tensor{}, fmt.Errorf("cuda: alloc %s: backend is closed", name)
	}
	if b.inUse+bytes > b.budget {
		b.mu.Unlock()
		return backend.Tensor{}, &OutOfMemoryError{Device: b.info.String(), What: name, Asked: bytes, Free: b.budget - b.inUse,
			Where: fmt.Sprintf("in the budget of %d bytes (%d in use)", b.budget, b.inUse), Hint: "raise --device-mem or plan for less"}
	}
	off, ok := b.arena.alloc(bytes)
	if !ok {
		free, largest := b.arena.freeBytes()
		b.mu.Unlock()
		return backend.Tensor{}, &OutOfMemoryError{Device: b.info.String(), What: name, Asked: bytes, Free: free,
			Where: fmt.Sprintf("in the device arena of %d bytes (the largest free block is %d bytes)", b.arena.size, largest)}
	}
	b.nextID++
	u := &buffer{owner: b, id: b.nextID, name: name, off: off, bytes: bytes}
	b.live[u.id] = u
	b.inUse += bytes
	b.highWater = max(b.highWater, b.inUse)
	b.mu.Unlock()
	t := backend.Tensor{Buf: u, Shape: []int{n}, DType: dt}
	if bytes == 0 {
		return t, nil
	}
	err := b.w.do(func() error {
		if err := rtMemsetAsync(devPtr(b.ptr(t)), 0, bytes, b.internal.h); err != nil {
			return err
		}
		return rtStreamSynchronize(b.internal.h)
	})
	if err != nil {
		b.Free(t)
		err = fmt.Errorf("cuda: alloc %s: zeroing %d bytes: %w", name, bytes, err)
		b.failed.Set(err)
		return backend.Tensor{}, err
	}
	return t, nil
}

// Free implements backend.Backend: the block goes back to the arena at
// once. Freeing a buffer that queued work still uses is the caller's error,
// as in CUDA: synchronize first.
func (b *Backend) Free(t backend.Tensor) {
	_ = b.onDevice("Free") // kept: reported at the next Synchronize
	u, ok := t.Buf.(*buffer)
	if !ok || u == nil || u.owner != b {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.live[u.id] == u && !b.closed {
		delete(b.live, u.id)
		b.inUse -= u.bytes
		b.arena.release(u.off, u.bytes)
	}
}

// MemStats implements backend.Backend. Budget is the --device-mem budget,
// or the arena's size when there is none.
func (b *Backend) MemStats() backend.MemStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.MemStats{InUse: b.inUse, HighWater: b.highWater, Budget: b.budget}
}

// Traffic implements backend.Backend: the bytes of the copies enqueued so
// far (CUDA does not tell when each has run).
func (b *Backend) Traffic() backend.Traffic {
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.Traffic{H2D: b.h2d, D2H: b.d2h}
}

// hostBuffer is pinned host memory from cudaHostAlloc; its id is negative
// so that its ranges never collide with a device buffer's.
type hostBuffer struct {
	owner *Backend
	id    int
	name  string
	p     unsafe.Pointer
	backend.HostBytes
}

func (h *hostBuffer) ID() int { return h.id }

// AllocHost implements backend.Backend: pinned, portable host memory
// (cudaHostAlloc), zeroed.
func (b *Backend) AllocHost(name string, bytes int) (backend.HostBuffer, error) {
	if err := b.onDevice("AllocHost"); err != nil {
		return nil, err
	}
	if bytes < 0 {
		return nil, fmt.Errorf("cuda: host alloc %s: negative size %d", name, bytes)
	}
	if err := b.open("host alloc " + name); err != nil {
		return nil, err
	}
	h := &hostBuffer{owner: b, name: name}
	if bytes > 0 {
		err := b.w.do(func() (err error) {
			h.p, err = rtHostAlloc(bytes)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: host alloc %s of %d bytes: %w", name, bytes, err)
		}
		h.HostBytes = unsafe.Slice((*byte)(h.p), bytes)
		clear(h.HostBytes)
	}
	b.mu.Lock()
	b.hostAllocs++
	b.nextID++
	h.id = -b.nextID
	b.hosts[h.id] = h
	b.mu.Unlock()
	return h, nil
}

// FreeHost implements backend.Backend (cudaFreeHost, which waits for the
// device). nil is ignored; a buffer that is not a live one of this backend
// (freed twice, another backend's) is reported by the next Synchronize.
func (b *Backend) FreeHost(hb backend.HostBuffer) {
	_ = b.onDevice("FreeHost")
	if hb == nil {
		return
	}
	h, ok := hb.(*hostBuffer)
	b.mu.Lock()
	live := ok && h != nil && b.hosts[h.id] == h
	if live {
		delete(b.hosts, h.id)
	}
	closed := b.closed
	b.mu.Unlock()
	switch {
	case closed:
		return // Close freed it
	case !live:
		b.failed.Set(fmt.Errorf("cuda: FreeHost of %T that is not a live host buffer of this backend", hb))
		return
	}
	if h.p != nil {
		if err := b.w.do(func() error { return rtFreeHost(h.p) }); err != nil {
			b.failed.Set(fmt.Errorf("cuda: free host %s: %w", h.name, err))
		}
	}
	h.HostBytes = nil
}

// HostAllocs counts the AllocHost calls so far, the staging buffer's
// included.
func (b *Backend) HostAllocs() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hostAllocs
}

// hostBuf checks that hb is a live host buffer of this backend.
func (b *Backend) hostBuf(what string, hb backend.HostBuffer) (*hostBuffer, error) {
	h, ok := hb.(*hostBuffer)
	if !ok || h == nil {
		return nil, fmt.Errorf("cuda: %s: host buffer %T is not a CUDA host buffer", what, hb)
	}
	b.mu.Lock()
	live := b.hosts[h.id] == h
	b.mu.Unlock()
	if h.owner != b || !live {
		return nil, fmt.Errorf("cuda: %s: host buffer %s is not a live host buffer of this backend", what, h.name)
	}
	return h, nil
}

// open fails after Close.
func (b *Backend) open(what string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("cuda: %s: backend is closed", what)
	}
	return nil
}

// Close implements backend.Backend: it synchronizes every stream, then
// releases the events, streams, host buffers and the arena, and ends the
// device thread. Later calls fail; Close again returns the first error.
func (b *Backend) Close() error {
	if err := b.onDevice("Close"); err != nil {
		return err
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return b.failed.Err()
	}
	b.staging.Free()
	b.mu.Lock()
	streams := make([]*stream, 0, len(b.streams))
	for s := range b.streams {
		streams = append(streams, s)
	}
	b.mu.Unlock()
	for _, s := range streams {
		if err := b.w.do(func() error { return rtStreamSynchronize(s.h) }); err != nil {
			b.failed.Set(fmt.Errorf("cuda: close: stream %s: %w", s.name, err))
		}
	}
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	rel := b.release()
	b.w.stop()
	if err := b.failed.Err(); err != nil {
		return err
	}
	return rel
}

// release frees whatever New and the caller left: events, host buffers,
// streams and the arena (on the device thread, which must still run).
func (b *Backend) release() error {
	b.mu.Lock()
	var events []*event
	for e := range b.events {
		events = append(events, e)
	}
	var hosts []*hostBuffer
	for _, h := range b.hosts {
		hosts = append(hosts, h)
	}
	var streams []*stream
	for s := range b.streams {
		streams = append(streams, s)
	}
	clear(b.events)
	clear(b.hosts)
	clear(b.streams)
	clear(b.live)
	b.inUse = 0
	b.mu.Unlock()
	var errs []error
	for _, e := range events {
		e.use.Lock() // no host wait is left on it
		e.destroyed = true
		e.use.Unlock()
		errs = append(errs, b.w.do(func() error { return rtEventDestroy(e.h) }))
	}
	for _, h := range hosts {
		if h.p != nil {
			errs = append(errs, b.w.do(func() error { return rtFreeHost(h.p) }))
		}
		h.HostBytes = nil
	}
	for _, s := range streams {
		errs = append(errs, b.w.do(func() error { return rtStreamDestroy(s.h) }))
	}
	if b.base != 0 {
		errs = append(errs, b.w.do(func() error { return rtFree(b.base) }))
		b.base = 0
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: close: %w", err)
	}
	return nil
}

// The goroutine rule (package backend's doc): only the goroutine that
// created the backend may enqueue work or change resources. The forwarding
// to the device thread makes other goroutines' calls safe for CUDA, but not
// ordered with the device goroutine's, so CheckGoroutine reports them as
// the CPU backend's hazard mode does. Go does not expose goroutine ids;
// the first line of a stack trace holds it (slow, paid only when checked:
// hazard.GoroutineID).

// onDevice checks, with CheckGoroutine, that method runs on the device
// goroutine; a violation is returned and kept for the next Synchronize.
func (b *Backend) onDevice(method string) error {
	if !b.cfg.CheckGoroutine {
		return nil
	}
	id := hazard.GoroutineID()
	if id == b.owner {
		return nil
	}
	err := fmt.Errorf("cuda: %s called on goroutine %d; only the device goroutine (%d, which created the backend) may call it",
		method, id, b.owner)
	b.mu.Lock()
	b.violations = append(b.violations, err)
	b.mu.Unlock()
	return err
}

// ThreadViolations lists the calls made off the device goroutine so far
// (CheckGoroutine only), each an error naming the method.
func (b *Backend) ThreadViolations() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]error(nil), b.violations...)
}

// violationErr is the error Synchronize reports for the violations so far.
func (b *Backend) violationErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.violations) == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %d call(s) off the device goroutine; first: %w", len(b.violations), b.violations[0])
}
