//go:build cuda || cudasim

// Streams, events and copies of the CUDA backend. CUDA's rules hold (a
// wait binds to the latest record of its event when it is enqueued; a
// destroyed stream still runs the work enqueued on it); on top of them each
// event counts its records, so a wait on, a host wait on, or the timing of
// an event never recorded is the contract's error instead of CUDA's silent
// no-op (or its invalid-handle error).

package cuda

import (
	"fmt"
	"sync"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

type stream struct {
	b         *Backend
	name      string
	h         rtStream
	destroyed bool // guarded by b.mu
}

func (s *stream) Name() string { return s.name }

// newStream creates a non-blocking stream on the device thread.
func (b *Backend) newStream(name string) (*stream, error) {
	s := &stream{b: b, name: name}
	err := b.w.do(func() (err error) {
		s.h, err = rtStreamCreate()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: new stream %s: %w", name, err)
	}
	b.mu.Lock()
	b.streams[s] = struct{}{}
	b.mu.Unlock()
	return s, nil
}

// DefaultStream implements backend.Backend: a non-blocking stream the
// backend owns (not CUDA's legacy stream 0).
func (b *Backend) DefaultStream() backend.Stream { return b.dflt }

// NewStream implements backend.Backend.
func (b *Backend) NewStream(name string) (backend.Stream, error) {
	if err := b.onDevice("NewStream"); err != nil {
		return nil, err
	}
	if err := b.open("new stream " + name); err != nil {
		return nil, err
	}
	return b.newStream(name)
}

// stream checks that s is a live stream of this backend.
func (b *Backend) stream(s backend.Stream) (*stream, error) {
	st, ok := s.(*stream)
	if !ok || st == nil || st.b != b || st == b.internal {
		what := fmt.Sprintf("%T", s)
		if ok && st != nil {
			what = st.name
		}
		return nil, fmt.Errorf("cuda: stream %s does not belong to this backend", what)
	}
	b.mu.Lock()
	closed, destroyed := b.closed, st.destroyed
	b.mu.Unlock()
	switch {
	case closed:
		return nil, fmt.Errorf("cuda: stream %s: backend is closed", st.name)
	case destroyed:
		return nil, fmt.Errorf("cuda: stream %s was destroyed", st.name)
	}
	return st, nil
}

// DestroyStream implements backend.Backend (cudaStreamDestroy: the work
// enqueued on s still runs; the call does not wait for it).
func (b *Backend) DestroyStream(s backend.Stream) error {
	if err := b.onDevice("DestroyStream"); err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return fmt.Errorf("cuda: destroy stream: %w", err)
	}
	if st == b.dflt {
		return fmt.Errorf("cuda: destroy stream %s: the default stream belongs to the backend", st.name)
	}
	b.mu.Lock()
	st.destroyed = true
	delete(b.streams, st)
	b.mu.Unlock()
	if err := b.w.do(func() error { return rtStreamDestroy(st.h) }); err != nil {
		return fmt.Errorf("cuda: destroy stream %s: %w", st.name, err)
	}
	return nil
}

// Synchronize implements backend.Backend: it waits for s and returns the
// first async error of the backend (sticky), and, with CheckGoroutine, the
// calls made off the device goroutine.
func (b *Backend) Synchronize(s backend.Stream) error {
	if err := b.onDevice("Synchronize"); err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	if err := b.w.do(func() error { return rtStreamSynchronize(st.h) }); err != nil {
		b.failed.Set(fmt.Errorf("cuda: stream %s: %w", st.name, err))
	}
	if err := b.violationErr(); err != nil {
		return err
	}
	return b.failed.Err()
}

type event struct {
	b    *Backend
	name string
	h    rtEvent

	// use is held for reading by host waits on h and for writing by
	// DestroyEvent and Close, so a handle is never destroyed under a wait.
	use       sync.RWMutex
	mu        sync.Mutex // guards recorded and destroyed
	recorded  uint64     // records enqueued so far
	destroyed bool
}

func (e *event) Name() string { return e.name }

// NewEvent implements backend.Backend: a timing event (cudaEventDefault).
func (b *Backend) NewEvent(name string) (backend.Event, error) {
	if err := b.onDevice("NewEvent"); err != nil {
		return nil, err
	}
	if err := b.open("new event " + name); err != nil {
		return nil, err
	}
	e := &event{b: b, name: name}
	err := b.w.do(func() (err error) {
		e.h, err = rtEventCreate()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: new event %s: %w", name, err)
	}
	b.mu.Lock()
	b.events[e] = struct{}{}
	b.mu.Unlock()
	return e, nil
}

// event checks that e is a live event of this backend and returns its
// record count.
func (b *Backend) event(e backend.Event) (*event, uint64, error) {
	ev, ok := e.(*event)
	if !ok || ev == nil {
		return nil, 0, fmt.Errorf("cuda: event of type %T is not a CUDA event", e)
	}
	if ev.b != b {
		return nil, 0, fmt.Errorf("cuda: event %s belongs to another backend", ev.name)
	}
	if err := b.open("event " + ev.name); err != nil {
		return nil, 0, err
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.destroyed {
		return nil, 0, fmt.Errorf("cuda: event %s was destroyed", ev.name)
	}
	return ev, ev.recorded, nil
}

// DestroyEvent implements backend.Backend (cudaEventDestroy: waits already
// enqueued on e still end when its record is reached). It waits for host
// waits on e in progress.
func (b *Backend) DestroyEvent(e backend.Event) error {
	if err := b.onDevice("DestroyEvent"); err != nil {
		return err
	}
	ev, _, err := b.event(e)
	if err != nil {
		return fmt.Errorf("cuda: destroy event: %w", err)
	}
	ev.use.Lock()
	defer ev.use.Unlock()
	ev.mu.Lock()
	ev.destroyed = true
	ev.mu.Unlock()
	b.mu.Lock()
	delete(b.events, ev)
	b.mu.Unlock()
	if err := b.w.do(func() error { return rtEventDestroy(ev.h) }); err != nil {
		return fmt.Errorf("cuda: destroy event %s: %w", ev.name, err)
	}
	return nil
}

// Record implements backend.Backend.
func (b *Backend) Record(e backend.Event, s backend.Stream) error {
	if err := b.onDevice("Record"); err != nil {
		return err
	}
	ev, _, err := b.event(e)
	if err != nil {
		return fmt.Errorf("cuda: record: %w", err)
	}
	st, err := b.stream(s)
	if err != nil {
		return fmt.Errorf("cuda: record %s: %w", ev.name, err)
	}
	if err := b.w.do(func() error { return rtEventRecord(ev.h, st.h) }); err != nil {
		return fmt.Errorf("cuda: record %s on stream %s: %w", ev.name, st.name, err)
	}
	ev.mu.Lock()
	ev.recorded++
	ev.mu.Unlock()
	return nil
}

// Wait implements backend.Backend: s waits for the latest record of e as of
// now (cudaStreamWaitEvent).
func (b *Backend) Wait(s backend.Stream, e backend.Event) error {
	if err := b.onDevice("Wait"); err != nil {
		return err
	}
	ev, n, err := b.event(e)
	if err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("cuda: stream %s waits on event %s, which was never recorded", st.name, ev.name)
	}
	if err := b.w.do(func() error { return rtStreamWaitEvent(st.h, ev.h) }); err != nil {
		return fmt.Errorf("cuda: stream %s waits on event %s: %w", st.name, ev.name, err)
	}
	return nil
}

// EventSynchronize implements backend.Backend: the calling goroutine waits
// on its own thread (cudaEventSynchronize). Any goroutine may call it.
func (b *Backend) EventSynchronize(e backend.Event) error {
	ev, n, err := b.event(e)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("cuda: host waits on event %s, which was never recorded", ev.name)
	}
	ev.use.RLock()
	defer ev.use.RUnlock()
	if ev.isDestroyed() {
		return fmt.Errorf("cuda: event %s was destroyed", ev.name)
	}
	if err := rtEventSynchronize(b.info.Ordinal, ev.h); err != nil {
		b.failed.Set(fmt.Errorf("cuda: event %s: %w", ev.name, err))
	}
	return b.failed.Err()
}

func (e *event) isDestroyed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.destroyed
}

// ElapsedTime implements backend.Backend (cudaEventElapsedTime, about half
// a microsecond of resolution). Any goroutine may call it.
func (b *Backend) ElapsedTime(start, end backend.Event) (time.Duration, error) {
	var evs [2]*event
	for i, e := range []backend.Event{start, end} {
		ev, n, err := b.event(e)
		if err != nil {
			return 0, fmt.Errorf("cuda: elapsed time: %w", err)
		}
		if n == 0 {
			return 0, fmt.Errorf("cuda: elapsed time: event %s was never recorded", ev.name)
		}
		evs[i] = ev
	}
	for i, ev := range evs {
		if i == 1 && ev == evs[0] {
			break // locked once: a second read lock could wait behind a DestroyEvent
		}
		ev.use.RLock()
		defer ev.use.RUnlock()
		if ev.isDestroyed() {
			return 0, fmt.Errorf("cuda: elapsed time: event %s was destroyed", ev.name)
		}
	}
	ms, which, err := rtEventElapsed(b.info.Ordinal, evs[0].h, evs[1].h)
	switch {
	case which != 0 && codeOf(err) == codeNotReady:
		return 0, fmt.Errorf("cuda: elapsed time: the latest record of event %s has not completed (EventSynchronize it first)", evs[which-1].name)
	case err != nil:
		return 0, fmt.Errorf("cuda: elapsed time from %s to %s: %w", evs[0].name, evs[1].name, err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// copyTo enqueues one cudaMemcpyAsync on s and counts it in Traffic.
func (b *Backend) copyTo(s backend.Stream, what string, dst, src uintptr, n int64, kind copyKind) error {
	st, err := b.stream(s)
	if err != nil || n == 0 {
		return err
	}
	if err := b.w.do(func() error { return rtMemcpyAsync(dst, src, n, kind, st.h) }); err != nil {
		return fmt.Errorf("cuda: %s of %d bytes on stream %s: %w", what, n, st.name, err)
	}
	b.mu.Lock()
	switch kind {
	case h2d:
		b.h2d += n
	case d2h:
		b.d2h += n
	}
	b.mu.Unlock()
	return nil
}

// CopyH2D implements backend.Backend.
func (b *Backend) CopyH2D(s backend.Stream, dst backend.Tensor, src backend.HostBuffer, srcOff int) error {
	h, err := b.hostCopy("CopyH2D", h2d, dst, src, srcOff)
	if err != nil {
		return err
	}
	return b.copyTo(s, "copy h2d", uintptr(b.ptr(dst)), uintptr(h.p)+uintptr(srcOff), dst.Bytes(), h2d)
}

// CopyD2H implements backend.Backend.
func (b *Backend) CopyD2H(s backend.Stream, dst backend.HostBuffer, dstOff int, src backend.Tensor) error {
	h, err := b.hostCopy("CopyD2H", d2h, src, dst, dstOff)
	if err != nil {
		return err
	}
	return b.copyTo(s, "copy d2h", uintptr(h.p)+uintptr(dstOff), uintptr(b.ptr(src)), src.Bytes(), d2h)
}

// hostCopy checks the arguments of method (CopyH2D or CopyD2H, kind) for
// a copy between the device tensor t and the bytes of the host buffer hb
// from off on, and returns the host buffer.
func (b *Backend) hostCopy(method string, kind copyKind, t backend.Tensor, hb backend.HostBuffer, off int) (*hostBuffer, error) {
	if err := b.onDevice(method); err != nil {
		return nil, err
	}
	op, arg, way := "copy d2h", "src", "from"
	if kind == h2d {
		op, arg, way = "copy h2d", "dst", "to"
	}
	n := int(t.Bytes())
	if err := b.views.Tensor(op+" "+arg, t); err != nil {
		return nil, err
	}
	h, err := b.hostBuf(op+" "+way+" "+t.String(), hb)
	if err != nil {
		return nil, err
	}
	if off < 0 || off+n > len(h.HostBytes) {
		return nil, fmt.Errorf("cuda: %s: host range [%d,%d) outside buffer of %d bytes", op, off, off+n, len(h.HostBytes))
	}
	return h, nil
}
