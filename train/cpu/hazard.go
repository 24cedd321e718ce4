// Hazard checking for the CPU backend's test mode.
//
// Every op declares the byte ranges it reads and writes. Happens-before is
// tracked with vector clocks, one entry per actor (actor 0 is the host, then
// one per stream): an op is ordered after everything earlier on its stream,
// after what the host did before enqueueing it, and, through Wait, after
// everything before the Record the wait binds to. Two accesses to
// overlapping bytes, at least one a write, that are not ordered this way are
// a hazard. The check is made when ops are enqueued, so it finds a missing
// edge whatever the timing of the run; the random delays of test mode then
// also make such a bug corrupt results.

package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unicode"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

const hostActor = 0

// Hazard is an unordered pair of conflicting accesses.
type Hazard struct {
	Op, Prev string // the op that found it and the earlier access
	Range    backend.Range
}

func (h Hazard) String() string {
	return fmt.Sprintf("hazard: %q and earlier %q touch buffer %d bytes [%d,%d) with no stream or event ordering them",
		h.Op, h.Prev, h.Range.Buf, h.Range.Lo, h.Range.Hi)
}

type vclock []uint64

func (v vclock) at(i int) uint64 {
	if i < len(v) {
		return v[i]
	}
	return 0
}

func (v *vclock) join(o vclock) {
	for len(*v) < len(o) {
		*v = append(*v, 0)
	}
	for i, x := range o {
		(*v)[i] = max((*v)[i], x)
	}
}

type access struct {
	r     backend.Range
	write bool
	actor int
	seq   uint64
	name  string
}

type hazards struct {
	mu       sync.Mutex
	clocks   []vclock
	events   map[*event]vclock // clock at the latest record of each event
	hist     map[int][]access  // live accesses by buffer id
	found    []Hazard
	offOwner []error // calls that broke the goroutine rule (see onDevice)
}

func newHazards() *hazards {
	return &hazards{events: map[*event]vclock{}, hist: map[int][]access{}}
}

func (h *hazards) clock(actor int) *vclock {
	for len(h.clocks) <= actor {
		h.clocks = append(h.clocks, nil)
	}
	return &h.clocks[actor]
}

// access checks and records one op's accesses. st is nil for the host.
func (h *hazards) access(actor int, st *stream, name string, reads, writes []backend.Range) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.clock(actor)
	if actor != hostActor {
		c.join(*h.clock(hostActor)) // the host enqueues after its earlier work
	}
	for len(*c) <= actor {
		*c = append(*c, 0)
	}
	(*c)[actor]++
	seq := (*c)[actor]
	now := *c
	ordered := func(a access) bool { return now.at(a.actor) >= a.seq }
	check := func(r backend.Range, write bool) {
		for _, a := range h.hist[r.Buf] {
			if (write || a.write) && a.r.Overlaps(r) && !ordered(a) {
				h.found = append(h.found, Hazard{Op: name, Prev: a.name, Range: r})
			}
		}
	}
	for _, r := range reads {
		check(r, false)
	}
	for _, r := range writes {
		check(r, true)
	}
	add := func(r backend.Range, write bool) {
		// Drop earlier accesses this one covers and is ordered after: any
		// later access unordered with them is unordered with this one too.
		list := h.hist[r.Buf][:0]
		for _, a := range h.hist[r.Buf] {
			covered := a.r.Lo >= r.Lo && a.r.Hi <= r.Hi && ordered(a)
			if covered && (write || (!a.write && a.actor == actor)) {
				continue
			}
			list = append(list, a)
		}
		h.hist[r.Buf] = append(list, access{r: r, write: write, actor: actor, seq: seq, name: name})
	}
	for _, r := range reads {
		add(r, false)
	}
	for _, r := range writes {
		add(r, true)
	}
}

func (h *hazards) record(ev *event, gen uint64, actor int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.clock(actor)
	c.join(*h.clock(hostActor))
	h.events[ev] = append(vclock(nil), *c...)
}

func (h *hazards) wait(actor int, ev *event, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(actor).join(h.events[ev])
}

// forget drops a destroyed event's clock.
func (h *hazards) forget(ev *event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.events, ev)
}

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

func (h *hazards) hostJoinsStream(actor int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(hostActor).join(*h.clock(actor))
}

func (h *hazards) hostJoinsEvent(ev *event, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(hostActor).join(h.events[ev])
}

func (h *hazards) list() []Hazard {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Hazard(nil), h.found...)
}

func (h *hazards) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	if len(h.found) > 0 {
		errs = append(errs, fmt.Errorf("cpu: %d hazard(s); first: %v", len(h.found), h.found[0]))
	}
	if len(h.offOwner) > 0 {
		errs = append(errs, fmt.Errorf("cpu: %d call(s) off the device goroutine; first: %w", len(h.offOwner), h.offOwner[0]))
	}
	return errors.Join(errs...)
}

// The goroutine rule (package backend's doc): only the device goroutine,
// the one that created the backend, may enqueue work or change resources.
// Hazard mode checks it at the top of every such method. Go does not
// expose goroutine ids; the first line of the goroutine's stack trace
// holds it, which is slow but only paid in hazard mode.

// goid is the id of the calling goroutine.
func goid() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	s := strings.TrimPrefix(string(buf[:n]), "goroutine ")
	if i := strings.IndexByte(s, ' '); i > 0 {
		if id, err := strconv.ParseUint(s[:i], 10, 64); err == nil {
			return id
		}
	}
	return 0
}

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
	id := goid()
	if id == b.owner {
		return nil
	}
	err := fmt.Errorf("cpu: %s called on goroutine %d; only the device goroutine (%d, which created the backend) may call it",
		backendMethod(), id, b.owner)
	b.haz.violate(err)
	return err
}
