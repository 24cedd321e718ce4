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

// Host, passed as an actor, is the calling goroutine's host actor: each
// goroutine that declares host accesses, enqueues work or waits for it is
// an actor of its own (keyed by its goroutine id), so that a host node
// running on a worker goroutine is not taken to be ordered with what the
// device goroutine enqueued meanwhile. Goroutines are ordered with each
// other only where code says so: Snapshot where one hands work to another
// (a `go` statement, a channel send) and Join where the other takes it.
// Streams are actors 1, 2, ...
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

// vclock is a vector clock: for each actor, how many of its steps are
// ordered before this point. Host goroutines have negative actor keys.
type vclock map[int]uint64

func (v vclock) join(o vclock) {
	for a, x := range o {
		if x > v[a] {
			v[a] = x
		}
	}
}

func (v vclock) copy() vclock {
	c := make(vclock, len(v))
	c.join(v)
	return c
}

// Clock is a point in one goroutine's order (Snapshot), for Join.
type Clock struct{ v vclock }

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
	clocks map[int]vclock
	events map[any]vclock   // clock at the latest record of each event
	hist   map[int][]access // live accesses by buffer id
	found  []Hazard
}

// NewChecker returns a checker with no history.
func NewChecker() *Checker {
	return &Checker{clocks: map[int]vclock{}, events: map[any]vclock{}, hist: map[int][]access{}}
}

// hostActor is the calling goroutine's actor key.
func hostActor() int { return -int(GoroutineID()) - 1 }

func (h *Checker) clock(actor int) vclock {
	if actor == Host {
		actor = hostActor()
	}
	c, ok := h.clocks[actor]
	if !ok {
		c = vclock{}
		h.clocks[actor] = c
	}
	return c
}

// Access checks and records one op's accesses by actor (Host, or a
// stream's actor, for an op the calling goroutine enqueues on it).
func (h *Checker) Access(actor int, name string, reads, writes []backend.Range) {
	h.mu.Lock()
	defer h.mu.Unlock()
	host := h.clock(Host)
	if actor == Host {
		actor = hostActor()
	}
	c := h.clock(actor)
	c.join(host) // the enqueuer's earlier work comes first
	c[actor]++
	seq := c[actor]
	now := c
	ordered := func(a access) bool { return now[a.actor] >= a.seq }
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

// Record is a record of ev on actor's stream, enqueued by the calling
// goroutine: later waits on ev are ordered after what actor and the
// enqueuer did before it.
func (h *Checker) Record(ev any, actor int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.clock(actor)
	c.join(h.clock(Host))
	h.events[ev] = c.copy()
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

// HostJoinsStream: the calling goroutine waited for everything enqueued
// on actor.
func (h *Checker) HostJoinsStream(actor int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(Host).join(h.clock(actor))
}

// HostJoinsEvent: the calling goroutine waited for ev's latest record.
func (h *Checker) HostJoinsEvent(ev any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(Host).join(h.events[ev])
}

// Snapshot is the calling goroutine's point in the order, for another
// goroutine to Join when it is handed work (started by a go statement
// after this call, or woken by a channel this goroutine closes after it).
func (h *Checker) Snapshot() Clock {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Clock{h.clock(Host).copy()}
}

// Join orders the calling goroutine after the point c of another.
func (h *Checker) Join(c Clock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock(Host).join(c.v)
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
