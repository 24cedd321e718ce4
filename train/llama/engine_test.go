package llama

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// engineConfig is the engine's test settings (train/engine's own tests
// use the same) in mode.
func engineConfig(mode engine.Mode) engine.Config {
	h := optim.DefaultHyper()
	h.WeightDecay = 0.1
	return engine.Config{Mode: mode, DenseParams: engine.DenseDevice, Hyper: h, Seed: 7, HostThreads: 2,
		LSP: lsp.Config{D: 8, R: 2, Alpha: 0.5, CheckEvery: 5, CalibSamples: 4, ProjLR: 0.05, FitIters: 20}}
}

// patternBatches draws n micro-batches of a learnable pattern (next = cur+1
// mod V), the first two targets of each row ignored.
func patternBatches(seed uint64, n, B, T, V int) []data.Batch {
	rng := rand.New(rand.NewPCG(seed, 3))
	out := make([]data.Batch, n)
	for i := range out {
		b := data.Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
		for r := range B {
			start := rng.IntN(V)
			for t := range T {
				j := r*T + t
				b.Inputs[j] = int32((start + t) % V)
				b.Targets[j] = int32((start + t + 1) % V)
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

// newEngine is the engine of hookCfg on be, initialised from seed 11.
func newEngine(t *testing.T, be backend.Backend, cfg engine.Config, dt backend.DType, B, T, accum int) *engine.Engine {
	t.Helper()
	e, err := engine.New(be, hookCfg, B, T, accum, dt, cfg)
	must(t, err)
	must(t, backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, hookCfg.Init(11)))
	must(t, e.Init())
	return e
}

// trainSteps takes steps on the pattern task, with the projector checks
// that fall due, and returns the losses.
func trainSteps(t *testing.T, e *engine.Engine, steps, B, T, accum int) []float64 {
	t.Helper()
	var ls []float64
	for i := range steps {
		if e.CheckDue() {
			_, err := e.Check(patternBatches(1000+uint64(i), e.CalibBatches(), B, T, hookCfg.Vocab))
			must(t, err)
		}
		l, err := e.Step(patternBatches(uint64(i), accum, B, T, hookCfg.Vocab), 1e-2)
		must(t, err)
		ls = append(ls, l)
	}
	return ls
}

// TestEngineModes trains a LLaMA (GQA, llama3 RoPE) through the engine in
// each mode, sequential and pipelined, at fp32 and bf16, on the CPU
// backend with its hazard check: no hazard, the loss falls, native and
// zero agree, and the engine's memory plan brackets the arena's
// high-water mark as train/engine requires of every model.
func TestEngineModes(t *testing.T) {
	const B, T, accum, steps = 2, 8, 2, 12
	lspHost := engineConfig(engine.LSP)
	lspHost.DenseParams = engine.DenseHost
	pipelined := engineConfig(engine.LSP)
	pipelined.Pipelined = true
	zeroBF16 := engineConfig(engine.Zero)
	zeroBF16.GradDType = backend.BF16
	losses := map[string][]float64{}
	for _, tc := range []struct {
		name string
		cfg  engine.Config
		dt   backend.DType
	}{
		{"native", engineConfig(engine.Native), backend.F32},
		{"zero", engineConfig(engine.Zero), backend.F32},
		{"lsp-device", engineConfig(engine.LSP), backend.F32},
		{"lsp-device-pipelined", pipelined, backend.F32},
		{"lsp-host", lspHost, backend.BF16},
		{"zero-bf16-grads", zeroBF16, backend.BF16},
		{"native-bf16", engineConfig(engine.Native), backend.BF16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.dt == backend.BF16 && tc.name != "lsp-host" {
				t.Skip("-short")
			}
			be := cpu.New(cpu.Config{Threads: 2, HazardCheck: true})
			defer be.Close()
			plan, err := engine.MemoryOf(hookCfg, B, T, accum, tc.dt, tc.cfg)
			must(t, err)
			e := newEngine(t, be, tc.cfg, tc.dt, B, T, accum)
			defer e.Free()
			ls := trainSteps(t, e, steps, B, T, accum)
			losses[tc.name] = ls
			for _, h := range be.Hazards() {
				t.Errorf("hazard: %v", h)
			}
			if last := ls[len(ls)-1]; !(last < 0.9*ls[0]) || math.IsNaN(last) {
				t.Errorf("loss did not fall: %v", ls)
			}
			hw, pred := be.MemStats().HighWater, plan.DeviceTotal()
			if pred < hw || float64(pred) > 1.1*float64(hw) {
				t.Errorf("predicted device peak %d, arena high-water mark %d (%s)", pred, hw, plan)
			}
		})
	}
	// Same gradient dtype in native and zero is the same math in another
	// place: the losses agree to rounding (the host Adam's FMAs).
	if n, z := losses["native"], losses["zero"]; len(n) == steps && len(z) == steps {
		for i := range n {
			if math.Abs(n[i]-z[i]) > 1e-4*n[i] {
				t.Errorf("step %d: native loss %v, zero %v", i+1, n[i], z[i])
			}
		}
	}
	t.Logf("losses %v", losses)
}

// TestPipelinedMatchesSequential: the pipelined schedule (three streams,
// the CPU backend's random delays and hazard check) ends with the same
// losses and weights as the sequential one, bit for bit, in zero and in
// lsp with its shared projectors (q|k|v, gate|up) and dense parameters on
// the device or the host.
func TestPipelinedMatchesSequential(t *testing.T) {
	const B, T, accum = 2, 8, 2
	steps := 12
	if testing.Short() {
		steps = 6
	}
	lspHost := engineConfig(engine.LSP)
	lspHost.DenseParams = engine.DenseHost
	for _, tc := range []struct {
		name string
		cfg  engine.Config
		dt   backend.DType
	}{
		{"zero", engineConfig(engine.Zero), backend.BF16},
		{"lsp-device", engineConfig(engine.LSP), backend.BF16},
		{"lsp-host", lspHost, backend.F32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(pipelined bool) ([]float64, []float32) {
				be := cpu.New(cpu.Config{Threads: 2, HazardCheck: pipelined, MaxDelay: 20 * time.Microsecond, Seed: 5})
				defer be.Close()
				cfg := tc.cfg
				cfg.Pipelined = pipelined
				e := newEngine(t, be, cfg, tc.dt, B, T, accum)
				defer e.Free()
				ls := trainSteps(t, e, steps, B, T, accum)
				for _, h := range be.Hazards() {
					t.Errorf("hazard: %v", h)
				}
				p, err := backend.Download(be, be.DefaultStream(), e.Model.Buffers().Params)
				must(t, err)
				return ls, p
			}
			ls, ps := run(false)
			lp, pp := run(true)
			for i := range ls {
				if ls[i] != lp[i] {
					t.Fatalf("step %d: sequential loss %v, pipelined %v", i+1, ls[i], lp[i])
				}
			}
			for i := range ps {
				if math.Float32bits(ps[i]) != math.Float32bits(pp[i]) {
					t.Fatalf("weight %d: sequential %v, pipelined %v", i, ps[i], pp[i])
				}
			}
		})
	}
}

// TestEngineQwen2Biases: Qwen2's q, k and v biases are dense parameters in
// lsp mode: --dense-params device and host train them (with the hazard
// check, the loss falls and the device peak is the plan's), frozen keeps
// them as loaded, as it keeps the norms.
func TestEngineQwen2Biases(t *testing.T) {
	const B, T, accum, steps = 2, 8, 2, 8
	cfg := hookCfg.clone()
	cfg.QKVBias = true
	init := cfg.Init(11)
	rng := rand.New(rand.NewPCG(12, 13))
	for k, p := range cfg.Layout() {
		if cfg.isBias(k) {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				init[i] = float32(rng.NormFloat64() * 0.1) // away from the init's 0
			}
		}
	}
	for _, dense := range []engine.DenseParams{engine.DenseDevice, engine.DenseHost, engine.DenseFrozen} {
		t.Run(string(dense), func(t *testing.T) {
			ec := engineConfig(engine.LSP)
			ec.DenseParams = dense
			be := cpu.New(cpu.Config{Threads: 2, HazardCheck: true})
			defer be.Close()
			plan, err := engine.MemoryOf(cfg, B, T, accum, backend.F32, ec)
			must(t, err)
			e, err := engine.New(be, cfg, B, T, accum, backend.F32, ec)
			must(t, err)
			defer e.Free()
			params := e.Model.Buffers().Params
			must(t, backend.Upload(be, be.DefaultStream(), params, init))
			must(t, e.Init())
			ls := trainSteps(t, e, steps, B, T, accum) // cfg's vocabulary is hookCfg's
			for _, h := range be.Hazards() {
				t.Errorf("hazard: %v", h)
			}
			if dense != engine.DenseFrozen && !(ls[len(ls)-1] < ls[0]) {
				t.Errorf("loss did not fall: %v", ls)
			}
			if hw, pred := be.MemStats().HighWater, plan.DeviceTotal(); pred < hw || float64(pred) > 1.1*float64(hw) {
				t.Errorf("predicted device peak %d, arena high-water mark %d (%s)", pred, hw, plan)
			}
			got, err := backend.Download(be, be.DefaultStream(), params)
			must(t, err)
			for i, p := range cfg.Layout() {
				if !cfg.isBias(i) {
					continue
				}
				moved := false
				for j := p.Offset; j < p.Offset+p.Len(); j++ {
					moved = moved || got[j] != init[j]
				}
				if moved != (dense != engine.DenseFrozen) {
					t.Errorf("%s: changed %v with --dense-params %s", p.Name, moved, dense)
				}
			}
		})
	}
}
