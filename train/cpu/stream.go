// Streams and events of the CPU backend, with CUDA's rules: a stream runs
// its ops in order on its own goroutine; Record marks the point reached; a
// Wait binds, when it is enqueued, to the latest Record of its event, and a
// wait on an event never recorded is an error.

package cpu

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

type op struct {
	name    string
	control bool // record/wait markers: run even after an error
	run     func() error
}

type stream struct {
	b    *Backend
	id   int
	name string
	rng  *rand.Rand // test-mode delays; used only by the stream goroutine

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []op
	enqueued uint64
	done     uint64
	quit     bool
}

func (s *stream) Name() string { return s.name }

func (b *Backend) newStream(name string) *stream {
	b.mu.Lock()
	id := len(b.streams) + 1 // actor 0 is the host
	s := &stream{b: b, id: id, name: name, rng: newRNG(b.cfg.Seed, id)}
	s.cond = sync.NewCond(&s.mu)
	b.streams = append(b.streams, s)
	b.mu.Unlock()
	go s.loop()
	return s
}

// DefaultStream implements backend.Backend.
func (b *Backend) DefaultStream() backend.Stream { return b.dflt }

// NewStream implements backend.Backend.
func (b *Backend) NewStream(name string) backend.Stream { return b.newStream(name) }

func (s *stream) loop() {
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.quit {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		o := s.queue[0]
		s.queue[0] = op{}
		s.queue = s.queue[1:]
		s.mu.Unlock()

		if !o.control {
			s.delay()
		}
		if o.control || s.b.err() == nil {
			if err := o.run(); err != nil {
				s.b.fail(fmt.Errorf("stream %s: %s: %w", s.name, o.name, err))
			}
		}

		s.mu.Lock()
		s.done++
		s.cond.Broadcast()
		s.mu.Unlock()
	}
}

func (s *stream) push(o op) {
	s.mu.Lock()
	s.queue = append(s.queue, o)
	s.enqueued++
	s.cond.Broadcast()
	s.mu.Unlock()
}

// sync waits until everything enqueued so far has run.
func (s *stream) sync() error {
	s.mu.Lock()
	target := s.enqueued
	for s.done < target {
		s.cond.Wait()
	}
	s.mu.Unlock()
	return nil
}

func (s *stream) stop() {
	s.mu.Lock()
	s.quit = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

func (b *Backend) stream(s backend.Stream) (*stream, error) {
	st, ok := s.(*stream)
	if !ok || st == nil || st.b != b {
		// Name the stream, never print it with %v: that would read its
		// fields while its goroutine changes them.
		what := fmt.Sprintf("%T", s)
		if ok && st != nil {
			what = st.name
		}
		return nil, fmt.Errorf("cpu: stream %s does not belong to this backend", what)
	}
	// After Close the stream goroutines have stopped: work queued on them
	// would never run, and a Synchronize would wait for it forever.
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("cpu: stream %s: backend is closed", st.name)
	}
	return st, nil
}

// enqueue checks an op's declared accesses (in hazard mode) and queues it.
func (b *Backend) enqueue(s backend.Stream, name string, reads, writes []backend.Range, run func() error) error {
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	if b.haz != nil {
		b.haz.access(st.id, st, name, reads, writes)
	}
	st.push(op{name: name, run: run})
	return nil
}

// Synchronize implements backend.Backend.
func (b *Backend) Synchronize(s backend.Stream) error {
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	st.sync()
	if b.haz != nil {
		b.haz.hostJoinsStream(st.id)
		if err := b.haz.err(); err != nil {
			return err
		}
	}
	return b.err()
}

type event struct {
	name string

	mu       sync.Mutex
	recorded uint64 // records enqueued so far (the hazard clocks key on it)
	latest   *mark  // the latest record enqueued; nil before the first
}

// mark is one Record of an event: done is closed when its stream reaches
// it. A Wait keeps the mark current when it was enqueued, so a later record
// of the same event, even one on a faster stream, cannot release it.
type mark struct{ done chan struct{} }

func (e *event) Name() string { return e.name }

// NewEvent implements backend.Backend.
func (b *Backend) NewEvent(name string) backend.Event {
	return &event{name: name}
}

func asEvent(e backend.Event) (*event, error) {
	ev, ok := e.(*event)
	if !ok || ev == nil {
		return nil, fmt.Errorf("cpu: event of type %T is not a CPU event", e)
	}
	return ev, nil
}

// Record implements backend.Backend.
func (b *Backend) Record(e backend.Event, s backend.Stream) {
	ev, err := asEvent(e)
	st, serr := b.stream(s)
	if err != nil || serr != nil {
		b.fail(fmt.Errorf("cpu: record: %v %v", err, serr))
		return
	}
	m := &mark{done: make(chan struct{})}
	ev.mu.Lock()
	ev.recorded++
	gen := ev.recorded
	ev.latest = m
	ev.mu.Unlock()
	if b.haz != nil {
		b.haz.record(ev, gen, st.id)
	}
	st.push(op{name: "record " + ev.name, control: true, run: func() error {
		close(m.done)
		return nil
	}})
}

// Wait implements backend.Backend: s waits for the latest record of e as of
// now; records made later do not matter to this wait.
func (b *Backend) Wait(s backend.Stream, e backend.Event) error {
	ev, err := asEvent(e)
	if err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	ev.mu.Lock()
	gen, m := ev.recorded, ev.latest
	ev.mu.Unlock()
	if m == nil {
		return fmt.Errorf("cpu: stream %s waits on event %s, which was never recorded", st.name, ev.name)
	}
	if b.haz != nil {
		b.haz.wait(st.id, ev, gen)
	}
	st.push(op{name: "wait " + ev.name, control: true, run: func() error {
		<-m.done
		return nil
	}})
	return nil
}

// EventSynchronize implements backend.Backend.
func (b *Backend) EventSynchronize(e backend.Event) error {
	ev, err := asEvent(e)
	if err != nil {
		return err
	}
	ev.mu.Lock()
	gen, m := ev.recorded, ev.latest
	ev.mu.Unlock()
	if m == nil {
		return fmt.Errorf("cpu: host waits on event %s, which was never recorded", ev.name)
	}
	<-m.done
	if b.haz != nil {
		b.haz.hostJoinsEvent(ev, gen)
		if err := b.haz.err(); err != nil {
			return err
		}
	}
	return b.err()
}

// chargeLink sleeps for the modelled cost of moving n bytes.
func (b *Backend) chargeLink(n int64) {
	d := b.cfg.LinkLatency
	if b.cfg.LinkBandwidth > 0 {
		d += time.Duration(float64(n) / b.cfg.LinkBandwidth * float64(time.Second))
	}
	if d > 0 {
		time.Sleep(d)
	}
}

// CopyH2D implements backend.Backend.
func (b *Backend) CopyH2D(s backend.Stream, dst backend.Tensor, src backend.HostBuffer, srcOff int) error {
	n := int(dst.Bytes())
	if err := b.checkTensor("copy h2d dst", dst); err != nil {
		return err
	}
	if src == nil {
		return fmt.Errorf("cpu: copy h2d to %v: nil host buffer", dst)
	}
	if srcOff < 0 || srcOff+n > len(src.Bytes()) {
		return fmt.Errorf("cpu: copy h2d: host range [%d,%d) outside buffer of %d bytes", srcOff, srcOff+n, len(src.Bytes()))
	}
	return b.enqueue(s, "copy h2d", []backend.Range{hostRange(src, srcOff, n)}, []backend.Range{dst.Range()}, func() error {
		b.chargeLink(int64(n))
		copy(bytesOf(dst), src.Bytes()[srcOff:srcOff+n])
		b.mu.Lock()
		b.h2d += int64(n)
		b.mu.Unlock()
		return nil
	})
}

// CopyD2H implements backend.Backend.
func (b *Backend) CopyD2H(s backend.Stream, dst backend.HostBuffer, dstOff int, src backend.Tensor) error {
	n := int(src.Bytes())
	if err := b.checkTensor("copy d2h src", src); err != nil {
		return err
	}
	if dst == nil {
		return fmt.Errorf("cpu: copy d2h from %v: nil host buffer", src)
	}
	if dstOff < 0 || dstOff+n > len(dst.Bytes()) {
		return fmt.Errorf("cpu: copy d2h: host range [%d,%d) outside buffer of %d bytes", dstOff, dstOff+n, len(dst.Bytes()))
	}
	return b.enqueue(s, "copy d2h", []backend.Range{src.Range()}, []backend.Range{hostRange(dst, dstOff, n)}, func() error {
		b.chargeLink(int64(n))
		copy(dst.Bytes()[dstOff:dstOff+n], bytesOf(src))
		b.mu.Lock()
		b.d2h += int64(n)
		b.mu.Unlock()
		return nil
	})
}
