// Package profile measures where a training step's time goes on the
// backend at hand (lsp-train profile): every device op timed by a pair of
// events on its stream (train/trace.WrapTimed) and attributed to the
// engine node that enqueued it, every host node of the step timed by the
// wall clock, then summed by phase (forward, backward, optimizer,
// device-host communication, projector check, host Adam), by op family
// (train/trace's) and by stream, with each stream's idle time.
//
// A Recorder wraps the backend a run trains on and edits the engine's
// step graphs (engine.EditGraphs) so that each device node names itself
// to the tracer before it enqueues its ops and each host node is timed;
// Step reads the ops of the step just taken.
//
// Limits: the attribution rests on device nodes being enqueued from one
// goroutine (the engine's launcher) and host nodes enqueuing no device
// op, which the engine's interpreters guarantee. The events add two
// records per op, a few microseconds on a GPU, well under one on the CPU
// backend. Host Adam nodes that overlap one another are summed in the
// host-adam phase and merged in the host stream's busy time.
package profile

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// Phase is a part of a step.
type Phase string

// The phases. Device phases are sums of op times by events; HostAdam is
// the wall time of the host nodes.
const (
	Forward   Phase = "forward"
	Backward  Phase = "backward"  // gradients, LSP's compression within, zeroing and the non-finite flag
	Optimizer Phase = "optimizer" // device AdamW, LSP's apply of Delta
	Comm      Phase = "comm"      // device-host copies (on the copy streams, and the step's own readbacks)
	Check     Phase = "check"     // the projector check's device ops (lsp --fit)
	Other     Phase = "other"     // the rest: the gradient norm, staging between steps
	HostAdam  Phase = "host-adam" // wall clock: CPU Adam on the host nodes
)

// Phases lists the phases in table order.
func Phases() []Phase {
	return []Phase{Forward, Backward, Optimizer, Comm, Check, Other, HostAdam}
}

// HostStream is the name of the host nodes' "stream" in Step.Busy.
const HostStream = "host"

// Node ids that are not nodes: ops enqueued before the step's graph (a
// projector check, the first step's setup) and between or after its
// nodes (the drain, the loss readback, the gradient norm).
const (
	beforeGraph = -2
	outsideNode = -3
)

// Recorder profiles the steps of one engine.
type Recorder struct {
	tb *trace.Backend
	// rank, when above 0, is lora's: Step sums the GEMMs with it as a
	// size as the adapters' (CountAdapters).
	rank int

	mu     sync.Mutex
	names  []string       // the nodes of this step's graphs, by id
	queues []engine.Queue // their queues
	host   []span         // host nodes' wall spans this step
}

type span struct{ from, to time.Time }

// Wrap returns a recorder of the ops of be, which must time events
// (backend.ElapsedTime): every backend does but a bare tracer.
func Wrap(be backend.Backend) *Recorder {
	return &Recorder{tb: trace.WrapTimed(be)}
}

// CountAdapters makes each Step sum, in Adapters, the GEMMs with rank
// as one of their sizes (trace.Op.LowRank): lora's adapter GEMMs when
// rank is --lora-r, so that the unfused adapter path's share of a step
// is measured, not only planned.
func (r *Recorder) CountAdapters(rank int) { r.rank = rank }

// Backend is the wrapped backend to train on.
func (r *Recorder) Backend() backend.Backend { return r.tb }

// Start attaches the recorder to e and forgets the ops recorded so far
// (the setup's), so that the first Step is the first step's.
func (r *Recorder) Start(e *engine.Engine) error {
	e.EditGraphs(r.edit)
	return r.forget()
}

// forget resolves and drops the ops recorded so far.
func (r *Recorder) forget() error {
	if _, err := r.tb.Times(); err != nil { // destroys their events
		return fmt.Errorf("profile: %w", err)
	}
	r.tb.Reset()
	r.tb.SetNode(beforeGraph)
	r.mu.Lock()
	r.names, r.queues, r.host = nil, nil, nil
	r.mu.Unlock()
	return nil
}

// edit wraps each node's Run: a device node tells the tracer its id for
// the ops it enqueues, a host node records its wall span. A step that is
// taken again (a skipped non-finite attempt) adds a second graph; ids
// continue.
func (r *Recorder) edit(g *engine.Graph) *engine.Graph {
	h := &engine.Graph{Nodes: slices.Clone(g.Nodes)}
	r.mu.Lock()
	base := len(r.names)
	for _, n := range h.Nodes {
		r.names = append(r.names, n.Name)
		r.queues = append(r.queues, n.Queue)
	}
	r.mu.Unlock()
	for i := range h.Nodes {
		n := &h.Nodes[i]
		id, run := base+i, n.Run
		if n.Queue == engine.Host {
			n.Run = func(s backend.Stream) error {
				t0 := time.Now()
				err := run(s)
				t1 := time.Now()
				r.mu.Lock()
				r.host = append(r.host, span{t0, t1})
				r.mu.Unlock()
				return err
			}
			continue
		}
		n.Run = func(s backend.Stream) error {
			r.tb.SetNode(id)
			err := run(s)
			r.tb.SetNode(outsideNode)
			return err
		}
	}
	return h
}

// Times are a step's wall times, from the trainer (train.StepTimes).
type Times struct {
	Wall, Engine, Check float64
}

// Step is where one step's time went, in seconds.
type Step struct {
	Times
	Device    float64 // every op's time summed
	Ops       int
	Phases    map[Phase]float64
	Families  map[trace.Family]float64
	FamilyOps map[trace.Family]int
	// Adapters and AdapterOps are the time and count of lora's adapter
	// GEMMs, part of Families[trace.Gemm] (CountAdapters; 0 without).
	Adapters   float64
	AdapterOps int
	// Busy is each stream's time running ops of the engine step (the
	// check's excluded) and, for HostStream, the host nodes' spans
	// merged; Idle is the engine step's wall time minus Busy (never
	// below 0: a stream's ops may run on after the engine's Step
	// returned only if it did not drain, which it does).
	Busy, Idle map[string]float64
}

// Step waits for the ops of the step just taken and returns their
// breakdown, then starts the next step's.
func (r *Recorder) Step(t Times) (Step, error) {
	ops, err := r.tb.Times()
	if err != nil {
		return Step{}, fmt.Errorf("profile: %w", err)
	}
	r.mu.Lock()
	names, queues, host := r.names, r.queues, r.host
	r.mu.Unlock()
	st := summarize(ops, names, queues, host, t, r.rank)
	return st, r.forget()
}

// summarize sums ops (their Node an index of names and queues, or one of
// the markers) and the host spans into a Step, the GEMMs with rank as a
// size as lora's adapters' when rank is above 0.
func summarize(ops []trace.Op, names []string, queues []engine.Queue, host []span, t Times, rank int) Step {
	st := Step{Times: t, Phases: map[Phase]float64{}, Busy: map[string]float64{}, Idle: map[string]float64{}, Ops: len(ops)}
	st.Families, st.FamilyOps, st.Device = trace.ByFamily(ops)
	for _, o := range ops {
		p := phaseOf(o, names, queues, t.Check > 0)
		st.Phases[p] += o.Seconds
		if p != Check {
			st.Busy[o.Stream] += o.Seconds
		}
		if o.LowRank(rank) {
			st.Adapters += o.Seconds
			st.AdapterOps++
		}
	}
	for _, s := range host {
		st.Phases[HostAdam] += s.to.Sub(s.from).Seconds()
	}
	if slices.Contains(queues, engine.Host) {
		st.Busy[HostStream] = merged(host) // 0 when no host node ran (all skipped)
	}
	for s, b := range st.Busy {
		st.Idle[s] = max(t.Engine-b, 0)
	}
	return st
}

// phaseOf is the phase of o: by the node that enqueued it, or outside
// any node by whether a check ran before the graph and whether it
// crosses the link.
func phaseOf(o trace.Op, names []string, queues []engine.Queue, checked bool) Phase {
	if o.Node >= 0 && o.Node < len(names) {
		if q := queues[o.Node]; q == engine.D2H || q == engine.H2D {
			return Comm
		}
		name := names[o.Node]
		switch {
		case strings.HasPrefix(name, "forward"):
			return Forward
		case strings.HasPrefix(name, "backward"), name == "zero grads", name == "non-finite flag":
			return Backward
		case strings.HasSuffix(name, "adamw"), strings.HasPrefix(name, "apply"):
			return Optimizer
		}
		return Other
	}
	switch {
	case o.Node == beforeGraph && checked:
		return Check
	case o.Link != trace.NoLink:
		return Comm
	}
	return Other
}

// merged is the length of the union of the spans.
func merged(spans []span) float64 {
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b span) int { return a.from.Compare(b.from) })
	if len(s) == 0 {
		return 0
	}
	total := 0.0
	cur := s[0]
	for _, x := range s[1:] {
		if x.from.After(cur.to) {
			total += cur.to.Sub(cur.from).Seconds()
			cur = x
			continue
		}
		if x.to.After(cur.to) {
			cur.to = x.to
		}
	}
	return total + cur.to.Sub(cur.from).Seconds()
}
