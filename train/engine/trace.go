// The step graph for a planner: the same nodes, queues and edges the
// interpreters run, built on a backend that only records (train/trace),
// with no host copy of the optimizer state behind it, so that a 7B model's
// graph costs megabytes, not gigabytes.

package engine

import (
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// TraceStep builds an engine for arch on be without host optimizer state
// or worker pool and returns the graph of its first step, reduced as Step
// reduces it before running it. Running a device node's Run enqueues its
// ops on be; host nodes must not be run (their buffers are only sized):
// their Work describes them. Nothing needs freeing beyond what be holds.
func TraceStep(be backend.Backend, arch model.Arch, B, T, accum int, dt backend.DType, cfg Config) (*Graph, error) {
	e, err := newEngine(be, arch, B, T, accum, dt, cfg, true)
	if err != nil {
		return nil, err
	}
	return e.Graph()
}

// Graph is the reduced graph of the next step as Step would build it, for
// inspection: it runs nothing, and the step count is left as it was (so
// its nodes, run later, read the count of the latest Step).
func (e *Engine) Graph() (*Graph, error) {
	e.step++ // stepGraph sees the number of the step it builds
	defer func() { e.step-- }()
	g, err := e.stepGraph(float32(1/float64(e.accum*e.b*e.t)), 1e-3)
	if err != nil {
		return nil, err
	}
	return g.Reduce(), nil
}
