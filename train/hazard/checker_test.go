package hazard

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// onGoroutine runs fn on a new goroutine and waits for it, telling the
// checker nothing about the hand-over.
func onGoroutine(fn func()) {
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	<-done
}

// TestHostGoroutinesAreApart: a host access on one goroutine and a copy
// another goroutine enqueues afterwards are unordered unless a Snapshot
// and a Join say otherwise, whichever ran first in wall time. (With one
// actor for all host code, the copy looked ordered after the write only
// because it was enqueued later: a missing edge went unnoticed by timing.)
func TestHostGoroutinesAreApart(t *testing.T) {
	pinned := backend.Range{Buf: -1, Lo: 0, Hi: 64}
	const stream = 1

	// A worker writes pinned memory, then the device goroutine enqueues a
	// copy reading it, with nothing ordering the two.
	h := NewChecker()
	onGoroutine(func() { h.Access(Host, "host adam", nil, []backend.Range{pinned}) })
	h.Access(stream, "h2d weights", []backend.Range{pinned}, nil)
	if len(h.Hazards()) != 1 {
		t.Errorf("an unordered host write and copy: %d hazards, want 1: %v", len(h.Hazards()), h.Hazards())
	}

	// The same with the hand-over declared: the worker's end joined by the
	// device goroutine before it enqueues.
	h = NewChecker()
	var end Clock
	onGoroutine(func() {
		h.Access(Host, "host adam", nil, []backend.Range{pinned})
		end = h.Snapshot()
	})
	h.Join(end)
	h.Access(stream, "h2d weights", []backend.Range{pinned}, nil)
	if err := h.Err(); err != nil {
		t.Errorf("a host write joined before the copy: %v", err)
	}

	// A worker started after a Snapshot is ordered after the device
	// goroutine's earlier waits: the copy out, then the worker's read.
	h = NewChecker()
	h.Access(stream, "d2h grads", nil, []backend.Range{pinned})
	h.HostJoinsStream(stream)
	start := h.Snapshot()
	onGoroutine(func() {
		h.Join(start)
		h.Access(Host, "host adam", []backend.Range{pinned}, nil)
	})
	if err := h.Err(); err != nil {
		t.Errorf("a worker started after the device goroutine waited: %v", err)
	}
	// Without the Join the worker knows nothing of that wait.
	h = NewChecker()
	h.Access(stream, "d2h grads", nil, []backend.Range{pinned})
	h.HostJoinsStream(stream)
	onGoroutine(func() { h.Access(Host, "host adam", []backend.Range{pinned}, nil) })
	if len(h.Hazards()) != 1 {
		t.Errorf("a worker that did not join: %d hazards, want 1", len(h.Hazards()))
	}
}
