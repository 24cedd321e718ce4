// Package hazard finds work that streams may run in either order although
// it touches the same bytes: the CPU backend's test mode (train/cpu,
// Config.HazardCheck) and Wrap, which puts the same check around any
// backend (the CUDA one under test).
//
// Every op declares the byte ranges it reads and writes (access.go, one
// declaration per op, shared by both). Happens-before is tracked with vector
// clocks, one entry per actor (actor Host is the host, then one per
// stream): an op is ordered after everything earlier on its stream, after
// what the host did before enqueueing it, and, through a wait, after
// everything before the record the wait binds to. Two accesses to
// overlapping bytes, at least one a write, that are not ordered this way are
// a hazard. The check is made when ops are enqueued, so it finds a missing
// edge whatever the timing of the run: deterministically, not by chance.
package hazard

import (
	"fmt"
	"sync"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Host is the actor of host code; streams are actors 1, 2, ...
const Host = 0

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

// Checker keeps the clocks and the live accesses. Events are keyed by any
// comparable value (the backend's event handle). Its methods are safe for
// concurrent use; the order of calls is the order of enqueueing.
type Checker struct {
	mu     sync.Mutex
	clocks []vclock
	events map[any]vclock   // clock at the latest record of each event
	hist   map[int][]access // live accesses by buffer id
	found  []Hazard
}

// NewChecker returns a checker with no history.
func NewChecker() *Checker {
	return &Checker{events: map[any]vclock{}, hist: map[int][]access{}}
}

func (h *Checker) clock(actor int) *vclock {
	for len(h.clocks) <= actor {
		h.clocks = append(h.clocks, nil)
	}
	return &h.clocks[actor]
}

// Access checks and records one op's accesses by actor (Host, or a
// stream's actor).
func (h *Checker) Access(actor int, name string, reads, writes []backend.Range) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.clock(actor)
	if actor != Host {
		c.join(*h.clock(Host)) // the host enqueues after its earlier work
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

// Record is a record of ev enqueued by actor: later waits on ev are
// ordered after what actor (and the host) did before it.
func (h *Checker) Record(ev any, actor int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.clock(actor)
	c.join(*h.clock(Host))
	h.events[ev] = append(vclock(nil), *c...)
}

// Wait is a wait of actor on ev: it binds to ev's latest record.
func (h *Checker) Wait(actor int, ev any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(actor).join(h.events[ev])
}

// Forget drops a destroyed event's clock.
func (h *Checker) Forget(ev any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.events, ev)
}

// HostJoinsStream: the host waited for everything enqueued on actor.
func (h *Checker) HostJoinsStream(actor int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(Host).join(*h.clock(actor))
}

// HostJoinsEvent: the host waited for ev's latest record.
func (h *Checker) HostJoinsEvent(ev any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(Host).join(h.events[ev])
}

// Hazards lists the hazards found so far.
func (h *Checker) Hazards() []Hazard {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Hazard(nil), h.found...)
}

// Err is nil, or an error naming how many hazards were found and the
// first.
func (h *Checker) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.found) == 0 {
		return nil
	}
	return fmt.Errorf("%d hazard(s); first: %v", len(h.found), h.found[0])
}
