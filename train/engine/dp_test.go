package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// twoRanks claims a world of two; only Validate looks at it.
type twoRanks struct{ *comm.Single }

func (twoRanks) Size() int { return 2 }

// TestDataParallelRefuses: with several ranks, what dp.go does not support
// is refused naming its flag; one rank (comm.Single) is no restriction.
func TestDataParallelRefuses(t *testing.T) {
	ok := testConfig(LSP)
	ok.DenseParams, ok.LSP.NoFit = DenseHost, true
	ok.Comm = twoRanks{comm.NewSingle()}
	if err := ok.Validate(); err != nil {
		t.Fatalf("lsp, --dense-params host, random projectors, 2 ranks: %v", err)
	}
	native := ok
	native.Mode = Native
	if err := native.Validate(); err != nil {
		t.Fatalf("native, fp32 gradients, 2 ranks: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Mode, c.GradDType = Native, backend.BF16 }, "--grad-dtype bf16"},
		{func(c *Config) { c.Mode, c.GradDType = Zero, backend.BF16 }, "--grad-dtype bf16"},
		{func(c *Config) { c.DenseParams, c.GradDType = DenseDevice, backend.BF16 }, "--grad-dtype bf16"},
		{func(c *Config) { c.GradDType = backend.BF16 }, "--grad-dtype bf16"},
	} {
		c := ok
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %q, got %v", tc.want, err)
		}
		c.Comm = comm.NewSingle()
		if err := c.Validate(); err != nil && strings.Contains(err.Error(), "ranks") {
			t.Errorf("one rank: %v", err)
		}
	}
}

// TestCommPerStep: a data-parallel step all-reduces d^2 elements per
// matrix in lsp mode and m n in native, so lsp moves d^2/(m n) of
// native's elements per matrix (TestDataParallelMatchesAccum checks the
// bytes the ranks send against these counts).
func TestCommPerStep(t *testing.T) {
	open := func(cfg Config) *Engine {
		cfg.Comm = twoRanks{comm.NewSingle()}
		be := cpu.New(cpu.Config{Threads: 1})
		e, err := New(be, small, testB, testT, 1, backend.F32, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Free(); be.Close() })
		return e
	}
	lc := testConfig(LSP)
	lc.DenseParams, lc.LSP.NoFit = DenseFrozen, true
	lspStep, natStep := open(lc).CommPerStep(), open(testConfig(Native)).CommPerStep()
	if len(lspStep.Matrices) == 0 || len(lspStep.Matrices) != len(natStep.Matrices) {
		t.Fatalf("lsp lists %d matrices, native %d", len(lspStep.Matrices), len(natStep.Matrices))
	}
	d, _ := lsp.Dims(mustIndex(t), lc.LSP.WithDefaults())
	lspSum := 2
	for k, lm := range lspStep.Matrices {
		nm := natStep.Matrices[k]
		if nm.Elems != nm.M*nm.N || lm.Elems != d[k]*d[k] {
			t.Errorf("%s (%dx%d, d %d): lsp all-reduces %d, native %d elements per block", lm.Name, lm.M, lm.N, d[k], lm.Elems, nm.Elems)
		}
		if float64(lm.Elems) > float64(d[k]*d[k])/float64(lm.M*lm.N)*float64(nm.Elems) {
			t.Errorf("%s: lsp moves %d elements, more than d^2/(m n) of native's %d", lm.Name, lm.Elems, nm.Elems)
		}
		lspSum += small.L * lm.Elems
		t.Logf("%-8s %4dx%-4d d %3d: lsp %6d, native %6d elements per block (%.3f)", lm.Name, lm.M, lm.N, d[k], lm.Elems, nm.Elems,
			float64(lm.Elems)/float64(nm.Elems))
	}
	if lspStep.Elems != lspSum {
		t.Errorf("lsp, --dense-params frozen: %d elements per step, want %d (S of every matrix, the flag and the targets)", lspStep.Elems, lspSum)
	}
	if want := 2 + small.NumParams(); natStep.Elems != want {
		t.Errorf("native: %d elements per step, want %d (every gradient, the flag and the targets)", natStep.Elems, want)
	}

	// The graph's collective nodes: one chain, each after the one before,
	// whose bytes (Node.AllReduce, for a planner) are the step's less the
	// targets' count, which Step all-reduces before the graph.
	host, dev := lc, lc
	host.DenseParams, dev.DenseParams = DenseHost, DenseDevice
	for name, cfg := range map[string]Config{"lsp frozen": lc, "lsp host": host, "lsp device": dev, "native": testConfig(Native),
		"zero": testConfig(Zero)} {
		e := open(cfg)
		g, err := e.Graph()
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		prev := NodeID(-1)
		for i, n := range g.Nodes {
			if n.AllReduce == 0 {
				continue
			}
			sum += n.AllReduce
			if n.Queue != Host {
				t.Errorf("%s: collective %q on queue %v", name, n.Name, n.Queue)
			}
			if prev >= 0 && !slices.Contains(n.Deps, prev) {
				t.Errorf("%s: collective %q does not follow %q", name, n.Name, g.Nodes[prev].Name)
			}
			prev = NodeID(i)
		}
		want := 4 * int64(e.CommPerStep().Elems-1)
		if sh := int64(e.CommPerStep().Sharded); sh > 0 {
			// zero's sharded optimizer (2 ranks, fp32): a reduce-scatter
			// and an all-gather, each priced as half an all-reduce of
			// its bytes, and every tensor's partial norm (2 slots per
			// rank) all-gathered with its group's weights.
			want += (4*sh + 4*sh + 4*2*int64(len(e.idx.Layout))*2) / 2
		} else if name == "zero" {
			t.Errorf("zero with 2 ranks: no sharded host optimizer")
		}
		if sum != want {
			t.Errorf("%s: the graph's collectives all-reduce %d bytes, want %d", name, sum, want)
		}
	}
}

func mustIndex(t *testing.T) *model.Index {
	t.Helper()
	x, err := model.NewIndex(small)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestPlanDeviceCollectives: with a device communicator the engine
// allocates the scratch its plan has (one span per layer's S and per
// group of gradients, the longest setting it), and no pinned buffer for
// the gradients' round trip, which the plan then leaves out too; the
// graph sums on the d2h stream what the host summed, the same bytes.
func TestPlanDeviceCollectives(t *testing.T) {
	frozen, hostD := testConfig(LSP), testConfig(LSP)
	frozen.DenseParams, hostD.DenseParams = DenseFrozen, DenseHost
	for _, tc := range []struct {
		name string
		cfg  Config
	}{{"native", testConfig(Native)}, {"lsp-device", testConfig(LSP)}, {"lsp-frozen", frozen}, {"lsp-host", hostD}} {
		for _, size := range []int{2, 3} {
			hostCfg, devCfg := tc.cfg, tc.cfg
			hostCfg.Comm = shardRank{comm.NewSingle(), size, 0}
			devCfg.Comm, devCfg.DeviceComm = hostCfg.Comm, PlannedDevice{Ranks: size}
			hostPlan, err := MemoryOf(small, testB, testT, 1, backend.F32, hostCfg)
			if err != nil {
				t.Fatal(err)
			}
			devPlan, err := MemoryOf(small, testB, testT, 1, backend.F32, devCfg)
			if err != nil {
				t.Fatal(err)
			}
			be := cpu.New(cpu.Config{Threads: 1})
			e, err := New(be, small, testB, testT, 1, backend.F32, devCfg)
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s, %d ranks", tc.name, size)
			// A layer's S is one span (init carves them together), and
			// so is a block's gradients in native mode (the embeddings
			// and the final norm lie apart).
			if e.lsp != nil {
				for l := range e.lsp.Mats {
					if n := len(spans(e.lsp.LayerS(l))); n != 1 {
						t.Errorf("%s: layer %d's S in %d spans, want 1", name, l, n)
					}
				}
			}
			if tc.name == "native" {
				for _, grp := range e.dpg.groups {
					if grp.layer >= 0 && len(grp.spans) != 1 {
						t.Errorf("%s: %s's gradients in %d spans, want 1", name, grp.name, len(grp.spans))
					}
				}
			}
			if got, want := int64(4*e.dp.scratch.Len()), part(devPlan.Device, "device collectives' scratch"); got != want {
				t.Errorf("%s: allocated %d bytes of scratch, planned %d", name, got, want)
			}
			if e.dpg != nil && e.dpg.buf != nil {
				t.Errorf("%s: a pinned buffer for the gradients' round trip with a device communicator", name)
			}
			if part(devPlan.Host, "data-parallel gradients") >= 0 {
				t.Errorf("%s: the plan keeps the gradients' pinned buffer", name)
			}
			if got, want := devPlan.DeviceTotal()-hostPlan.DeviceTotal(), part(devPlan.Device, "device collectives' scratch"); got != want {
				t.Errorf("%s: device plan grows by %d bytes, want the scratch's %d", name, got, want)
			}
			if got, want := devPlan.LinkD2H+max(0, part(hostPlan.Host, "data-parallel gradients")), hostPlan.LinkD2H; got != want {
				t.Errorf("%s: d2h bytes %d with the device communicator, %d without", name, devPlan.LinkD2H, hostPlan.LinkD2H)
			}
			// The graph: the same bytes summed, on the collectives'
			// stream where the device sums (all but the flag's), and
			// the graph valid (edges cross queues, in list order).
			g, err := e.stepGraph(1, 1e-3)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Validate(); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			var onDevice, onHost int64
			for _, n := range g.Nodes {
				if n.Queue == Comm {
					onDevice += n.AllReduce
				} else {
					onHost += n.AllReduce
				}
			}
			cs := e.CommPerStep()
			if onHost+onDevice != 4*int64(cs.Elems-1) || onHost < 4 {
				t.Errorf("%s: the graph sums %d bytes on the host and %d on the device; a step sums %d elements (the targets' count outside the graph)", name, onHost, onDevice, cs.Elems)
			}
			if (tc.name == "lsp-host") != (onHost > 4) {
				t.Errorf("%s: %d bytes summed on the host", name, onHost)
			}
			if err := e.Free(); err != nil {
				t.Fatal(err)
			}
			be.Close()
		}
	}
}
