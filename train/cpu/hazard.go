// Hazard checking for the CPU backend's test mode: the shared checker of
// package hazard (vector clocks over the accesses every op declares, checked
// when ops are enqueued, so it finds a missing edge whatever the timing of
// the run; the random delays of test mode then also make such a bug corrupt
// results), plus the goroutine rule, which is this backend's own.

package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unicode"

	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// Hazard is an unordered pair of conflicting accesses.
type Hazard = hazard.Hazard

// hazards is the checker and the calls that broke the goroutine rule.
type hazards struct {
	*hazard.Checker
	mu       sync.Mutex
	offOwner []error // calls that broke the goroutine rule (see onDevice)
}

func newHazards() *hazards { return &hazards{Checker: hazard.NewChecker()} }

func (h *hazards) violate(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.offOwner = append(h.offOwner, err)
}

func (h *hazards) violations() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.offOwner...)
}

func (h *hazards) err() error {
	var errs []error
	if err := h.Err(); err != nil {
		errs = append(errs, fmt.Errorf("cpu: %w", err))
	}
	if v := h.violations(); len(v) > 0 {
		errs = append(errs, fmt.Errorf("cpu: %d call(s) off the device goroutine; first: %w", len(v), v[0]))
	}
	return errors.Join(errs...)
}

// The goroutine rule (package backend's doc): only the device goroutine,
// the one that created the backend, may enqueue work or change resources.
// Hazard mode checks it at the top of every such method. Go does not
// expose goroutine ids; the first line of the goroutine's stack trace
// holds it, which is slow but only paid in hazard mode.

// backendMethod names the exported method of *Backend that the caller runs
// in (the first one up the stack), for the violation's message.
func backendMethod() string {
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		const recv = "/train/cpu.(*Backend)."
		if i := strings.Index(f.Function, recv); i >= 0 {
			name := f.Function[i+len(recv):]
			if name != "" && unicode.IsUpper(rune(name[0])) {
				return name
			}
		}
		if !more {
			return "a method"
		}
	}
}

// onDevice checks, in hazard mode, that the calling method runs on the
// device goroutine. A violation is returned and kept, so that the methods
// with no error result (Free, FreeHost) report it at the next Synchronize,
// and ThreadViolations lists it.
func (b *Backend) onDevice() error {
	if b.haz == nil {
		return nil
	}
	id := hazard.GoroutineID()
	if id == b.owner {
		return nil
	}
	err := fmt.Errorf("cpu: %s called on goroutine %d; only the device goroutine (%d, which created the backend) may call it",
		backendMethod(), id, b.owner)
	b.haz.violate(err)
	return err
}
