package plan

import (
	"math"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/engine"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestSimulateSerialChain(t *testing.T) {
	tasks := []Task{
		{Name: "fwd", Queue: engine.Compute, Work: 1},
		{Name: "down", Queue: engine.D2H, Work: 2, Deps: []int{0}},
		{Name: "adam", Queue: engine.Host, Work: 3, Deps: []int{1}},
		{Name: "up", Queue: engine.H2D, Work: 0.5, Deps: []int{2}},
		{Name: "apply", Queue: engine.Compute, Work: 1, Deps: []int{3}},
	}
	r, err := Simulate(tasks, Resources{Cores: 4, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Step, 7.5) || !near(r.Overlap, 1) {
		t.Errorf("step %g overlap %g, want 7.5 and 1", r.Step, r.Overlap)
	}
	if !slices.Equal(r.Critical, []int{0, 1, 2, 3, 4}) {
		t.Errorf("critical path %v", r.Critical)
	}
	if !near(r.OnPath[ComputeBound], 2) || !near(r.OnPath[LinkBound], 2.5) || !near(r.OnPath[HostBound], 3) || r.Bound != HostBound {
		t.Errorf("on path %v, bound %s; want compute 2, link 2.5, host 3: host", r.OnPath, r.Bound)
	}
	wantStart := []float64{0, 1, 3, 6, 6.5}
	for i, s := range wantStart {
		if !near(r.Start[i], s) {
			t.Errorf("task %d starts at %g, want %g", i, r.Start[i], s)
		}
	}
}

func TestSimulateOverlap(t *testing.T) {
	// Three forward chunks; each of the first two's copy goes down while
	// the next computes. The copies queue on d2h.
	tasks := []Task{
		{Name: "f1", Queue: engine.Compute, Work: 2},
		{Name: "g1", Queue: engine.D2H, Work: 3, Deps: []int{0}},
		{Name: "f2", Queue: engine.Compute, Work: 2},
		{Name: "g2", Queue: engine.D2H, Work: 3, Deps: []int{2}},
		{Name: "f3", Queue: engine.Compute, Work: 2},
	}
	r, err := Simulate(tasks, Resources{Cores: 1})
	if err != nil {
		t.Fatal(err)
	}
	// g1 2..5, g2 5..8 (its queue, not f2 ending at 4, held it), f3 4..6.
	if !near(r.Step, 8) || !near(r.Busy[engine.Compute], 6) || !near(r.Busy[engine.D2H], 6) || !near(r.Overlap, 1.5) {
		t.Errorf("step %g busy %v overlap %g; want 8, compute 6, d2h 6, 1.5", r.Step, r.Busy, r.Overlap)
	}
	if !slices.Equal(r.Critical, []int{0, 1, 3}) || r.Bound != LinkBound {
		t.Errorf("critical %v bound %s; want [0 1 3] link", r.Critical, r.Bound)
	}
}

func TestSimulateHostPool(t *testing.T) {
	// Two host nodes ready together run one after the other on the pool,
	// in list order; the device goes on meanwhile.
	tasks := []Task{
		{Name: "b", Queue: engine.Compute, Work: 1},
		{Name: "h1", Queue: engine.Host, Work: 1, Deps: []int{0}},
		{Name: "h2", Queue: engine.Host, Work: 1, Deps: []int{0}},
		{Name: "more", Queue: engine.Compute, Work: 1.5},
		{Name: "up", Queue: engine.H2D, Work: 0, Deps: []int{2}},
	}
	r, err := Simulate(tasks, Resources{Cores: 8, Workers: 8})
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Start[1], 1) || !near(r.Start[2], 2) || !near(r.End[2], 3) || !near(r.End[3], 2.5) || !near(r.Step, 3) {
		t.Errorf("starts %v ends %v", r.Start, r.End)
	}
	if !near(r.End[4], 3) || !slices.Equal(r.Critical, []int{0, 1, 2, 4}) || r.Bound != HostBound {
		t.Errorf("up ends %g, critical %v bound %s", r.End[4], r.Critical, r.Bound)
	}
}

// TestSimulateNetLane: collectives (Task.Net) run one at a time on a lane
// of their own, beside the Adam pool and unslowed by contention; a host
// Adam node that waits for its collective starts when it ends.
func TestSimulateNetLane(t *testing.T) {
	tasks := []Task{
		{Name: "b1", Queue: engine.Compute, Work: 1},
		{Name: "ar1", Queue: engine.Host, Net: true, Work: 2, Deps: []int{0}},
		{Name: "adam0", Queue: engine.Host, Work: 3, Deps: []int{0}},
		{Name: "ar2", Queue: engine.Host, Net: true, Work: 1, Deps: []int{0, 1}},
		{Name: "adam1", Queue: engine.Host, Work: 1, Deps: []int{1}},
	}
	r, err := Simulate(tasks, Resources{SharesHost: true, Cores: 2, Workers: 2, ComputeThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	// ar1 and adam0 both start at 1 (different lanes); ar2 after ar1 (3),
	// adam1 after adam0 on the pool (4).
	if !near(r.Start[1], 1) || !near(r.Start[2], 1) || !near(r.Start[3], 3) || !near(r.End[3], 4) ||
		!near(r.Start[4], 4) || !near(r.Step, 5) {
		t.Errorf("starts %v ends %v", r.Start, r.End)
	}
	if !near(r.NetBusy, 3) || !near(r.Busy[engine.Host], 4) {
		t.Errorf("net busy %g, host busy %g; want 3, 4", r.NetBusy, r.Busy[engine.Host])
	}
	if _, err := Simulate([]Task{{Name: "x", Queue: engine.Compute, Net: true}}, Resources{}); err == nil {
		t.Error("a device task on the network lane was accepted")
	}
}

func TestSimulateContention(t *testing.T) {
	// After a, host Adam h and compute b run together. Sharing 2 cores
	// between b's 2 threads and h's 2 workers, each runs at half speed: h
	// (1 s alone) ends at 3, when b has done 1 of its 2 s; b's last second
	// runs alone: the step ends at 4. Without sharing: 3.
	tasks := []Task{
		{Name: "a", Queue: engine.Compute, Work: 1},
		{Name: "h", Queue: engine.Host, Work: 1, Deps: []int{0}},
		{Name: "b", Queue: engine.Compute, Work: 2},
	}
	shared, err := Simulate(tasks, Resources{SharesHost: true, Cores: 2, ComputeThreads: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !near(shared.End[1], 3) || !near(shared.End[2], 4) || !near(shared.Step, 4) {
		t.Errorf("shared: ends %v step %g; want h 3, b 4", shared.End, shared.Step)
	}
	apart, err := Simulate(tasks, Resources{SharesHost: false, Cores: 2, ComputeThreads: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !near(apart.Step, 3) || !near(apart.End[1], 2) {
		t.Errorf("apart: ends %v step %g; want h 2, step 3", apart.End, apart.Step)
	}
	// With 4 cores for 2 + 2 threads nothing is shared.
	roomy, err := Simulate(tasks, Resources{SharesHost: true, Cores: 4, ComputeThreads: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !near(roomy.Step, 3) {
		t.Errorf("4 cores: step %g, want 3", roomy.Step)
	}
	// One compute thread and three workers on 2 cores: n = 4, compute
	// gets 1*2/(4*1) = 1/2 of its speed, the host 3*2/(4*2) = 3/4: h ends
	// at 1 + 4/3, b has then done 2/3 of a second and ends 4/3 later.
	odd, err := Simulate(tasks, Resources{SharesHost: true, Cores: 2, ComputeThreads: 1, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !near(odd.End[1], 1+4.0/3) || !near(odd.Step, 1+4.0/3+4.0/3) {
		t.Errorf("1 thread, 3 workers: ends %v step %g", odd.End, odd.Step)
	}
}

func TestSimulateRefuses(t *testing.T) {
	for _, tasks := range [][]Task{
		{{Name: "a", Queue: engine.Compute, Work: 1, Deps: []int{0}}},
		{{Name: "a", Queue: engine.Compute, Work: -1}},
		{{Name: "a", Queue: engine.Compute, Work: math.NaN()}},
		{{Name: "a", Queue: 7, Work: 1}},
	} {
		if _, err := Simulate(tasks, Resources{Cores: 1}); err == nil {
			t.Errorf("%+v accepted", tasks)
		}
	}
}

func TestSimulateLauncher(t *testing.T) {
	// b comes after the copy up, which waits for the host: the launcher
	// blocks there, so b starts only when h ends, though the compute
	// stream is free from 1 s on.
	late := []Task{
		{Name: "a", Queue: engine.Compute, Work: 1},
		{Name: "h", Queue: engine.Host, Work: 2, Deps: []int{0}},
		{Name: "up", Queue: engine.H2D, Work: 0.5, Deps: []int{1}},
		{Name: "b", Queue: engine.Compute, Work: 1},
	}
	r, err := Simulate(late, Resources{Cores: 4, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Start[3], 3) || !near(r.Step, 4) || !slices.Equal(r.Critical, []int{0, 1, 3}) {
		t.Errorf("b listed late: starts %v, step %g, critical %v; want b at 3, step 4, [0 1 3]", r.Start, r.Step, r.Critical)
	}
	// Listed before the copy, b overlaps the host Adam.
	early := []Task{late[0], late[1], late[3], {Name: "up", Queue: engine.H2D, Work: 0.5, Deps: []int{1}}}
	r, err = Simulate(early, Resources{Cores: 4, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Start[2], 1) || !near(r.Step, 3.5) {
		t.Errorf("b listed early: starts %v, step %g; want b at 1, step 3.5", r.Start, r.Step)
	}
	// A host node is handed to the pool only when the launcher reaches it.
	gated := []Task{
		{Name: "a", Queue: engine.Compute, Work: 1},
		{Name: "h1", Queue: engine.Host, Work: 2, Deps: []int{0}},
		{Name: "up", Queue: engine.H2D, Work: 0.5, Deps: []int{1}},
		{Name: "h2", Queue: engine.Host, Work: 1},
	}
	r, err = Simulate(gated, Resources{Cores: 4, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Start[3], 3) || !near(r.Step, 4) {
		t.Errorf("h2 behind the launcher: starts %v, step %g; want h2 at 3, step 4", r.Start, r.Step)
	}
}
