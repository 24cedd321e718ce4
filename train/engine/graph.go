// The schedule as a graph of ops (docs/DESIGN.md, "The schedule"), and the two
// interpreters that run it on a Backend: Sequential (list order, a sync
// after every op: the reference) and Pipelined (three device streams and
// host goroutines ordered only by the graph's edges, through events).
//
// A node belongs to one queue: the compute, device-to-host or
// host-to-device stream, or the host. Nodes on the same device queue run
// in list order (the stream's own order); edges are needed only between
// queues, and every edge is a real dependency: removing one lets the two
// ops race (the tests check that each removal is caught). The list order
// must be a topological order: a node's dependencies come before it.
//
// Limits: one graph per step; events are reused across runs of graphs of
// the same shape (a stream wait binds to the latest record at the moment
// it is enqueued, and the launcher records before it enqueues any wait on
// the record, so reuse is safe).

package engine

import (
	"errors"
	"fmt"
	"sync"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// Queue is where a node runs.
type Queue uint8

// Queues.
const (
	Compute Queue = iota // the device compute stream
	D2H                  // the device-to-host copy stream
	H2D                  // the host-to-device copy stream
	Host                 // a host goroutine (CPU Adam on the worker pool)
	// Comm is the device collectives' stream (several ranks with a
	// device communicator, dp.go): the ranks' sums run there, in list
	// order on every rank, beside the copies.
	Comm
	numQueues
)

func (q Queue) String() string {
	return [...]string{"compute", "d2h", "h2d", "host", "comm"}[q]
}

// NodeID indexes Graph.Nodes.
type NodeID int

// Node is one op of the schedule. Run enqueues device work on s (device
// queues) or does host work (s is nil).
type Node struct {
	Name  string
	Queue Queue
	Run   func(s backend.Stream) error
	Deps  []NodeID
	// Work is what a host node does, for a planner that cannot run it
	// (its buffers have no memory behind them when traced); zero on
	// device nodes, whose work a tracing backend records op by op.
	Work HostWork
	// AllReduce is the bytes a host node of data parallelism all-reduces
	// among the ranks (dp.go), for a planner to price on the
	// inter-process link; 0 on every other node.
	AllReduce int64
}

// HostWork describes a host node's CPU Adam: the elements it updates, the
// tensors they are in and the bytes it reads and writes
// (host.AdamBytesPerElement at the node's dtypes, plus any pass of its
// own). Host Adam streams through memory, so the bytes set its time.
type HostWork struct {
	Elems, Tensors, Bytes int64
}

// Edge is a dependency: To runs after From.
type Edge struct{ From, To NodeID }

// Graph is a schedule. Build it with Add.
type Graph struct {
	Nodes []Node
}

// Add appends a node after deps and returns its id.
func (g *Graph) Add(name string, q Queue, run func(backend.Stream) error, deps ...NodeID) NodeID {
	g.Nodes = append(g.Nodes, Node{Name: name, Queue: q, Run: run, Deps: deps})
	return NodeID(len(g.Nodes) - 1)
}

// Edges lists every dependency.
func (g *Graph) Edges() []Edge {
	var es []Edge
	for i, n := range g.Nodes {
		for _, d := range n.Deps {
			es = append(es, Edge{From: d, To: NodeID(i)})
		}
	}
	return es
}

// Without returns a copy of g with one edge removed (for tests that check
// every edge is needed).
func (g *Graph) Without(e Edge) *Graph {
	h := &Graph{Nodes: append([]Node(nil), g.Nodes...)}
	n := &h.Nodes[e.To]
	var deps []NodeID
	for _, d := range n.Deps {
		if d != e.From {
			deps = append(deps, d)
		}
	}
	n.Deps = deps
	return h
}

// Reduce returns g without the edges that other paths already imply
// (through other edges and the order of each device queue), so that every
// edge left is needed: removing any one lets two ops race. In a DAG the
// redundant edges are exactly those whose ends are also joined by a longer
// path, and dropping them all at once keeps the order.
func (g *Graph) Reduce() *Graph {
	n := len(g.Nodes)
	succ := make([][]int, n)
	var last [numQueues]int
	for q := range last {
		last[q] = -1
	}
	for i, nd := range g.Nodes {
		for _, d := range nd.Deps {
			succ[d] = append(succ[d], i)
		}
		if nd.Queue != Host {
			if p := last[nd.Queue]; p >= 0 {
				succ[p] = append(succ[p], i)
			}
			last[nd.Queue] = i
		}
	}
	// longer reports a path u -> ... -> v other than the direct step.
	seen := make([]int, n)
	stamp := 0
	longer := func(u, v int) bool {
		stamp++
		stack := []int{}
		for _, w := range succ[u] {
			if w != v && w < v && seen[w] != stamp {
				seen[w] = stamp
				stack = append(stack, w)
			}
		}
		for len(stack) > 0 {
			x := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, w := range succ[x] {
				if w == v {
					return true
				}
				if w < v && seen[w] != stamp {
					seen[w] = stamp
					stack = append(stack, w)
				}
			}
		}
		return false
	}
	h := &Graph{Nodes: append([]Node(nil), g.Nodes...)}
	for i := range h.Nodes {
		var deps []NodeID
		for _, d := range g.Nodes[i].Deps {
			if !longer(int(d), i) {
				deps = append(deps, d)
			}
		}
		h.Nodes[i].Deps = deps
	}
	return h
}

// Validate checks that every dependency comes earlier in the list and
// crosses queues (an edge within a device queue would be meaningless: the
// queue orders it already). Host nodes run on goroutines of their own, in
// no order but their edges', so an edge between two of them is allowed
// (data parallelism chains its collectives so).
func (g *Graph) Validate() error {
	for i, n := range g.Nodes {
		if n.Queue >= numQueues {
			return fmt.Errorf("schedule: node %d %q: bad queue %d", i, n.Name, n.Queue)
		}
		for _, d := range n.Deps {
			if d < 0 || int(d) >= i {
				return fmt.Errorf("schedule: node %d %q depends on node %d, which does not come before it", i, n.Name, d)
			}
			if g.Nodes[d].Queue == n.Queue && n.Queue != Host {
				return fmt.Errorf("schedule: edge %q -> %q stays on queue %v", g.Nodes[d].Name, n.Name, n.Queue)
			}
		}
	}
	return nil
}

// Streams are the device streams of the schedule: compute and the two
// copy streams, and the collectives' when the engine has a device
// communicator (nil otherwise).
type Streams struct {
	Compute, D2H, H2D, Comm backend.Stream
}

// NewStreams creates the copy streams; compute is the default stream.
// Destroy releases them.
func NewStreams(be backend.Backend) (Streams, error) {
	st := Streams{Compute: be.DefaultStream()}
	var err error
	if st.D2H, err = be.NewStream("d2h"); err != nil {
		return Streams{}, fmt.Errorf("engine: %w", err)
	}
	if st.H2D, err = be.NewStream("h2d"); err != nil {
		_ = be.DestroyStream(st.D2H) // the creation error is the one to report
		return Streams{}, fmt.Errorf("engine: %w", err)
	}
	return st, nil
}

// Destroy releases the copy streams (once the work on them has run); the
// compute stream is the backend's.
func (st Streams) Destroy(be backend.Backend) error {
	var errs []error
	for _, s := range []backend.Stream{st.D2H, st.H2D, st.Comm} {
		if s != nil {
			errs = append(errs, be.DestroyStream(s))
		}
	}
	return errors.Join(errs...)
}

func (st Streams) of(q Queue) backend.Stream {
	switch q {
	case Compute:
		return st.Compute
	case D2H:
		return st.D2H
	case H2D:
		return st.H2D
	case Comm:
		return st.Comm
	}
	return nil
}

// Interpreter runs a graph.
type Interpreter interface {
	// Run runs g. Device work may still be in flight on return (Pipelined);
	// synchronize the streams before reading results on the host.
	Run(g *Graph) error
}

// Sequential runs the nodes in list order and waits for each to finish
// before the next: the reference order of docs/DESIGN.md, "The schedule".
type Sequential struct {
	Backend backend.Backend
	Streams Streams
}

// Run implements Interpreter.
func (q Sequential) Run(g *Graph) error {
	if err := g.Validate(); err != nil {
		return err
	}
	for _, n := range g.Nodes {
		s := q.Streams.of(n.Queue)
		if err := n.Run(s); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		if s != nil {
			if err := q.Backend.Synchronize(s); err != nil {
				return fmt.Errorf("%s: %w", n.Name, err)
			}
		}
	}
	return nil
}

// Pipelined enqueues device nodes from the calling goroutine (the only
// one that talks to the device) and runs host nodes on goroutines of
// their own. A device node waits for a device dependency on another stream
// through an event; for a host dependency the launcher blocks until that
// host node is done, then enqueues (this is where the host is waited for,
// and only where the device needs its result). A host node waits for
// device dependencies with EventSynchronize. Build graphs so that nodes
// fed by host work come late in the list (after the work that can
// overlap with it), or the launcher stalls early.
type Pipelined struct {
	Backend backend.Backend
	Streams Streams
	events  []backend.Event
}

// NewPipelined returns a pipelined interpreter on st.
func NewPipelined(be backend.Backend, st Streams) *Pipelined {
	return &Pipelined{Backend: be, Streams: st}
}

// event is node i's event; Run has made it (ensure) before it starts, so
// that host goroutines only read the list.
func (p *Pipelined) event(i int) backend.Event { return p.events[i] }

// ensure makes the events of nodes up to i. Events are kept from step to
// step; Close destroys them.
func (p *Pipelined) ensure(i int) error {
	for len(p.events) <= i {
		e, err := p.Backend.NewEvent(fmt.Sprintf("node %d", len(p.events)))
		if err != nil {
			return fmt.Errorf("schedule: %w", err)
		}
		p.events = append(p.events, e)
	}
	return nil
}

// Close destroys the events the interpreter made; it may run again after,
// making new ones.
func (p *Pipelined) Close() error {
	var errs []error
	for _, e := range p.events {
		errs = append(errs, p.Backend.DestroyEvent(e))
	}
	p.events = nil
	return errors.Join(errs...)
}

// Run implements Interpreter.
func (p *Pipelined) Run(g *Graph) error {
	if err := g.Validate(); err != nil {
		return err
	}
	n := len(g.Nodes)
	// needEvent: a device node with a dependent on another queue records.
	needEvent := make([]bool, n)
	for _, nd := range g.Nodes {
		for _, d := range nd.Deps {
			if g.Nodes[d].Queue != Host {
				needEvent[d] = true
			}
		}
	}
	// Create the events before any host goroutine reads the list.
	for i := range needEvent {
		if needEvent[i] {
			if err := p.ensure(i); err != nil {
				return err
			}
		}
	}
	done := make([]chan struct{}, n)
	errs := make([]error, n)
	// A hazard-checking backend is told where goroutines hand work to each
	// other: a host node starts after what the device goroutine did before
	// starting it, and whoever waits for a host node is after its end.
	order, _ := p.Backend.(hostOrderer)
	ends := make([]hazard.Clock, n)
	var wg sync.WaitGroup
	defer wg.Wait() // never return with host work still running
	waitHost := func(d NodeID) error {
		<-done[d]
		if order != nil {
			order.HostJoin(ends[d])
		}
		if errs[d] != nil {
			return fmt.Errorf("%s: %w", g.Nodes[d].Name, errs[d])
		}
		return nil
	}
	for i := range g.Nodes {
		nd := &g.Nodes[i]
		if nd.Queue == Host {
			done[i] = make(chan struct{})
			var start hazard.Clock
			if order != nil {
				start = order.HostSnapshot()
			}
			wg.Add(1)
			go func(i int, nd *Node) {
				defer wg.Done()
				defer close(done[i])
				if order != nil {
					order.HostJoin(start)
					defer func() { ends[i] = order.HostSnapshot() }()
				}
				for _, d := range nd.Deps {
					if g.Nodes[d].Queue == Host {
						if err := waitHost(d); err != nil {
							errs[i] = err
							return
						}
						continue
					}
					if err := p.Backend.EventSynchronize(p.event(int(d))); err != nil {
						errs[i] = err
						return
					}
				}
				errs[i] = nd.Run(nil)
			}(i, nd)
			continue
		}
		s := p.Streams.of(nd.Queue)
		for _, d := range nd.Deps {
			if g.Nodes[d].Queue == Host {
				if err := waitHost(d); err != nil {
					return fmt.Errorf("%s: %w", nd.Name, err)
				}
				continue
			}
			if err := p.Backend.Wait(s, p.event(int(d))); err != nil {
				return fmt.Errorf("%s: %w", nd.Name, err)
			}
		}
		if err := nd.Run(s); err != nil {
			return fmt.Errorf("%s: %w", nd.Name, err)
		}
		if needEvent[i] {
			if err := p.Backend.Record(p.event(i), s); err != nil {
				return fmt.Errorf("%s: %w", nd.Name, err)
			}
		}
	}
	wg.Wait()
	if order != nil {
		for i, nd := range g.Nodes {
			if nd.Queue == Host {
				order.HostJoin(ends[i])
			}
		}
	}
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("%s: %w", g.Nodes[i].Name, err)
		}
	}
	return nil
}
