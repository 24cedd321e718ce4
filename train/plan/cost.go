// The cost model and the prediction of a step from the engine's graph.

package plan

import (
	"fmt"
	"math"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// OpTime is the time of one recorded op on m, alone: a copy across the
// link latency + bytes/bandwidth of its direction; any other op its
// measured time when GPU.Measured has one, else max(FLOPs/(peak*eff),
// bytes/(memory bandwidth*eff)) + the launch overhead, peak the bf16
// tensor rate for bf16 GEMMs and attention and the fp32 rate for
// everything else.
func (m Machine) OpTime(o trace.Op) float64 {
	switch o.Link {
	case trace.H2D:
		return m.Link.Latency + float64(o.Bytes)/m.Link.H2D
	case trace.D2H:
		return m.Link.Latency + float64(o.Bytes)/m.Link.D2H
	}
	if m.GPU.Measured != nil {
		if t, ok := m.GPU.Measured(o); ok {
			return t
		}
	}
	eff := 1.0
	if e, ok := m.GPU.Eff[o.Family]; ok {
		eff = e
	}
	peak := m.GPU.PeakF32
	if o.DType == backend.BF16 && (o.Family == trace.Gemm || o.Family == trace.Attention) {
		peak = m.GPU.PeakBF16
	}
	return math.Max(o.FLOPs/(peak*eff), float64(o.Bytes)/(m.GPU.MemBW*eff)) + m.GPU.Launch
}

// HostTime is the time of a host Adam node alone on the pool.
func (m Machine) HostTime(w engine.HostWork) float64 {
	return m.Host.AdamOverhead + float64(w.Bytes)/m.Host.AdamRate()
}

// Resources is the machine's side of the simulation.
func (m Machine) Resources() Resources {
	return Resources{SharesHost: m.GPU.SharesHost, Cores: m.Host.Cores, ComputeThreads: m.GPU.ComputeThreads, Workers: m.Host.workers(),
		Contention: m.GPU.Contention}
}

// Tasks costs every node of g on m: a device node is the sum of its ops'
// times (ops attributes them by trace.Op.Node), a host node its HostWork's,
// a collective between ranks (Node.AllReduce) its time on m.Net.
func Tasks(g *engine.Graph, ops []trace.Op, m Machine) ([]Task, error) {
	tasks := make([]Task, len(g.Nodes))
	lastComm := -1
	for i, n := range g.Nodes {
		tasks[i] = Task{Name: n.Name, Queue: n.Queue}
		for _, d := range n.Deps {
			tasks[i].Deps = append(tasks[i].Deps, int(d))
		}
		switch {
		case n.Queue == engine.Host && n.AllReduce > 0:
			t := m.Net.AllReduceTime(n.AllReduce, m.Ranks)
			tasks[i].Work, tasks[i].Net = t, true
			tasks[i].Parts = []Part{{Family: AllReduce, Seconds: t}}
		case n.Queue == engine.Comm:
			// A device collective (NCCL): on the network lane, after
			// the one before it on its stream.
			t := m.Net.AllReduceTime(n.AllReduce, m.Ranks)
			tasks[i].Work, tasks[i].Net = t, true
			tasks[i].Parts = []Part{{Family: AllReduce, Seconds: t}}
			if lastComm >= 0 {
				tasks[i].Deps = append(tasks[i].Deps, lastComm)
			}
			lastComm = i
		case n.Queue == engine.Host:
			t := m.HostTime(n.Work)
			tasks[i].Work = t
			tasks[i].Parts = []Part{{Family: HostAdam, Seconds: t}}
		}
	}
	for _, o := range ops {
		if o.Node < 0 || o.Node >= len(tasks) {
			return nil, fmt.Errorf("plan: op %s attributed to node %d of %d", o.Method, o.Node, len(tasks))
		}
		t := &tasks[o.Node]
		if t.Queue == engine.Host {
			return nil, fmt.Errorf("plan: op %s recorded in host node %q", o.Method, t.Name)
		}
		s := m.OpTime(o)
		t.Work += s
		t.Parts = append(t.Parts, Part{Family: o.Family, Seconds: s})
	}
	return tasks, nil
}

// HostAdam is the timeline family of host Adam nodes.
const HostAdam trace.Family = "host adam"

// AllReduce is the timeline family of the collectives between ranks.
const AllReduce trace.Family = "all-reduce"

// Trace builds the engine's step graph for arch on a tracing backend and
// records the ops of every device node (host nodes are not run). It costs
// no memory beyond the graph and the op list.
func Trace(arch model.Arch, B, T, accum int, dt backend.DType, cfg engine.Config) (*engine.Graph, []trace.Op, error) {
	tb := trace.New()
	g, err := engine.TraceStep(tb, arch, B, T, accum, dt, cfg)
	if err != nil {
		return nil, nil, err
	}
	tb.Reset() // the set-up's uploads are not the step's
	d2h, err := tb.NewStream("d2h")
	if err != nil {
		return nil, nil, err
	}
	h2d, err := tb.NewStream("h2d")
	if err != nil {
		return nil, nil, err
	}
	cs, err := tb.NewStream("comm")
	if err != nil {
		return nil, nil, err
	}
	streams := map[engine.Queue]backend.Stream{engine.Compute: tb.DefaultStream(), engine.D2H: d2h, engine.H2D: h2d, engine.Comm: cs}
	for i, n := range g.Nodes {
		if n.Queue == engine.Host {
			continue
		}
		tb.SetNode(i)
		if err := n.Run(streams[n.Queue]); err != nil {
			return nil, nil, fmt.Errorf("plan: tracing %s: %w", n.Name, err)
		}
	}
	return g, tb.Recorded(), nil
}

// Prediction is a predicted step.
type Prediction struct {
	Result
	Tasks []Task
}

// Predict simulates graph g, whose device ops are ops, on m.
func Predict(g *engine.Graph, ops []trace.Op, m Machine) (Prediction, error) {
	if err := m.Validate(); err != nil {
		return Prediction{}, err
	}
	tasks, err := Tasks(g, ops, m)
	if err != nil {
		return Prediction{}, err
	}
	res, err := Simulate(tasks, m.Resources())
	if err != nil {
		return Prediction{}, err
	}
	return Prediction{Result: res, Tasks: tasks}, nil
}

// Sequential returns tasks as the sequential interpreter runs them: each
// after the one before it in list order, whatever its queue.
func Sequential(tasks []Task) []Task {
	out := make([]Task, len(tasks))
	for i, t := range tasks {
		t.Deps = nil
		if i > 0 {
			t.Deps = []int{i - 1}
		}
		out[i] = t
	}
	return out
}

// Sync is the timeline family of the schedule's own costs (a node's
// Synchronize, event records and waits).
const Sync trace.Family = "sync"

// Schedule returns tasks as the interpreter of the schedule runs them on
// m: sequential (Sequential, each device node followed by m.GPU.Sync) or
// pipelined (each dependency across queues adding m.GPU.Event to the
// dependent node: a record and a wait, or a host node's EventSynchronize).
func Schedule(tasks []Task, m Machine, pipelined bool) []Task {
	if !pipelined {
		out := Sequential(tasks)
		for i := range out {
			if out[i].Queue != engine.Host && m.GPU.Sync > 0 {
				out[i].Work += m.GPU.Sync
				out[i].Parts = append(slices.Clone(out[i].Parts), Part{Family: Sync, Seconds: m.GPU.Sync})
			}
		}
		return out
	}
	out := slices.Clone(tasks)
	for i, t := range out {
		k := 0
		for _, d := range t.Deps {
			if q := tasks[d].Queue; q != t.Queue && q != engine.Host {
				k++
			}
		}
		if k > 0 && m.GPU.Event > 0 {
			e := float64(k) * m.GPU.Event
			out[i].Work += e
			out[i].Parts = append(slices.Clone(t.Parts), Part{Family: Sync, Seconds: e})
		}
	}
	return out
}

// Config is one planning question: a model, its batch and an engine
// configuration (its Mode, LSP and LoRA flags and Pipelined schedule).
type Config struct {
	Arch        model.Arch
	B, T, Accum int
	DType       backend.DType
	Engine      engine.Config
	// Memory is the run's memory plan when the caller has it (lsp-train
	// plan: train.MemoryOf, with the run's own host memory); nil: the
	// engine's (engine.MemoryOf).
	Memory *engine.Memory
	// DeviceCollectives: with several ranks the device sums what it
	// reads back (NCCL, engine.Config.DeviceComm), else the host.
	DeviceCollectives bool
}

// engineFor is c's engine configuration on m: with several ranks, the
// graph of one rank of a data-parallel run.
func (c Config) engineFor(m Machine) engine.Config {
	ec := c.Engine
	if m.Ranks > 1 && ec.Comm == nil {
		ec.Comm = comm.Planned{Ranks: m.Ranks}
	}
	if m.Ranks > 1 && ec.DeviceComm == nil && c.DeviceCollectives {
		ec.DeviceComm = engine.PlannedDevice{Ranks: m.Ranks}
	}
	return ec
}

// Report is the plan of one configuration on one machine.
type Report struct {
	Memory         engine.Memory
	DeviceInBudget bool // Memory.DeviceTotal() <= the GPU's Budget
	HostInBudget   bool // Memory.HostPeak() <= the host's memory
	Prediction
	TokensPerSec float64 // B*T*Accum*Ranks / step: every rank's tokens
	// NetBytes is what one rank sends over the network per step (the
	// collectives' payload, AllReduceBytes), and as much it receives;
	// NetSeconds the collectives' time on it.
	NetBytes   int64
	NetSeconds float64
	// FitSeconds is the projector fits of one check, lsp mode with
	// fitting (FitTime: every fit for its whole budget).
	FitSeconds float64
	// RefreshSeconds is galore mode's refresh of every matrix's
	// projector (RefreshTime), once every --galore-every steps.
	RefreshSeconds float64
	// AdapterSeconds is lora mode's adapter GEMMs (trace.Op.LowRank at
	// the rank), each costed alone, and AdapterGemms their count: the
	// unfused adapter path whose share of the step decides whether a
	// fused kernel is worth writing (issue 37: above 10%).
	AdapterSeconds float64
	AdapterGemms   int
}

// Plan predicts the memory and the step time of c on m.
func Plan(c Config, m Machine) (Report, error) {
	var mem engine.Memory
	if c.Memory != nil {
		mem = *c.Memory
	} else {
		var err error
		if mem, err = engine.MemoryOf(c.Arch, c.B, c.T, c.Accum, c.DType, c.engineFor(m)); err != nil {
			return Report{}, err
		}
	}
	if err := m.Validate(); err != nil {
		return Report{}, err
	}
	g, ops, err := Trace(c.Arch, c.B, c.T, c.Accum, c.DType, c.engineFor(m))
	if err != nil {
		return Report{}, err
	}
	tasks, err := Tasks(g, ops, m)
	if err != nil {
		return Report{}, err
	}
	tasks = Schedule(tasks, m, c.Engine.Pipelined)
	res, err := Simulate(tasks, m.Resources())
	if err != nil {
		return Report{}, err
	}
	r := Report{Memory: mem, DeviceInBudget: mem.DeviceTotal() <= m.GPU.Budget(), HostInBudget: mem.HostPeak() <= m.Host.Memory,
		Prediction: Prediction{Result: res, Tasks: tasks}}
	if res.Step > 0 {
		r.TokensPerSec = float64(c.B*c.T*c.Accum*max(m.Ranks, 1)) / res.Step
	}
	for i, n := range g.Nodes {
		if n.AllReduce > 0 {
			r.NetBytes += AllReduceBytes(n.AllReduce, m.Ranks)
			r.NetSeconds += tasks[i].Work
		}
	}
	if c.Engine.Mode == engine.LoRA {
		for _, o := range ops {
			if o.LowRank(c.Engine.LoRA.R) {
				r.AdapterSeconds += m.OpTime(o)
				r.AdapterGemms++
			}
		}
	}
	if r.FitSeconds, err = FitTime(c, m); err != nil {
		return Report{}, err
	}
	if r.RefreshSeconds, err = RefreshTime(c, m); err != nil {
		return Report{}, err
	}
	return r, nil
}
