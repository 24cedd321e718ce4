package profile

import (
	"math"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// TestSummarize: each op goes to the phase of the node that enqueued it,
// or outside the graph to the check (when one ran), the link or other;
// host spans are summed in host-adam and merged in the host stream.
func TestSummarize(t *testing.T) {
	names := []string{"zero grads", "forward 0", "backward 0.0", "d2h grads h.0", "host adam h.0", "h2d weights h.0", "adamw", "apply 0"}
	queues := []engine.Queue{engine.Compute, engine.Compute, engine.Compute, engine.D2H, engine.Host, engine.H2D, engine.Compute, engine.Compute}
	ops := []trace.Op{
		{Node: beforeGraph, Stream: "default", Family: trace.Gemm, Seconds: 1},                                 // the check's
		{Node: 0, Stream: "default", Family: trace.Elementwise, Seconds: 2},                                    // backward (zero grads)
		{Node: 1, Stream: "default", Family: trace.Gemm, Gemm: trace.GemmArgs{M: 16, N: 4, K: 32}, Seconds: 4}, // forward, an adapter's at rank 4
		{Node: 2, Stream: "default", Family: trace.Attention, Seconds: 8},                                      // backward
		{Node: 3, Stream: "d2h", Family: trace.Copy, Link: trace.D2H, Seconds: 16},                             // comm
		{Node: 5, Stream: "h2d", Family: trace.Copy, Link: trace.H2D, Seconds: 32},                             // comm
		{Node: 6, Stream: "default", Family: trace.Adam, Seconds: 64},                                          // optimizer
		{Node: 7, Stream: "default", Family: trace.Sparse, Seconds: 128},                                       // optimizer (apply)
		{Node: outsideNode, Stream: "default", Family: trace.Copy, Link: trace.D2H, Seconds: 256},              // the loss readback
		{Node: outsideNode, Stream: "default", Family: trace.Reduce, Seconds: 512},                             // other
	}
	t0 := time.Unix(0, 0)
	host := []span{{t0, t0.Add(3 * time.Second)}, {t0.Add(2 * time.Second), t0.Add(4 * time.Second)}, {t0.Add(10 * time.Second), t0.Add(11 * time.Second)}}
	st := summarize(ops, names, queues, host, Times{Wall: 2000, Engine: 1000, Check: 5}, 4)
	want := map[Phase]float64{Check: 1, Backward: 10, Forward: 4, Comm: 16 + 32 + 256, Optimizer: 192, Other: 512, HostAdam: 3 + 2 + 1}
	for p, w := range want {
		if st.Phases[p] != w {
			t.Errorf("%s: %g s, want %g", p, st.Phases[p], w)
		}
	}
	if st.Device != 1023 || st.Ops != len(ops) || st.Families[trace.Copy] != 16+32+256 || st.FamilyOps[trace.Copy] != 3 {
		t.Errorf("device %g s, %d ops, copy %g s in %d", st.Device, st.Ops, st.Families[trace.Copy], st.FamilyOps[trace.Copy])
	}
	// The rank-4 GEMM is lora's adapter; the check's GEMM has no sizes.
	if st.Adapters != 4 || st.AdapterOps != 1 {
		t.Errorf("adapters %g s in %d ops, want the forward's 4 s in 1", st.Adapters, st.AdapterOps)
	}
	// The check's op is not the engine step's: default is busy 2+4+8+64+128+256+512.
	busy := map[string]float64{"default": 974, "d2h": 16, "h2d": 32, HostStream: 5}
	for s, w := range busy {
		if st.Busy[s] != w || st.Idle[s] != 1000-w {
			t.Errorf("%s: busy %g idle %g, want %g and %g", s, st.Busy[s], st.Idle[s], w, 1000-w)
		}
	}
	// Without a check, ops before the graph are by the link or other;
	// without a rank (not lora) the rank-4 GEMM is not an adapter's.
	st = summarize(ops[:3], names, queues, nil, Times{Engine: 1}, 0)
	if st.Phases[Other] != 1 || st.Phases[Check] != 0 {
		t.Errorf("no check: %v", st.Phases)
	}
	if st.Adapters != 0 || st.AdapterOps != 0 {
		t.Errorf("rank 0: adapters %g s in %d ops", st.Adapters, st.AdapterOps)
	}
}

// TestMean: the mean of each figure, so the phases still sum to Device.
func TestMean(t *testing.T) {
	a := Step{Times: Times{Wall: 1, Engine: 1}, Device: 1, Ops: 2, Phases: map[Phase]float64{Forward: 1},
		Families: map[trace.Family]float64{trace.Gemm: 1}, FamilyOps: map[trace.Family]int{trace.Gemm: 2},
		Busy: map[string]float64{"default": 1}, Idle: map[string]float64{"default": 0}}
	b := Step{Times: Times{Wall: 3, Engine: 2, Check: 1}, Device: 3, Ops: 4, Phases: map[Phase]float64{Forward: 1, Check: 2},
		Families: map[trace.Family]float64{trace.Gemm: 3}, FamilyOps: map[trace.Family]int{trace.Gemm: 4},
		Busy: map[string]float64{"default": 1}, Idle: map[string]float64{"default": 1}}
	a.Adapters, a.AdapterOps, b.Adapters, b.AdapterOps = 0.5, 1, 1.5, 2
	m := Mean([]Step{a, b})
	if m.Adapters != 1 || m.AdapterOps != 2 {
		t.Errorf("adapters %g s in %d ops, want 1 s in 2 (1.5 rounded)", m.Adapters, m.AdapterOps)
	}
	if m.Wall != 2 || m.Engine != 1.5 || m.Times.Check != 0.5 || m.Device != 2 || m.Ops != 3 ||
		m.Phases[Forward] != 1 || m.Phases[Check] != 1 || m.Families[trace.Gemm] != 2 || m.FamilyOps[trace.Gemm] != 3 ||
		m.Idle["default"] != 0.5 {
		t.Errorf("%+v", m)
	}
	sum := 0.0
	for _, v := range m.Phases {
		sum += v
	}
	if math.Abs(sum-m.Device) > 1e-12 {
		t.Errorf("phases %g, device %g", sum, m.Device)
	}
}
