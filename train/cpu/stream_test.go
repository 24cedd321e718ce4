// Tests of streams, events, memory accounting and the link charge of the
// CPU backend: CUDA's ordering rules, sticky async errors, the byte budget
// and the modelled host-device link. Delays come from the link latency (a
// fixed sleep inside a copy), so the orderings tested have tens of
// milliseconds of margin.

package cpu

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// slowCopy enqueues a 4-byte host-to-device copy into scratch, which takes
// the backend's LinkLatency: a slow op with no effect the test reads.
func slowCopy(t *testing.T, be *Backend, s backend.Stream, scratch backend.Tensor, h backend.HostBuffer) {
	t.Helper()
	ok(t, be.CopyH2D(s, scratch, h, 0))
}

// syncWithin synchronizes s but fails instead of hanging past limit, so a
// wait bound to the wrong record shows as a test failure, not a stuck run.
func syncWithin(t *testing.T, be *Backend, s backend.Stream, limit time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- be.Synchronize(s) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("synchronize %s: %v", s.Name(), err)
		}
	case <-time.After(limit):
		t.Fatalf("synchronize %s still blocked after %v: deadlock", s.Name(), limit)
	}
}

func TestStreamRunsOpsInOrder(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		be := newBE(t, Config{MaxDelay: 100 * time.Microsecond, Seed: seed})
		s := newStream(t, be, "work")
		x := alloc(t, be, "x", 3, backend.F32)
		one := tensorOf(t, be, "one", backend.F32, []float32{1, 1, 1})
		ok(t, be.Fill(s, x, 0.5))
		// x <- 2x + 1, twenty times: 2^20 * 1.5 - 1, exact in fp32; any
		// reordering of the 41 ops gives another value.
		for range 20 {
			ok(t, be.Scale(s, x, 2))
			ok(t, be.Accumulate(s, x, one))
		}
		mustSync(t, be, s)
		same(t, "x", get(t, be, x), []float32{1572863, 1572863, 1572863})
	}
}

func TestSynchronizeWaits(t *testing.T) {
	const latency = 30 * time.Millisecond
	be := newBE(t, Config{LinkLatency: latency})
	s := newStream(t, be, "up")
	x := alloc(t, be, "x", 4, backend.F32)
	h, err := be.AllocHost("h", 16)
	ok(t, err)
	copy(h.Float32(), []float32{1, 2, 3, 4})
	start := time.Now()
	ok(t, be.CopyH2D(s, x, h, 0))
	ok(t, be.Scale(s, x, 10))
	mustSync(t, be, s)
	if d := time.Since(start); d < latency {
		t.Errorf("synchronize returned after %v, before the %v copy", d, latency)
	}
	// Read the memory directly: Synchronize alone must have ordered it.
	same(t, "x", append([]float32(nil), f32View(x)...), []float32{10, 20, 30, 40})
}

func TestAsyncErrorIsSticky(t *testing.T) {
	const B, T, C, V = 1, 3, 4, 5
	cases := []struct {
		name    string
		enqueue func(be *Backend, s backend.Stream) error
		want    string
	}{
		{"token id = V", func(be *Backend, s backend.Stream) error {
			inp := intsOf(t, be, "inp", []int32{0, V, 1})
			return be.EncoderForward(s, alloc(t, be, "out", B*T*C, backend.F32), inp, backend.Tensor{},
				alloc(t, be, "wte", V*C, backend.F32), alloc(t, be, "wpe", T*C, backend.F32), B, T, C)

		}, "token id 5"},
		{"token id < 0", func(be *Backend, s backend.Stream) error {
			inp := intsOf(t, be, "inp", []int32{0, 1, -2})
			return be.EncoderBackward(s, alloc(t, be, "dwte", V*C, backend.F32), alloc(t, be, "dwpe", T*C, backend.F32),
				alloc(t, be, "dout", B*T*C, backend.F32), inp, backend.Tensor{},
				B, T, C)

		}, "token id -2"},
		{"target = V", func(be *Backend, s backend.Stream) error {
			tg := intsOf(t, be, "targets", []int32{0, V})
			return be.CrossEntropyForwardBackward(s, alloc(t, be, "losses", 2, backend.F32),
				alloc(t, be, "logits", 2*V, backend.F32), tg, 2, V, 1)
		}, "target 5"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			be := newBE(t, Config{})
			s := newStream(t, be, "s")
			x := tensorOf(t, be, "x", backend.F32, []float32{7})
			// The bad id is only seen when the op runs: enqueueing succeeds.
			ok(t, tc.enqueue(be, s))
			ok(t, be.Fill(s, x, 9)) // must be skipped after the failure
			for i := range 2 {
				err := be.Synchronize(s)
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "stream s") {
					t.Fatalf("synchronize #%d: %v, want an error naming stream s and %q", i+1, err, tc.want)
				}
			}
			if v := f32View(x)[0]; v != 7 {
				t.Errorf("op after the failure ran: x = %v, want 7", v)
			}
			if err := be.Close(); err == nil {
				t.Error("Close after an async error returned nil")
			}
		})
	}
}

// TestWaitBindsAtEnqueue: a Wait binds to the latest Record of its event
// when the Wait is enqueued. Stream B waits for A's first record of e; A
// then waits for B (event f) before recording e again. With the binding
// right, B sees x = 1 and nothing blocks; a Wait that bound to the record
// current when it runs (the second one, B's wait runs after a slow copy)
// would deadlock, and a Wait that were ignored would copy x before A's
// first Fill (A starts with two slow copies, B with one).
func TestWaitBindsAtEnqueue(t *testing.T) {
	const latency = 40 * time.Millisecond
	be := newBE(t, Config{LinkLatency: latency})
	a, b := newStream(t, be, "A"), newStream(t, be, "B")
	e, f := newEvent(t, be, "e"), newEvent(t, be, "f")
	h, err := be.AllocHost("h", 4)
	ok(t, err)
	sa, sb := alloc(t, be, "scratchA", 1, backend.F32), alloc(t, be, "scratchB", 1, backend.F32)
	x, y := alloc(t, be, "x", 5, backend.F32), alloc(t, be, "y", 5, backend.F32)

	slowCopy(t, be, a, sa, h)
	slowCopy(t, be, a, sa, h)
	ok(t, be.Fill(a, x, 1))
	ok(t, be.Record(e, a)) // first record

	slowCopy(t, be, b, sb, h)
	ok(t, be.Wait(b, e))
	ok(t, be.CopyD2D(b, y, x))
	ok(t, be.Record(f, b))

	ok(t, be.Wait(a, f))
	slowCopy(t, be, a, sa, h)
	ok(t, be.Fill(a, x, 2))
	ok(t, be.Record(e, a)) // second record: B's wait must not see it

	syncWithin(t, be, b, 10*time.Second)
	syncWithin(t, be, a, 10*time.Second)
	same(t, "y", get(t, be, y), []float32{1, 1, 1, 1, 1})
	same(t, "x", get(t, be, x), []float32{2, 2, 2, 2, 2})
}

// TestWaitOnRerecordedEvent: e is recorded on a slow stream A, a wait binds
// to that record, then e is recorded again on an idle stream C. The wait
// must still cover A's work, not be released by C's later, faster record.
func TestWaitOnRerecordedEvent(t *testing.T) {
	const latency = 40 * time.Millisecond
	be := newBE(t, Config{LinkLatency: latency})
	a, s, c := newStream(t, be, "A"), newStream(t, be, "S"), newStream(t, be, "C")
	e := newEvent(t, be, "e")
	h, err := be.AllocHost("h", 4)
	ok(t, err)
	sa := alloc(t, be, "scratch", 1, backend.F32)
	x, y := alloc(t, be, "x", 3, backend.F32), alloc(t, be, "y", 3, backend.F32)

	slowCopy(t, be, a, sa, h)
	slowCopy(t, be, a, sa, h)
	ok(t, be.Fill(a, x, 1))
	ok(t, be.Record(e, a))
	ok(t, be.Wait(s, e))
	ok(t, be.CopyD2D(s, y, x))
	ok(t, be.Record(e, c)) // completes at once on the idle stream C

	syncWithin(t, be, s, 10*time.Second)
	same(t, "y", get(t, be, y), []float32{1, 1, 1})
	mustSync(t, be, a)
	mustSync(t, be, c)
}

func TestEventSynchronize(t *testing.T) {
	const latency = 30 * time.Millisecond
	be := newBE(t, Config{LinkLatency: latency})
	a := newStream(t, be, "A")
	e := newEvent(t, be, "e")
	h, err := be.AllocHost("h", 4)
	ok(t, err)
	sa := alloc(t, be, "scratch", 1, backend.F32)
	x := alloc(t, be, "x", 2, backend.F32)

	ok(t, be.Fill(a, x, 1))
	ok(t, be.Record(e, a))
	slowCopy(t, be, a, sa, h)
	ok(t, be.Fill(a, x, 3))
	ok(t, be.Record(e, a)) // EventSynchronize waits for this, the latest record
	start := time.Now()
	ok(t, be.EventSynchronize(e))
	if d := time.Since(start); d < latency*9/10 {
		t.Errorf("EventSynchronize returned after %v, before the %v copy ahead of the latest record", d, latency)
	}
	same(t, "x", append([]float32(nil), f32View(x)...), []float32{3, 3})
	mustSync(t, be, a)
}

func TestNeverRecordedEvent(t *testing.T) {
	be := newBE(t, Config{})
	s := newStream(t, be, "s")
	e := newEvent(t, be, "lonely")
	if err := be.Wait(s, e); err == nil || !strings.Contains(err.Error(), "lonely") {
		t.Errorf("Wait on a never-recorded event: %v, want an error naming it", err)
	}
	if err := be.EventSynchronize(e); err == nil || !strings.Contains(err.Error(), "lonely") {
		t.Errorf("EventSynchronize on a never-recorded event: %v, want an error naming it", err)
	}
	mustSync(t, be, s) // the refused wait left nothing behind
}

func TestMemoryBudget(t *testing.T) {
	be := newBE(t, Config{MemBudget: 1000})
	type step struct {
		alloc          string // name to allocate, or "" to free the buffer named by free
		n              int
		dt             backend.DType
		free           string
		oom            bool
		inUse, highWat int64
	}
	steps := []step{
		{alloc: "a", n: 100, dt: backend.F32, inUse: 400, highWat: 400},
		{alloc: "b", n: 150, dt: backend.BF16, inUse: 700, highWat: 700},
		{alloc: "too big", n: 76, dt: backend.F32, oom: true, inUse: 700, highWat: 700}, // 304 > 300 left
		{alloc: "exact", n: 75, dt: backend.I32, inUse: 1000, highWat: 1000},            // the budget is inclusive
		{free: "a", inUse: 600, highWat: 1000},
		{free: "a", inUse: 600, highWat: 1000}, // a second Free is a no-op
		{free: "exact", inUse: 300, highWat: 1000},
		{alloc: "c", n: 350, dt: backend.BF16, inUse: 1000, highWat: 1000},
	}
	live := map[string]backend.Tensor{}
	for i, st := range steps {
		if st.alloc != "" {
			x, err := be.Alloc(st.alloc, st.n, st.dt)
			var oom *OutOfMemoryError
			switch {
			case st.oom && !errors.As(err, &oom):
				t.Fatalf("step %d: alloc %s: %v, want *OutOfMemoryError", i, st.alloc, err)
			case st.oom:
				need := int64(st.n * st.dt.Size())
				if oom.Name != st.alloc || oom.Need != need || oom.Budget != 1000 || oom.InUse != st.inUse {
					t.Errorf("step %d: %+v, want name %q need %d", i, *oom, st.alloc, need)
				}
				if msg := err.Error(); !strings.Contains(msg, st.alloc) || !strings.Contains(msg, "304") {
					t.Errorf("step %d: message %q does not name the buffer and bytes", i, msg)
				}
			case err != nil:
				t.Fatalf("step %d: alloc %s: %v", i, st.alloc, err)
			default:
				if x.Bytes() != int64(st.n*st.dt.Size()) || x.Buf.Name() != st.alloc {
					t.Errorf("step %d: got %v of %d bytes", i, x, x.Bytes())
				}
				live[st.alloc] = x
			}
		} else {
			be.Free(live[st.free])
		}
		ms := be.MemStats()
		if ms.InUse != st.inUse || ms.HighWater != st.highWat || ms.Budget != 1000 {
			t.Fatalf("step %d: %+v, want in use %d high water %d", i, ms, st.inUse, st.highWat)
		}
	}
}

func TestLinkCharge(t *testing.T) {
	const n = 10000 // fp32 elements: 40000 bytes
	cases := []struct {
		name      string
		bandwidth float64
		latency   time.Duration
		min       time.Duration // lower bound per copy, with 10% slack
	}{
		{"bandwidth", 2e6, 0, 20 * time.Millisecond},
		{"latency", 0, 15 * time.Millisecond, 15 * time.Millisecond},
		{"both", 4e6, 10 * time.Millisecond, 20 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			be := newBE(t, Config{LinkBandwidth: tc.bandwidth, LinkLatency: tc.latency})
			s := newStream(t, be, "link")
			x, y := alloc(t, be, "x", n, backend.F32), alloc(t, be, "y", n, backend.F32)
			h, err := be.AllocHost("h", 4*n)
			ok(t, err)
			for _, dir := range []string{"h2d", "d2h"} {
				start := time.Now()
				if dir == "h2d" {
					ok(t, be.CopyH2D(s, x, h, 0))
				} else {
					ok(t, be.CopyD2H(s, h, 0, x))
				}
				mustSync(t, be, s)
				if d := time.Since(start); d < tc.min*9/10 {
					t.Errorf("%s of %d bytes took %v, want at least %v", dir, 4*n, d, tc.min)
				}
			}
			ok(t, be.CopyD2D(s, y, x)) // device-to-device: not link traffic
			mustSync(t, be, s)
			if tr := be.Traffic(); tr != (backend.Traffic{H2D: 4 * n, D2H: 4 * n}) {
				t.Errorf("traffic %+v, want %d bytes each way", tr, 4*n)
			}
		})
	}
}
