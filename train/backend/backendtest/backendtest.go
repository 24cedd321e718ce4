// Package backendtest holds checks of the backend contract that the tests
// of every backend (CPU, CUDA) share, and the goroutine counting that the
// lifecycle tests of the backends and of their users share.
package backendtest

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// QuietGoroutines is the goroutine count once it stops falling: a
// goroutine that has signalled its end (a stream's, a test's) may still be
// counted for a moment.
func QuietGoroutines() int {
	n := runtime.NumGoroutine()
	for range 200 {
		time.Sleep(2 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			break
		}
		n = m
	}
	return n
}

// SettledGoroutines waits (up to 2 s) for the goroutine count to fall to
// want and returns the last count: goroutines that are ending may take a
// moment, leaked ones never go.
func SettledGoroutines(want int) int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); n > want && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// WantErr fails unless err is an error saying every one of subs.
func WantErr(t testing.TB, what string, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want one saying %q", what, subs)
		return
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %v, want it to say %q", what, err, s)
		}
	}
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ThreadChecked is a backend that keeps the calls made off its device
// goroutine (the CPU backend in hazard mode, the CUDA backend with
// CheckGoroutine).
type ThreadChecked interface {
	backend.Backend
	ThreadViolations() []error
}

// DeviceGoroutineRule checks the device-goroutine rule on be, which must
// keep the calls made off its device goroutine: such a call is an error
// naming the method (Free, which returns nothing, is only kept), every one
// is kept, and the device's next Synchronize fails; the calls any
// goroutine may make (host waits, timing, counters, host buffer views)
// pass.
func DeviceGoroutineRule(t *testing.T, be ThreadChecked) {
	t.Helper()
	s, err := be.NewStream("s")
	ok(t, err)
	x, err := be.Alloc("x", 4, backend.F32)
	ok(t, err)
	freed, err := be.Alloc("freed", 4, backend.F32)
	ok(t, err)
	h, err := be.AllocHost("h", 16)
	ok(t, err)
	e, err := be.NewEvent("e")
	ok(t, err)
	ok(t, backend.Upload(be, s, x, []float32{1, 1, 1, 1})) // the staging buffer exists now
	ok(t, be.Record(e, s))
	ok(t, be.EventSynchronize(e)) // so that ElapsedTime below has completed records

	for name, f := range map[string]func() error{
		"EventSynchronize": func() error { return be.EventSynchronize(e) },
		"ElapsedTime":      func() error { _, err := be.ElapsedTime(e, e); return err },
		"MemStats, Traffic, DefaultStream, Staging, views": func() error {
			_, _, _, _ = be.MemStats(), be.Traffic(), be.DefaultStream(), be.Staging()
			h.Float32()[0] = 1
			return nil
		},
	} {
		if err := OffGoroutine(f); err != nil {
			t.Errorf("%s off the device goroutine: %v", name, err)
		}
	}
	if v := be.ThreadViolations(); len(v) > 0 {
		t.Fatalf("allowed calls reported: %v", v)
	}
	for _, tc := range []struct {
		method string
		call   func() error
	}{
		{"Fill", func() error { return be.Fill(s, x, 2) }},
		{"Alloc", func() error { _, err := be.Alloc("y", 1, backend.F32); return err }},
		{"AllocHost", func() error { _, err := be.AllocHost("y", 1); return err }},
		{"NewStream", func() error { _, err := be.NewStream("t"); return err }},
		{"NewEvent", func() error { _, err := be.NewEvent("f"); return err }},
		{"Record", func() error { return be.Record(e, s) }},
		{"Wait", func() error { return be.Wait(s, e) }},
		{"Synchronize", func() error { return be.Synchronize(s) }},
		{"DestroyStream", func() error { return be.DestroyStream(s) }},
		{"DestroyEvent", func() error { return be.DestroyEvent(e) }},
		{"CopyH2D", func() error { return backend.Upload(be, s, x, []float32{1, 2, 3, 4}) }},
		{"Close", func() error { return be.Close() }},
	} {
		WantErr(t, tc.method+" off the device goroutine", OffGoroutine(tc.call), tc.method+" called on goroutine", "device goroutine")
	}
	_ = OffGoroutine(func() error { be.Free(freed); return nil })
	v := be.ThreadViolations()
	if len(v) != 13 || !strings.Contains(v[12].Error(), "Free called on goroutine") {
		t.Errorf("%d violations kept, last %v; want 13, the last naming Free", len(v), v[len(v)-1])
	}
	WantErr(t, "Synchronize after violations", be.Synchronize(s), "off the device goroutine")
}

// OffGoroutine runs f on a goroutine of its own and returns its error.
func OffGoroutine(f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return <-done
}

// DestroyedStreamRefused checks that s, a stream named name that was
// destroyed, is refused by every later use (x and e are any tensor and
// event of be), and that the default stream cannot be destroyed.
func DestroyedStreamRefused(t testing.TB, be backend.Backend, s backend.Stream, name string, x backend.Tensor, e backend.Event) {
	t.Helper()
	WantErr(t, "Fill on a destroyed stream", be.Fill(s, x, 1), name, "destroyed")
	WantErr(t, "Record on a destroyed stream", be.Record(e, s), name, "destroyed")
	WantErr(t, "Synchronize of a destroyed stream", be.Synchronize(s), "destroyed")
	WantErr(t, "second DestroyStream", be.DestroyStream(s), "destroyed")
	WantErr(t, "DestroyStream of the default stream", be.DestroyStream(be.DefaultStream()), "default")
}

// DestroyedEventRefused checks that e, an event named name that was
// destroyed, is refused by every later use (a and b are any streams of
// be).
func DestroyedEventRefused(t testing.TB, be backend.Backend, e backend.Event, name string, a, b backend.Stream) {
	t.Helper()
	WantErr(t, "Record of a destroyed event", be.Record(e, a), name, "destroyed")
	WantErr(t, "Wait on a destroyed event", be.Wait(b, e), name, "destroyed")
	WantErr(t, "EventSynchronize of a destroyed event", be.EventSynchronize(e), name, "destroyed")
	_, err := be.ElapsedTime(e, e)
	WantErr(t, "ElapsedTime of a destroyed event", err, name, "destroyed")
	WantErr(t, "second DestroyEvent", be.DestroyEvent(e), "destroyed")
}

// ForeignRecordRefused checks Record's refusals of what is not be's: an
// event of other, a stream of other, and a nil event (whose error says
// nilSays). It returns a stream and an event of be that Record takes.
func ForeignRecordRefused(t testing.TB, be, other backend.Backend, nilSays string) (backend.Stream, backend.Event) {
	t.Helper()
	s, err := be.NewStream("s")
	ok(t, err)
	e, err := be.NewEvent("mine")
	ok(t, err)
	foreign, err := other.NewEvent("theirs")
	ok(t, err)
	WantErr(t, "Record of another backend's event", be.Record(foreign, s), "theirs", "another backend")
	WantErr(t, "Record on another backend's stream", be.Record(e, other.DefaultStream()), "does not belong")
	WantErr(t, "Record of a nil event", be.Record(nil, s), nilSays)
	return s, e
}
