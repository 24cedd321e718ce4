package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
)

// span is when one node of a step's graph ran.
type span struct{ start, end time.Time }

// traceSpans rewrites each step graph of e so that every node records when
// it ran: a host node around its own work; a device node through events
// recorded on its stream before and after its ops, each awaited by a
// goroutine of its own. Awaiting an event can only be late, never early, so
// a device span may end (or start) later than it did, not earlier. wait
// blocks until every span of the latest step is in.
func traceSpans(e *Engine) (spans map[string]span, wait func()) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	spans = map[string]span{}
	set := func(name string, f func(*span)) {
		mu.Lock()
		defer mu.Unlock()
		s := spans[name]
		f(&s)
		spans[name] = s
	}
	e.editGraph = func(g *Graph) *Graph {
		h := &Graph{Nodes: append([]Node(nil), g.Nodes...)}
		for i := range h.Nodes {
			n := &h.Nodes[i]
			name, run := n.Name, n.Run
			if n.Queue == Host {
				n.Run = func(s backend.Stream) error {
					t0 := time.Now()
					err := run(s)
					t1 := time.Now()
					set(name, func(sp *span) { sp.start, sp.end = t0, t1 })
					return err
				}
				continue
			}
			n.Run = func(s backend.Stream) error {
				begin, err := e.be.NewEvent(name + " start")
				if err != nil {
					return err
				}
				done, err := e.be.NewEvent(name + " end")
				if err != nil {
					return err
				}
				if err := e.be.Record(begin, s); err != nil {
					return err
				}
				err = run(s)
				if err := e.be.Record(done, s); err != nil {
					return err
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, ev := range []struct {
						e   backend.Event
						end bool
					}{{begin, false}, {done, true}} {
						if e.be.EventSynchronize(ev.e) != nil {
							return
						}
						t := time.Now()
						set(name, func(sp *span) {
							if ev.end {
								sp.end = t
							} else {
								sp.start = t
							}
						})
					}
				}()
				return err
			}
		}
		return h
	}
	return spans, wg.Wait
}

// overlapMargin is how far a deep layer's copy or host Adam must start
// before the backward of the shallower layers ends, so that a late
// observation of a device span (scheduling) cannot fake an overlap.
const overlapMargin = 30 * time.Millisecond

// overlapping lists the deep layers l whose node named kind+l starts at
// least overlapMargin before the compute stream finishes the backward of
// layers l-1 to 0, and ends after that backward started.
func overlapping(t *testing.T, spans map[string]span, kind string, L int) []int {
	t.Helper()
	get := func(name string) span {
		t.Helper()
		s, ok := spans[name]
		if !ok || s.start.IsZero() || s.end.IsZero() {
			t.Fatalf("no span of %q in %v", name, spans)
		}
		return s
	}
	var out []int
	for l := 1; l < L; l++ {
		x := get(fmt.Sprintf("%s%d", kind, l))
		first, last := get(fmt.Sprintf("backward 0.%d", l-1)), get("backward 0.0")
		if x.start.Before(last.end.Add(-overlapMargin)) && first.start.Before(x.end) {
			out = append(out, l)
		}
	}
	return out
}

// TestPipelinedOverlaps: in the pipelined schedule the copies down and the host
// Adam of the deep layers run while the compute stream still runs the backward
// of the shallower ones (docs/DESIGN.md, "The schedule"); in the sequential
// reference nothing overlaps, and the same check says so. Every op sleeps a few
// milliseconds and the link is charged, so each node takes long enough to be
// seen.
func TestPipelinedOverlaps(t *testing.T) {
	deep := gpt2.Config{V: 64, MaxT: 16, C: 32, L: 4, NH: 4, Eps: 1e-5}
	for _, pipelined := range []bool{true, false} {
		t.Run(fmt.Sprintf("pipelined=%v", pipelined), func(t *testing.T) {
			be := cpu.New(cpu.Config{Threads: 1, MaxDelay: 5 * time.Millisecond, Seed: 3, LinkBandwidth: 5e6})
			defer be.Close()
			cfg := testConfig(Zero)
			cfg.Pipelined = pipelined
			e, err := New(be, deep, testB, testT, 1, backend.F32, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Free()
			if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, gpt2.Init(deep, 11)); err != nil {
				t.Fatal(err)
			}
			if err := e.Init(); err != nil {
				t.Fatal(err)
			}
			spans, wait := traceSpans(e)
			if _, err := e.Step(batches(1, 1), 1e-2); err != nil {
				t.Fatal(err)
			}
			wait()
			copies := overlapping(t, spans, "d2h grads layer ", deep.L)
			adams := overlapping(t, spans, "host adam layer ", deep.L)
			t.Logf("layers whose copy down overlaps the shallower backward: %v; whose host Adam does: %v", copies, adams)
			if pipelined && (len(copies) == 0 || len(adams) == 0) {
				t.Errorf("pipelined: no copy down (%v) or no host Adam (%v) of a deep layer ran while the shallower layers' backward ran", copies, adams)
			}
			if !pipelined && (len(copies) > 0 || len(adams) > 0) {
				t.Errorf("sequential: copies down of layers %v and host Adam of layers %v overlap compute", copies, adams)
			}
		})
	}
}
