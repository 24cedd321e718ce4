// A hook for profilers: each step's graph passed through a function
// before it runs, so that a profiler can wrap the nodes' Run to attribute
// the ops they enqueue and time the host nodes (lsp-train profile).

package engine

// EditGraphs makes every later Step pass its reduced graph through f and
// run what f returns; nil removes the hook. f must keep the nodes, their
// queues and their edges (a profiler wraps Run and nothing else): the
// engine's correctness rests on that graph.
func (e *Engine) EditGraphs(f func(*Graph) *Graph) { e.editGraph = f }
