// Streams and events of the CPU backend, with CUDA's rules: a stream runs
// its ops in order on its own goroutine; Record marks the point reached
// (and the time it was reached, for ElapsedTime); a Wait binds, when it is
// enqueued, to the latest Record of its event, and a wait on an event never
// recorded is an error. Destroyed streams and events are refused.

package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
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
	exited   chan struct{} // closed when the goroutine returns

	destroyed bool // guarded by b.mu
}

func (s *stream) Name() string { return s.name }

func (b *Backend) newStream(name string) *stream {
	b.mu.Lock()
	b.nextStream++ // actor 0 is the host; ids are never reused
	s := &stream{b: b, id: b.nextStream, name: name, rng: newRNG(b.cfg.Seed, b.nextStream), exited: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	b.streams = append(b.streams, s)
	b.mu.Unlock()
	go s.loop()
	return s
}

// DefaultStream implements backend.Backend.
func (b *Backend) DefaultStream() backend.Stream { return b.dflt }

// NewStream implements backend.Backend: a stream is a goroutine, which
// DestroyStream or Close ends.
func (b *Backend) NewStream(name string) (backend.Stream, error) {
	if err := b.open("new stream " + name); err != nil {
		return nil, err
	}
	return b.newStream(name), nil
}

// open fails where a call may not create a stream or an event: off the
// device goroutine (hazard mode) and after Close; what names the call.
func (b *Backend) open(what string) error {
	if err := b.onDevice(); err != nil {
		return err
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return fmt.Errorf("cpu: %s: backend is closed", what)
	}
	return nil
}

// DestroyStream implements backend.Backend. The work enqueued on s still
// runs; unlike CUDA, the call returns only once it has and the stream's
// goroutine has ended, so that nothing outlives the stream.
func (b *Backend) DestroyStream(s backend.Stream) error {
	if err := b.onDevice(); err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return fmt.Errorf("cpu: destroy stream: %w", err)
	}
	if st == b.dflt {
		return fmt.Errorf("cpu: destroy stream %s: the default stream belongs to the backend", st.name)
	}
	b.mu.Lock()
	st.destroyed = true
	b.streams = slices.DeleteFunc(b.streams, func(x *stream) bool { return x == st })
	b.mu.Unlock()
	st.stop()
	<-st.exited
	return nil
}

func (s *stream) loop() {
	defer close(s.exited)
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
		if o.control || s.b.failed.Err() == nil {
			if err := o.run(); err != nil {
				s.b.failed.Set(fmt.Errorf("stream %s: %s: %w", s.name, o.name, err))
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
	closed, destroyed := b.closed, st.destroyed
	b.mu.Unlock()
	switch {
	case closed:
		return nil, fmt.Errorf("cpu: stream %s: backend is closed", st.name)
	case destroyed:
		return nil, fmt.Errorf("cpu: stream %s was destroyed", st.name)
	}
	return st, nil
}

// enqueue checks an op's declared accesses (in hazard mode) and queues it.
func (b *Backend) enqueue(s backend.Stream, acc hazard.Access, run func() error) error {
	if err := b.onDevice(); err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	if b.haz != nil {
		b.haz.Access(st.id, acc.Name, acc.Reads, acc.Writes)
	}
	st.push(op{name: acc.Name, run: run})
	return nil
}

// op checks a call of an op as every backend does (backend.CheckCall),
// then as this one must (fp32Only; the dtype table in the KernelDTypes
// mode), and enqueues run, the op's reference, with the table's access.
func (b *Backend) op(s backend.Stream, c *backend.Call, run func() error) error {
	d, err := c.Def()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if _, err := backend.CheckCall(c, "cpu", d.Short, b.views.Arg); err != nil {
		return err
	}
	if fp32Only[c.Op] {
		for _, g := range d.Groups {
			for _, a := range g.Args {
				t, _ := c.Tensor(a)
				if len(g.DTypes) == 1 && g.DTypes[0] == backend.F32 && t.Buf != nil && t.DType != backend.F32 {
					return fmt.Errorf("cpu: %s: %s has dtype %v, want fp32", d.Short, a, t.DType)
				}
			}
		}
	}
	if err := b.kernelDTypes(c.Op, c.Tensors...); err != nil {
		return err
	}
	return b.enqueueOp(s, c, run)
}

// fp32Only are the ops whose references read their fixed-fp32 tensors
// (the table's one-dtype groups) as fp32 views, so the CPU backend, which
// otherwise takes either storage type anywhere, refuses bf16 there.
var fp32Only = map[string]bool{
	"NonFiniteFlag": true, "AdamW": true, "SparseCompressA": true, "SparseCompressB": true, "SparseS": true,
	"SparseApply": true, "SparseValueGrad": true, "DenseGemm": true, "DenseApply": true,
}

// enqueueOp enqueues an op of the table (backend.OpDef): its name is the
// table's short one and, in hazard mode, what it touches the table's
// declaration (hazard.Of), worked out only then.
func (b *Backend) enqueueOp(s backend.Stream, c *backend.Call, run func() error) error {
	d, err := c.Def()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	acc := hazard.Access{Name: d.Short}
	if b.haz != nil {
		if acc, err = hazard.Of(c); err != nil {
			return fmt.Errorf("cpu: %w", err)
		}
	}
	return b.enqueue(s, acc, run)
}

// Synchronize implements backend.Backend.
func (b *Backend) Synchronize(s backend.Stream) error {
	if err := b.onDevice(); err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	st.sync()
	if b.haz != nil {
		b.haz.HostJoinsStream(st.id)
		if err := b.haz.err(); err != nil {
			return err
		}
	}
	return b.failed.Err()
}

type event struct {
	b    *Backend
	name string

	mu        sync.Mutex
	latest    *mark // the latest record enqueued; nil before the first
	destroyed bool
}

// mark is one Record of an event: done is closed when its stream reaches
// it, at the time in at (written before done is closed). A Wait keeps the
// mark current when it was enqueued, so a later record of the same event,
// even one on a faster stream, cannot release it.
type mark struct {
	done chan struct{}
	at   time.Time
}

func (e *event) Name() string { return e.name }

// latestMark is the mark of e's latest record, or nil if it was never
// recorded.
func (e *event) latestMark() *mark {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.latest
}

// NewEvent implements backend.Backend.
func (b *Backend) NewEvent(name string) (backend.Event, error) {
	if err := b.open("new event " + name); err != nil {
		return nil, err
	}
	return &event{b: b, name: name}, nil
}

// event checks that e is a live event of this backend.
func (b *Backend) event(e backend.Event) (*event, error) {
	ev, ok := e.(*event)
	if !ok || ev == nil {
		return nil, fmt.Errorf("cpu: event of type %T is not a CPU event", e)
	}
	if ev.b != b {
		return nil, fmt.Errorf("cpu: event %s belongs to another backend", ev.name)
	}
	ev.mu.Lock()
	destroyed := ev.destroyed
	ev.mu.Unlock()
	if destroyed {
		return nil, fmt.Errorf("cpu: event %s was destroyed", ev.name)
	}
	return ev, nil
}

// DestroyEvent implements backend.Backend.
func (b *Backend) DestroyEvent(e backend.Event) error {
	if err := b.onDevice(); err != nil {
		return err
	}
	ev, err := b.event(e)
	if err != nil {
		return fmt.Errorf("cpu: destroy event: %w", err)
	}
	ev.mu.Lock()
	ev.destroyed = true
	ev.mu.Unlock()
	if b.haz != nil {
		b.haz.Forget(ev)
	}
	return nil
}

// Record implements backend.Backend.
func (b *Backend) Record(e backend.Event, s backend.Stream) error {
	if err := b.onDevice(); err != nil {
		return err
	}
	ev, err := b.event(e)
	if err != nil {
		return fmt.Errorf("cpu: record: %w", err)
	}
	st, err := b.stream(s)
	if err != nil {
		return fmt.Errorf("cpu: record %s: %w", ev.name, err)
	}
	m := &mark{done: make(chan struct{})}
	ev.mu.Lock()
	ev.latest = m
	ev.mu.Unlock()
	if b.haz != nil {
		b.haz.Record(ev, st.id)
	}
	st.push(op{name: "record " + ev.name, control: true, run: func() error {
		m.at = time.Now()
		close(m.done)
		return nil
	}})
	return nil
}

// Wait implements backend.Backend: s waits for the latest record of e as of
// now; records made later do not matter to this wait.
func (b *Backend) Wait(s backend.Stream, e backend.Event) error {
	if err := b.onDevice(); err != nil {
		return err
	}
	ev, err := b.event(e)
	if err != nil {
		return err
	}
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	m := ev.latestMark()
	if m == nil {
		return fmt.Errorf("cpu: stream %s waits on event %s, which was never recorded", st.name, ev.name)
	}
	if b.haz != nil {
		b.haz.Wait(st.id, ev)
	}
	st.push(op{name: "wait " + ev.name, control: true, run: func() error {
		<-m.done
		return nil
	}})
	return nil
}

// EventSynchronize implements backend.Backend. Any goroutine may call it.
func (b *Backend) EventSynchronize(e backend.Event) error {
	ev, err := b.event(e)
	if err != nil {
		return err
	}
	m := ev.latestMark()
	if m == nil {
		return fmt.Errorf("cpu: host waits on event %s, which was never recorded", ev.name)
	}
	<-m.done
	if b.haz != nil {
		b.haz.HostJoinsEvent(ev)
		if err := b.haz.err(); err != nil {
			return err
		}
	}
	return b.failed.Err()
}

// ElapsedTime implements backend.Backend: the time between the moments the
// two latest records ran on their streams. Any goroutine may call it.
func (b *Backend) ElapsedTime(start, end backend.Event) (time.Duration, error) {
	var at [2]time.Time
	for i, e := range []backend.Event{start, end} {
		ev, err := b.event(e)
		if err != nil {
			return 0, fmt.Errorf("cpu: elapsed time: %w", err)
		}
		m := ev.latestMark()
		if m == nil {
			return 0, fmt.Errorf("cpu: elapsed time: event %s was never recorded", ev.name)
		}
		select {
		case <-m.done:
			at[i] = m.at
		default:
			return 0, fmt.Errorf("cpu: elapsed time: the latest record of event %s has not completed (EventSynchronize it first)", ev.name)
		}
	}
	return at[1].Sub(at[0]), nil
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
	return b.copyHost(s, true, dst, src, srcOff)
}

// CopyD2H implements backend.Backend.
func (b *Backend) CopyD2H(s backend.Stream, dst backend.HostBuffer, dstOff int, src backend.Tensor) error {
	return b.copyHost(s, false, src, dst, dstOff)
}

// copyHost checks and enqueues a copy between the device tensor t and
// the bytes of the host buffer h from off on, into t if h2d (CopyH2D),
// else out of it (CopyD2H).
func (b *Backend) copyHost(s backend.Stream, h2d bool, t backend.Tensor, h backend.HostBuffer, off int) error {
	op, arg, way, traffic := "copy d2h", "src", "from", &b.d2h
	if h2d {
		op, arg, way, traffic = "copy h2d", "dst", "to", &b.h2d
	}
	n := int(t.Bytes())
	if err := b.views.Tensor(op+" "+arg, t); err != nil {
		return err
	}
	if h == nil {
		return fmt.Errorf("cpu: %s %s %v: nil host buffer", op, way, t)
	}
	if off < 0 || off+n > len(h.Bytes()) {
		return fmt.Errorf("cpu: %s: host range [%d,%d) outside buffer of %d bytes", op, off, off+n, len(h.Bytes()))
	}
	acc := hazard.CopyD2H(h, off, t)
	if h2d {
		acc = hazard.CopyH2D(t, h, off)
	}
	return b.enqueue(s, acc, func() error {
		b.chargeLink(int64(n))
		if h2d {
			copy(bytesOf(t), h.Bytes()[off:off+n])
		} else {
			copy(h.Bytes()[off:off+n], bytesOf(t))
		}
		b.mu.Lock()
		*traffic += int64(n)
		b.mu.Unlock()
		return nil
	})
}
