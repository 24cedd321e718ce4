// The event-driven simulation of a step graph: three device queues that
// each run their nodes in list order, and a host Adam pool.
//
// A device node starts when its queue is free (the node before it in the
// queue has finished) and its dependencies have finished: the pipelined
// interpreter's rule, where a stream waits on the events of its node's
// dependencies. One more rule comes from its launcher, the one goroutine
// that walks the list in order, enqueues device nodes and starts host
// nodes: at a device node with a host dependency it blocks until that
// host node is done, so no node later in the list starts (or, on the
// host, is even handed to the pool) before then. Host nodes go to the pool when their dependencies have
// finished and run one at a time, first come first served (ties in list
// order), each over every worker: the engine's host Adam splits one node's
// tensors across the whole pool (host.Workers.AdamStep). Running two at
// once, each at half speed, would finish the last of them at the same
// time; only the first would end later.
//
// Contention (Resources.SharesHost, the CPU backend): compute and host Adam
// run on the same cores. While both run, every runnable thread gets an
// equal share of the cores: with c cores, k compute threads and w workers
// (n = k + w > c), compute runs at k*c/(n*min(k, c)) of its speed alone and
// the host at w*c/(n*min(w, c)) of its own; or, where the machine has
// measured them (Resources.Contention), each queue at the measured
// shared/alone ratio for every other queue running. Each node's work is the time it
// takes alone; the simulation advances every running node at its current
// rate and recomputes the rates whenever a node starts or ends.
//
// Data parallelism adds host nodes that are collectives between ranks
// (Task.Net): they run one at a time on a network lane of their own, in
// the order they become ready, at the network's speed: a collective
// blocks one goroutine on the inter-process link, not the Adam pool, and
// its host-side sums are not counted as contention. With a device
// communicator the collectives are device nodes on the collectives'
// stream (engine.Comm), enqueued by the launcher like the other device
// nodes and run on the same network lane (Tasks chains them in list
// order, as their stream does); their device-side sums are not counted
// either.

package plan

import (
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// Task is one node to simulate.
type Task struct {
	Name  string
	Queue engine.Queue
	Deps  []int   // indices of earlier tasks
	Work  float64 // seconds when it runs alone
	// Net: a collective between ranks (a host node, or a device node on
	// the collectives' stream), run on the network lane instead of the
	// Adam pool or a device queue.
	Net bool
	// Parts are the node's ops in order (family and seconds alone), for
	// the timeline; a host node has one.
	Parts []Part
}

// Part is one op's share of a task.
type Part struct {
	Family  trace.Family
	Seconds float64
}

// Resources is what the simulation needs of the machine beyond the tasks'
// own times.
type Resources struct {
	SharesHost     bool // compute runs on the host cores
	Cores          int
	ComputeThreads int // 0: Cores
	Workers        int // host Adam pool (for the contention and the timeline's lanes)
	// Contention, when set, replaces the thread-count rule above with
	// measured factors: Contention[{a, b}] is the rate of a queue of kind
	// a while a queue of kind b runs too, relative to its rate alone (1
	// where absent); a queue's rate is the product over every other
	// running queue. The CPU machine (FromCalibration) sets it from
	// calibrate's Sharing pairs.
	Contention map[[2]Bound]float64
}

// Bound names what the critical path spends most of its time on.
type Bound string

// The bounds.
const (
	ComputeBound Bound = "compute"
	LinkBound    Bound = "link"
	HostBound    Bound = "host"
	NetBound     Bound = "net" // the collectives between ranks
)

// Result is a simulated step.
type Result struct {
	Step       float64 // makespan, s
	Start, End []float64
	// Busy is each queue's busy time (the host's: the pool's); NetBusy
	// the network lane's.
	Busy    [4]float64
	NetBusy float64
	// Critical is the chain of tasks that set the step time, first to
	// last: each started when the one before it ended.
	Critical []int
	// OnPath is the time the critical path spends on each kind of queue
	// (compute; link: d2h and h2d; host; net), and Bound the largest.
	OnPath map[Bound]float64
	Bound  Bound
	// Overlap is the sum of the queues' busy times (the network lane's
	// too) over the step time: 1 when nothing overlaps (every queue waits
	// for the others), up to 4 (5) when all are busy all the time. Busy / Step per queue is that
	// queue's utilisation.
	Overlap float64
}

// boundOf is the kind of a task's queue.
func boundOf(t Task) Bound {
	if t.Net {
		return NetBound
	}
	return queueBound(t.Queue)
}

// queueBound is the kind of a queue.
func queueBound(q engine.Queue) Bound {
	switch q {
	case engine.Compute:
		return ComputeBound
	case engine.Host:
		return HostBound
	}
	return LinkBound
}

// Simulate runs tasks (in a topological list order, as engine graphs are)
// to completion and reports the step.
func Simulate(tasks []Task, r Resources) (Result, error) {
	n := len(tasks)
	for i, t := range tasks {
		devNet := t.Queue == engine.Comm // a device collective: always on the network lane
		if t.Queue > engine.Comm || devNet != (t.Net && t.Queue != engine.Host) {
			return Result{}, fmt.Errorf("plan: task %d %q: bad queue %d", i, t.Name, t.Queue)
		}
		if !(t.Work >= 0) || math.IsInf(t.Work, 0) {
			return Result{}, fmt.Errorf("plan: task %d %q: work %g s", i, t.Name, t.Work)
		}
		for _, d := range t.Deps {
			if d < 0 || d >= i {
				return Result{}, fmt.Errorf("plan: task %d %q depends on %d, which does not come before it", i, t.Name, d)
			}
		}
	}
	res := Result{Start: make([]float64, n), End: make([]float64, n), OnPath: map[Bound]float64{}}
	// Each device queue's tasks in list order.
	var order [3][]int
	for i, t := range tasks {
		if t.Queue != engine.Host && !t.Net {
			order[t.Queue] = append(order[t.Queue], i)
		}
	}
	var next [3]int // the next task of each device queue
	var busy [3]int // the task running on each device queue, -1: none
	busy = [3]int{-1, -1, -1}
	// The host Adam pool and the network: each runs its ready tasks one
	// at a time, in arrival order.
	host, net := &lane{busy: -1, last: -1}, &lane{busy: -1, last: -1}
	queued := make([]bool, n)
	done := make([]bool, n)
	started := make([]bool, n)
	left := make([]float64, n)
	prev := make([]int, n) // the task whose end let each start (-1: none)
	// The launcher: nodes before lp have been passed. gate is the host node
	// whose end last let it go on, gateOf[i] that node when i was passed.
	lp, gate := 0, -1
	gateOf := make([]int, n)
	finished := 0
	now := 0.0

	depsDone := func(i int) bool {
		for _, d := range tasks[i].Deps {
			if !done[d] {
				return false
			}
		}
		return true
	}
	// binder is what i waited for: the latest to end of its dependencies
	// and the task before it on its queue (or the pool); i starts exactly
	// when it ends.
	binder := func(i, queuePrev int) int {
		b := queuePrev
		if g := gateOf[i]; g >= 0 && (b < 0 || res.End[g] > res.End[b]) {
			b = g
		}
		for _, d := range tasks[i].Deps {
			if b < 0 || res.End[d] > res.End[b] {
				b = d
			}
		}
		return b
	}
	start := func(i, queuePrev int) {
		started[i] = true
		res.Start[i] = now
		left[i] = tasks[i].Work
		prev[i] = binder(i, queuePrev)
	}
	finish := func(i int) {
		done[i] = true
		res.End[i] = now
		finished++
		q := tasks[i].Queue
		switch {
		case tasks[i].Net:
			net.busy = -1
			res.NetBusy += res.End[i] - res.Start[i]
			return
		case q == engine.Host:
			host.busy = -1
		default:
			busy[q] = -1
		}
		res.Busy[q] += res.End[i] - res.Start[i]
	}

	for finished < n {
		// Start everything that can start now; zero-work tasks end at once
		// and may free others, so repeat until nothing changes.
		for changed := true; changed; {
			changed = false
		launch:
			for lp < n {
				if tasks[lp].Queue != engine.Host {
					for _, d := range tasks[lp].Deps {
						if tasks[d].Queue != engine.Host {
							continue
						}
						if !done[d] {
							break launch
						}
						if gate < 0 || res.End[d] > res.End[gate] {
							gate = d
						}
					}
				}
				gateOf[lp] = gate
				lp++
			}
			for q := 0; q < 3; q++ {
				if busy[q] >= 0 || next[q] >= len(order[q]) {
					continue
				}
				i := order[q][next[q]]
				if i >= lp || !depsDone(i) {
					continue
				}
				qp := -1
				if next[q] > 0 {
					qp = order[q][next[q]-1]
				}
				next[q]++
				start(i, qp)
				busy[q] = i
				changed = true
				if tasks[i].Work == 0 {
					finish(i)
				}
			}
			for i := range tasks {
				if i < lp && (tasks[i].Queue == engine.Host || tasks[i].Net) && !queued[i] && depsDone(i) {
					queued[i] = true
					if tasks[i].Net {
						net.ready = append(net.ready, i)
					} else {
						host.ready = append(host.ready, i)
					}
				}
			}
			for _, l := range []*lane{net, host} {
				if l.busy >= 0 || len(l.ready) == 0 {
					continue
				}
				i := l.ready[0]
				l.ready = l.ready[1:]
				start(i, l.last)
				l.last, l.busy = i, i
				changed = true
				if tasks[i].Work == 0 {
					finish(i)
				}
			}
		}
		if finished == n {
			break
		}
		running := make([]int, 0, 4)
		for _, i := range busy {
			if i >= 0 {
				running = append(running, i)
			}
		}
		for _, l := range []*lane{host, net} {
			if l.busy >= 0 {
				running = append(running, l.busy)
			}
		}
		if len(running) == 0 {
			return Result{}, fmt.Errorf("plan: deadlock at %.6g s: %d of %d tasks finished", now, finished, n)
		}
		var on [4]bool
		for q, i := range busy {
			on[q] = i >= 0
		}
		on[engine.Host] = host.busy >= 0
		rate := rates(r, on)
		// The network lane is not slowed by the others (nor slows them).
		speed := func(i int) float64 {
			if tasks[i].Net {
				return 1
			}
			return rate(tasks[i].Queue)
		}
		dt := math.Inf(1)
		for _, i := range running {
			dt = math.Min(dt, left[i]/speed(i))
		}
		now += dt
		for _, i := range running {
			left[i] -= dt * speed(i)
			if left[i] <= 1e-12*math.Max(tasks[i].Work, 1e-9) {
				left[i] = 0
				finish(i)
			}
		}
	}
	res.Step = now
	if n == 0 {
		return res, nil
	}
	for _, b := range res.Busy {
		res.Overlap += b
	}
	res.Overlap += res.NetBusy
	if res.Step > 0 {
		res.Overlap /= res.Step
	}
	// The critical path: back from the task that ended last.
	last := 0
	for i := range tasks {
		if res.End[i] >= res.End[last] {
			last = i
		}
	}
	for i := last; i >= 0; i = prev[i] {
		res.Critical = append([]int{i}, res.Critical...)
		res.OnPath[boundOf(tasks[i])] += res.End[i] - res.Start[i]
	}
	res.Bound = ComputeBound
	for _, b := range []Bound{LinkBound, HostBound, NetBound} {
		if res.OnPath[b] > res.OnPath[res.Bound] {
			res.Bound = b
		}
	}
	return res, nil
}

// lane is a queue of host tasks that run one at a time, first come first
// served: the task running (-1: none), the one that ran last and those
// ready, in arrival order.
type lane struct {
	busy, last int
	ready      []int
}

// rates returns each queue's speed given which queues are running (see
// the file comment).
func rates(r Resources, on [4]bool) func(engine.Queue) float64 {
	var rate [4]float64
	for q := range rate {
		rate[q] = 1
	}
	if r.Contention != nil {
		// Measured: each running queue slowed by every other one running.
		for q := range rate {
			for o := range rate {
				if o != q && on[q] && on[o] {
					if f, ok := r.Contention[[2]Bound{queueBound(engine.Queue(q)), queueBound(engine.Queue(o))}]; ok {
						rate[q] *= f
					}
				}
			}
		}
	} else if r.SharesHost && on[engine.Compute] && on[engine.Host] {
		c := max(r.Cores, 1)
		k := r.ComputeThreads
		if k <= 0 {
			k = c
		}
		w := max(r.Workers, 1)
		if nt := k + w; nt > c {
			rate[engine.Compute] = float64(k*c) / float64(nt*min(k, c))
			rate[engine.Host] = float64(w*c) / float64(nt*min(w, c))
		}
	}
	return func(q engine.Queue) float64 { return rate[q] }
}
