package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/galore"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// small is a model small enough to run many steps under -race.
var small = gpt2.Config{V: 64, MaxT: 16, C: 32, L: 2, NH: 4, Eps: 1e-5}

const testB, testT = 2, 8

func testConfig(mode Mode) Config {
	h := optim.DefaultHyper()
	h.WeightDecay = 0.1
	return Config{Mode: mode, DenseParams: DenseDevice, Hyper: h, Seed: 7, HostThreads: 2,
		LSP:    lsp.Config{D: 8, R: 2, Alpha: 0.5, CheckEvery: 5, CalibSamples: 4, ProjLR: 0.05, FitIters: 20},
		LoRA:   lora.Config{R: 4, Alpha: 8, Targets: lora.DefaultTargets("gpt2")},
		Galore: galore.Config{Rank: 4, Every: 3, Scale: 0.25}}
}

// batches draws n micro-batches of a learnable pattern (next = cur+1 mod V),
// with some ignored targets.
func batches(seed uint64, n int) []data.Batch {
	rng := rand.New(rand.NewPCG(seed, 3))
	out := make([]data.Batch, n)
	for i := range out {
		b := data.Batch{B: testB, T: testT, Inputs: make([]int32, testB*testT), Targets: make([]int32, testB*testT)}
		for r := 0; r < testB; r++ {
			start := rng.IntN(small.V)
			for t := 0; t < testT; t++ {
				j := r*testT + t
				b.Inputs[j] = int32((start + t) % small.V)
				b.Targets[j] = int32((start + t + 1) % small.V)
				if t < 2 {
					b.Targets[j] = -1
				} else {
					b.NumTargets++
				}
			}
		}
		out[i] = b
	}
	return out
}

// trainer is an engine with its backend, for tests.
type trainer struct {
	be  backend.Backend
	cpu *cpu.Backend // be, when it is the CPU backend; else nil
	e   *Engine
	// hazards lists the hazards the backend (or its checker) found.
	hazards func() []string
}

// newTrainer is a trainer on the CPU backend.
func newTrainer(t *testing.T, cfg Config, dt backend.DType, accum int, bc cpu.Config) *trainer {
	t.Helper()
	be := cpu.New(bc)
	return openTrainer(t, be, cpuHazards(be), cfg, dt, accum)
}

// cpuHazards lists the hazards of a CPU backend in hazard mode.
func cpuHazards(be *cpu.Backend) func() []string {
	return func() []string {
		var out []string
		for _, h := range be.Hazards() {
			out = append(out, h.String())
		}
		return out
	}
}

// newDeviceTrainer is a trainer on the backend the device tests run on
// (deviceBackend: the CPU backend, or the CUDA one in cuda and cudasim
// builds), in its hazard mode when hazard is set.
func newDeviceTrainer(t *testing.T, cfg Config, dt backend.DType, accum int, hazard bool, seed uint64) *trainer {
	t.Helper()
	be, hazards := deviceBackend(t, hazard, seed)
	return openTrainer(t, be, hazards, cfg, deviceDType(dt), accum)
}

// openTrainer builds the engine on be (closed with it at cleanup).
func openTrainer(t *testing.T, be backend.Backend, hazards func() []string, cfg Config, dt backend.DType, accum int) *trainer {
	t.Helper()
	e, err := New(be, small, testB, testT, accum, dt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Store(be.DefaultStream(), 0, gpt2.Init(small, 11)); err != nil {
		t.Fatal(err)
	}
	if err := e.Loaded(); err != nil {
		t.Fatal(err)
	}
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Free(); be.Close() })
	c, _ := be.(*cpu.Backend)
	return &trainer{be: be, cpu: c, e: e, hazards: hazards}
}

// run takes steps and returns the losses.
func (tr *trainer) run(t *testing.T, steps int) []float64 {
	t.Helper()
	var losses []float64
	for i := 0; i < steps; i++ {
		if tr.e.CheckDue() {
			if _, err := tr.e.Check(batches(1000+uint64(i), tr.e.CalibBatches())); err != nil {
				t.Fatal(err)
			}
		}
		l, err := tr.e.Step(batches(uint64(i), tr.e.accum), 1e-2)
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, l)
	}
	return losses
}

// params are the model's parameters, and in lora mode the adapters after
// them.
func (tr *trainer) params(t *testing.T) []float32 {
	t.Helper()
	last := tr.e.idx.Layout[len(tr.e.idx.Layout)-1]
	v := make([]float32, last.Offset+last.Len())
	if err := tr.e.Fetch(tr.be.DefaultStream(), 0, v); err != nil {
		t.Fatal(err)
	}
	if a := tr.e.Adapters(); a != nil {
		w, err := backend.Download(tr.be, tr.be.DefaultStream(), a.Params)
		if err != nil {
			t.Fatal(err)
		}
		v = append(v, w...)
	}
	return v
}

func TestZeroMatchesNative(t *testing.T) {
	for _, tc := range []struct {
		clip optim.ClipMode
		gdt  backend.DType
	}{{optim.ClipNone, backend.F32}, {optim.ClipMatrix, backend.F32}, {optim.ClipMatrix, backend.BF16}} {
		if deviceIsCUDA && testing.Short() && tc.clip == optim.ClipNone {
			continue // on the simulator (make test's -short), the clipped cases cover the unclipped path
		}
		clip := tc.clip
		t.Run(string(clip)+"/grads-"+tc.gdt.String(), func(t *testing.T) {
			nc, zc := testConfig(Native), testConfig(Zero)
			nc.GradDType, zc.GradDType = tc.gdt, tc.gdt
			nc.Hyper.Clip, zc.Hyper.Clip = clip, clip
			nc.Hyper.MaxNorm, zc.Hyper.MaxNorm = 0.5, 0.5
			nat := newDeviceTrainer(t, nc, backend.F32, 2, false, 0)
			zer := newDeviceTrainer(t, zc, backend.F32, 2, false, 0)
			ln, lz := nat.run(t, 1), zer.run(t, 1)
			// bf16 weights (the CUDA backend's) are the two fp32 masters
			// rounded: one that differs by rounding can round a bf16 ulp
			// (2^-8 relative) apart.
			tol1 := 1e-6
			if deviceDType(backend.F32) == backend.BF16 {
				tol1 = 1.0 / 128
			}
			if worst := tensorDiff(small, nat.params(t), zer.params(t)); worst > tol1 {
				t.Errorf("weights after 1 step: worst difference %.3g of the tensor's scale", worst)
			}
			ln, lz = append(ln, nat.run(t, 19)...), append(lz, zer.run(t, 19)...)
			// With bf16 weights a weight a bf16 ulp apart moves the loss
			// by a few parts in 1e4 (seen up to 3e-4 on the simulator).
			ltol := 1e-4
			if deviceDType(backend.F32) == backend.BF16 {
				ltol = 1e-3
			}
			for i := range ln {
				if math.Abs(ln[i]-lz[i]) > ltol*math.Abs(ln[i]) {
					t.Errorf("step %d: native loss %v, zero %v", i+1, ln[i], lz[i])
				}
			}
			// Both are fp32 AdamW with the same hyperparameters and the same
			// clip (norm+1e-6); the host one uses explicit FMAs, so one step
			// agrees to rounding, and 20 steps of training amplify that a little:
			// with bf16 gradients a weight that differs by an ulp can round
			// its gradient the other way, so the bound there is a few bf16
			// ulps (2^-8 relative).
			tol := 2e-4
			if tc.gdt == backend.BF16 || deviceDType(backend.F32) == backend.BF16 {
				tol = 1e-2
			}
			if worst := tensorDiff(small, nat.params(t), zer.params(t)); worst > tol {
				t.Errorf("weights after 20 steps: worst difference %.3g of the tensor's scale", worst)
			}
			if ln[len(ln)-1] > 0.9*ln[0] {
				t.Errorf("loss did not fall: %v -> %v", ln[0], ln[len(ln)-1])
			}
		})
	}
}

// tensorDiff is the largest |a-b| over a tensor's largest |a|, over every
// tensor, key biases left out.
func tensorDiff(m gpt2.Config, a, b []float32) float64 {
	worst := 0.0
	layout := m.Layout()
	for _, p := range layout {
		var scale, diff float64
		for i := p.Offset; i < p.Offset+p.Len(); i++ {
			if isKeyBias(layout, m.C, i) {
				continue
			}
			scale = max(scale, math.Abs(float64(a[i])))
			diff = max(diff, math.Abs(float64(a[i]-b[i])))
		}
		if scale > 0 {
			worst = max(worst, diff/scale)
		}
	}
	return worst
}

// isKeyBias reports whether element i of the parameters is in the key part
// of a c_attn bias. Its true gradient is 0 (softmax ignores a shift shared
// by a row's scores), so what it gets is rounding noise, which Adam scales
// up to full-size steps: those entries differ between any two
// implementations and are left out of comparisons.
func isKeyBias(layout []model.Param, C, i int) bool {
	for _, p := range layout {
		if strings.HasSuffix(p.Name, "attn.c_attn.bias") && i >= p.Offset+C && i < p.Offset+2*C {
			return true
		}
	}
	return false
}

// hazardConfig is the CPU backend's test mode with random delays.
func hazardConfig(seed uint64) cpu.Config {
	return cpu.Config{Threads: 2, HazardCheck: true, MaxDelay: 200 * time.Microsecond, Seed: seed}
}

// namedConfig is a configuration under test, named for its subtest.
type namedConfig struct {
	name string
	cfg  Config
}

// pipelinedModes are the modes whose steps run pipelined, each named:
// native, zero, and LSP with the dense parameters on the device and on
// the host.
func pipelinedModes() []namedConfig {
	lspHost := testConfig(LSP)
	lspHost.DenseParams = DenseHost
	modes := []namedConfig{{"native", testConfig(Native)}, {"zero", testConfig(Zero)}, {"lsp-device", testConfig(LSP)}, {"lsp-host", lspHost}}
	for i := range modes {
		modes[i].cfg.Pipelined = true
	}
	return modes
}

// modeCase is one mode under test: its configuration and dtype.
type modeCase = struct {
	name string
	cfg  Config
	dt   backend.DType
}

func modesUnderTest() []modeCase {
	lspDev, lspHost := testConfig(LSP), testConfig(LSP)
	lspHost.DenseParams = DenseHost
	// lsp-host also runs its blocks through one device slot
	// (lsp.InFlight), so that two blocks reuse it: under --recompute
	// layer with the projectors in the slot, and with several
	// micro-batches summing S on the host.
	lspHost.Recompute, lspHost.GradResidency, lspHost.slots = model.RecomputeLayer, ResidencyRing, 1
	// lora with its dense parameters on the host (offloaded as zero's)
	// and on the device (the adapters' AdamW's); lora-host's base is
	// quantized (--base-dtype nf4).
	loraDev, loraHost := testConfig(LoRA), testConfig(LoRA)
	loraHost.DenseParams, loraHost.LoRA.Base = DenseHost, backend.NF4
	modes := []modeCase{
		{"zero", testConfig(Zero), backend.BF16},
		{"lsp-device", lspDev, backend.BF16},
		{"lsp-host", lspHost, backend.F32},
		{"lora-device", loraDev, backend.BF16},
		{"lora-host", loraHost, backend.F32},
		{"galore", testConfig(Galore), backend.BF16},
	}
	if deviceIsCUDA {
		// On the CUDA backend (a minute a mode under the simulator)
		// lora-device runs the adapters' GEMMs on the kernels; lora-host's
		// dense offload is zero's path, which zero and lsp-host run; and
		// galore's steps are all on the compute stream, whose kernels
		// TestCUDATrainsLikeCPU (train) and sim-smoke run on the
		// simulator.
		modes = slices.DeleteFunc(modes, func(m modeCase) bool { return m.name == "lora-host" || m.name == "galore" })
	}
	return modes
}

// TestPipelinedMatchesSequential: in every mode, and with each dense
// projector kind, the pipelined schedule under the hazard check gives the
// sequential one's losses and weights bit for bit, over steps with
// projector checks (svd's refreshes).
func TestPipelinedMatchesSequential(t *testing.T) {
	steps := 20
	if testing.Short() {
		steps = 8
	}
	cases := modesUnderTest()
	if !deviceIsCUDA {
		// On the simulator the kinds' kernels and refresh run in
		// sim-smoke's lsp-svd row against the CPU backend instead.
		cases = append(cases, kindConfigs()...)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seq := newDeviceTrainer(t, tc.cfg, tc.dt, 2, false, 0)
			pc := tc.cfg
			pc.Pipelined = true
			pip := newDeviceTrainer(t, pc, tc.dt, 2, true, 5)
			sameRun(t, seq, pip, steps, "sequential", "pipelined")
		})
	}
}

// TestRecomputeBitIdentical: recomputing activations in the backward
// changes memory and time, never results. In every mode and both
// schedules, over steps that include lsp's projector checks, the losses
// and the weights under --recompute attn and layer are those of the run
// that keeps every activation, bit for bit (on cudasim too: its kernels
// are deterministic, as TestPipelinedMatchesSequential relies on); the
// pipelined runs are under the hazard check, so a reuse of a shared
// activation buffer that no stream order covers fails.
func TestRecomputeBitIdentical(t *testing.T) {
	steps := 7
	if testing.Short() {
		steps = 4
	}
	modes := append(modesUnderTest(), struct {
		name string
		cfg  Config
		dt   backend.DType
	}{"native", testConfig(Native), backend.F32})
	schedules := []bool{false, true}
	if deviceIsCUDA && testing.Short() {
		// On the simulator (make test's -short) the pipelined schedule,
		// under the hazard check, alone: TestPipelinedMatchesSequential
		// holds the sequential one to it there, and the CPU backend runs
		// both.
		schedules = []bool{true}
	}
	for _, tc := range modes {
		for _, pipelined := range schedules {
			t.Run(fmt.Sprintf("%s/pipelined=%v", tc.name, pipelined), func(t *testing.T) {
				cfg := tc.cfg
				cfg.Pipelined = pipelined
				cfg.Recompute = model.RecomputeNone
				ref := newDeviceTrainer(t, cfg, tc.dt, 2, false, 0)
				lr, pr := ref.run(t, steps), ref.params(t)
				for _, rc := range []model.Recompute{model.RecomputeAttn, model.RecomputeLayer} {
					cfg.Recompute = rc
					tr := newDeviceTrainer(t, cfg, tc.dt, 2, pipelined, 3)
					l, p := tr.run(t, steps), tr.params(t)
					for i := range lr {
						if l[i] != lr[i] {
							t.Fatalf("recompute %v, step %d: loss %v, without recompute %v", rc, i+1, l[i], lr[i])
						}
					}
					for i := range pr {
						if math.Float32bits(p[i]) != math.Float32bits(pr[i]) {
							t.Fatalf("recompute %v: weight %d is %v, without recompute %v", rc, i, p[i], pr[i])
						}
					}
					if h := tr.hazards(); len(h) > 0 {
						t.Fatalf("recompute %v: %d hazards, first %v", rc, len(h), h[0])
					}
				}
			})
		}
	}
}

// TestEveryEdgeIsNeeded removes each edge of the step graph in turn and
// checks that the pipelined run then reports a hazard (the backend's
// hazard check, also returned as the step's error) or ends with other
// weights than the sequential one. Any other error fails the test: it
// would not be the race that the missing edge lets happen.
func TestEveryEdgeIsNeeded(t *testing.T) {
	if raceEnabled {
		t.Skip("races on purpose; runs in make test's race-free pass")
	}
	for _, tc := range modesUnderTest() {
		if tc.name == "lora-device" || tc.name == "galore" {
			continue // every node on the compute stream: no edge to remove
		}
		t.Run(tc.name, func(t *testing.T) { everyEdge(t, tc.cfg, tc.dt, 1) })
	}
}

// everyEdge is TestEveryEdgeIsNeeded's check of one configuration with
// accum micro-batches per step.
func everyEdge(t *testing.T, cfg Config, dt backend.DType, accum int) {
	t.Helper()
	// Three steps, so that an edge between steps shows; two under -short
	// (the simulator's run in make test), which still has one.
	steps := 3
	if testing.Short() {
		steps = 2
	}
	seq := newDeviceTrainer(t, cfg, dt, accum, false, 0)
	seq.run(t, steps)
	want := seq.params(t)
	// The edges of one step, by node names (stable across steps).
	var edges [][2]string
	seq.e.editGraph = func(g *Graph) *Graph {
		for _, e := range g.Edges() {
			edges = append(edges, [2]string{g.Nodes[e.From].Name, g.Nodes[e.To].Name})
		}
		return g
	}
	if _, err := seq.e.Step(batches(99, accum), 1e-2); err != nil {
		t.Fatal(err)
	}
	if len(edges) == 0 {
		t.Fatal("no edges")
	}
	for _, edge := range edges {
		pc := cfg
		pc.Pipelined = true
		pip := newDeviceTrainer(t, pc, dt, accum, true, uint64(len(edge[0])*31+len(edge[1])))
		pip.e.editGraph = func(g *Graph) *Graph {
			for _, e := range g.Edges() {
				if g.Nodes[e.From].Name == edge[0] && g.Nodes[e.To].Name == edge[1] {
					return g.Without(e)
				}
			}
			t.Fatalf("edge %v not found", edge)
			return g
		}
		var runErr error
		for i := 0; i < steps && runErr == nil; i++ {
			if pip.e.CheckDue() {
				if _, runErr = pip.e.Check(batches(1000+uint64(i), pip.e.CalibBatches())); runErr != nil {
					break
				}
			}
			_, runErr = pip.e.Step(batches(uint64(i), accum), 1e-2)
		}
		caught := ""
		if h := pip.hazards(); len(h) > 0 {
			caught = h[0]
		} else if runErr != nil {
			t.Errorf("without edge %s -> %s: an error that is no hazard: %v", edge[0], edge[1], runErr)
			continue
		}
		if caught == "" {
			got := pip.params(t)
			for i := range got {
				if got[i] != want[i] {
					caught = fmt.Sprintf("weight %d differs", i)
					break
				}
			}
		}
		if caught == "" {
			t.Errorf("removing edge %s -> %s went unnoticed", edge[0], edge[1])
		} else if testing.Verbose() {
			t.Logf("without %s -> %s: %s", edge[0], edge[1], strings.SplitN(caught, "\n", 2)[0])
		}
	}
}

// TestLSPRingMatchesWhole: lsp's blocks in flight (S in a slot, summed
// on the host over micro-batches; under --recompute layer the
// projectors uploaded into slots and A made in the backward) give the
// weights and losses of the run that holds every block's, bit for bit,
// over steps with projector checks, with one micro-batch and with two,
// and pipelined under the hazard check (on the CPU backend: the
// pipelined lsp-host mode of TestPipelinedMatchesSequential runs the ring
// on cudasim).
func TestLSPRingMatchesWhole(t *testing.T) {
	for _, accum := range []int{1, 2} {
		for _, rc := range []model.Recompute{model.RecomputeNone, model.RecomputeLayer} {
			if testing.Short() && (accum == 1 || rc == model.RecomputeNone) {
				continue // the case with every part of the ring
			}
			t.Run(fmt.Sprintf("accum=%d/recompute=%v", accum, rc), func(t *testing.T) {
				whole, ring := testConfig(LSP), testConfig(LSP)
				whole.GradResidency, whole.slots = ResidencyWhole, 1
				ring.GradResidency, ring.slots, ring.Recompute = ResidencyRing, 1, rc
				ring.Pipelined = true
				ref := newDeviceTrainer(t, whole, backend.BF16, accum, false, 0)
				tr := newDeviceTrainer(t, ring, backend.BF16, accum, true, 5)
				sameRun(t, ref, tr, 4, "whole", "ring")
			})
		}
	}
}

// sameRun runs ref and got for steps steps and fails unless their losses
// and weights are the same bits and got (in its hazard mode) saw no
// hazard; refName and gotName say which run is which.
func sameRun(t *testing.T, ref, got *trainer, steps int, refName, gotName string) {
	t.Helper()
	lr, lg := ref.run(t, steps), got.run(t, steps)
	sameBits(t, gotName+" against "+refName, lr, lg, ref.params(t), got.params(t))
	if h := got.hazards(); len(h) > 0 {
		t.Fatalf("%s: %d hazards, first %v", gotName, len(h), h[0])
	}
}
