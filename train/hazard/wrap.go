// Wrap: the hazard check around any backend, so that a backend with no
// check of its own (the CUDA one, on a GPU or on the simulated runtime)
// reports a missing stream or event edge deterministically, when the work
// is enqueued, rather than only when a race happens to corrupt a result.

package hazard

import (
	"fmt"
	"sync"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Backend is a backend.Backend that forwards every call to the backend it
// wraps and declares, after each enqueue the wrapped backend accepted, what
// the op reads and writes (access.go), its stream, and the records, waits
// and host synchronizations that order them. A hazard found is listed by
// Hazards and returned (wrapped) by every later Synchronize and
// EventSynchronize, as the CPU backend's hazard mode does.
//
// Limits: only work enqueued through the wrapper is seen, so take transfers
// through its Staging (backend.Upload(w, ...) does) and declare host code
// touching pinned memory with HostAccess.
type Backend struct {
	// The ops: each forwarded to the wrapped backend as a Call, then
	// declared from the op table (Of). They are one level shallower than
	// the wrapped backend's, so they are the ones promoted.
	backend.OpsFunc
	wrapped
	chk *Checker

	mu      sync.Mutex
	actors  map[backend.Stream]int
	staging *backend.Staging
}

var _ backend.Backend = (*Backend)(nil)

// wrapped holds the wrapped backend one level down, so that Backend's
// OpsFunc, not the wrapped backend's ops, implement backend.Ops.
type wrapped struct{ backend.Backend }

// Wrap puts the hazard check around be; closing the wrapper closes be.
func Wrap(be backend.Backend) *Backend {
	w := &Backend{wrapped: wrapped{be}, chk: NewChecker(), actors: map[backend.Stream]int{}}
	w.OpsFunc = func(s backend.Stream, c *backend.Call) error {
		if err := c.Run(be, s); err != nil {
			return err
		}
		acc, err := Of(c)
		if err != nil {
			return fmt.Errorf("%s: hazard check: %w", w.Name(), err)
		}
		return w.declare(s, nil, acc)
	}
	w.staging = backend.NewStaging(w, backend.StagingBytes)
	return w
}

// Hazards lists the hazards found so far.
func (w *Backend) Hazards() []Hazard { return w.chk.Hazards() }

// actor is the checker's actor of stream s: one per stream, in order of
// first use (streams are never reused, so ids need no recycling).
func (w *Backend) actor(s backend.Stream) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok := w.actors[s]
	if !ok {
		a = len(w.actors) + 1 // 0 is the host
		w.actors[s] = a
	}
	return a
}

// declare records acc on s once the wrapped backend accepted the op.
func (w *Backend) declare(s backend.Stream, err error, acc Access) error {
	if err != nil {
		return err
	}
	w.chk.Access(w.actor(s), acc.Name, acc.Reads, acc.Writes)
	return nil
}

// checked joins a hazard found so far into err.
func (w *Backend) checked(err error) error {
	if herr := w.chk.Err(); herr != nil {
		return fmt.Errorf("%s: hazard check: %w", w.Name(), herr)
	}
	return err
}

// HostAccess declares that host code is about to read and write the given
// ranges of pinned host memory (the engine and the staging transfers call
// it), so that device work touching them must be ordered before.
func (w *Backend) HostAccess(name string, reads, writes []backend.Range) {
	w.chk.Access(Host, name, reads, writes)
}

// HostSnapshot and HostJoin tell the check where goroutines hand work to
// each other (see Checker.Snapshot).
func (w *Backend) HostSnapshot() Clock { return w.chk.Snapshot() }

// HostJoin: see HostSnapshot.
func (w *Backend) HostJoin(c Clock) { w.chk.Join(c) }

// Staging is the wrapper's own, so that Upload and Download go through the
// wrapper and are checked.
func (w *Backend) Staging() *backend.Staging { return w.staging }

// Close frees the wrapper's staging buffer and closes the wrapped backend.
func (w *Backend) Close() error {
	w.staging.Free()
	return w.Backend.Close()
}

// DestroyEvent implements backend.Backend.
func (w *Backend) DestroyEvent(e backend.Event) error {
	err := w.Backend.DestroyEvent(e)
	if err == nil {
		w.chk.Forget(e)
	}
	return err
}

// Record implements backend.Backend.
func (w *Backend) Record(e backend.Event, s backend.Stream) error {
	err := w.Backend.Record(e, s)
	if err == nil {
		w.chk.Record(e, w.actor(s))
	}
	return err
}

// Wait implements backend.Backend.
func (w *Backend) Wait(s backend.Stream, e backend.Event) error {
	err := w.Backend.Wait(s, e)
	if err == nil {
		w.chk.Wait(w.actor(s), e)
	}
	return err
}

// Synchronize implements backend.Backend.
func (w *Backend) Synchronize(s backend.Stream) error {
	err := w.Backend.Synchronize(s)
	if err == nil {
		w.chk.HostJoinsStream(w.actor(s))
	}
	return w.checked(err)
}

// EventSynchronize implements backend.Backend.
func (w *Backend) EventSynchronize(e backend.Event) error {
	err := w.Backend.EventSynchronize(e)
	if err == nil {
		w.chk.HostJoinsEvent(e)
	}
	return w.checked(err)
}

// CopyH2D implements backend.Backend.
func (w *Backend) CopyH2D(s backend.Stream, dst backend.Tensor, src backend.HostBuffer, srcOff int) error {
	return w.declare(s, w.Backend.CopyH2D(s, dst, src, srcOff), CopyH2D(dst, src, srcOff))
}

// CopyD2H implements backend.Backend.
func (w *Backend) CopyD2H(s backend.Stream, dst backend.HostBuffer, dstOff int, src backend.Tensor) error {
	return w.declare(s, w.Backend.CopyD2H(s, dst, dstOff, src), CopyD2H(dst, dstOff, src))
}

// CopyD2D implements backend.Backend.
func (w *Backend) CopyD2D(s backend.Stream, dst, src backend.Tensor) error {
	return w.declare(s, w.Backend.CopyD2D(s, dst, src), CopyD2D(dst, src))
}
