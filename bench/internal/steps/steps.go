// Package steps times full training steps of the real engine on the CPU
// backend, for the benchmarks (bench/train, bench/plan): random tokens,
// one or more warm-up steps, then each step timed on its own.
package steps

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// Job is one model at one batch.
type Job struct {
	Preset string
	// Spec, when set, is the architecture instead of Preset's (Preset
	// then only names it), e.g. one layer of llama-7b.
	Spec  model.Spec
	B, T  int
	Warm  int // warm-up steps (0: 1)
	Steps int // timed steps
	// Timed, when set, is called after the warm-up, before the timed steps.
	Timed func()
}

// Config is the engine configuration the benchmarks time: dense
// parameters on the device, fp32, lsp with never-fitted projectors (d 512
// capped per matrix, r 16, no check within the run) so that only
// steady-state steps are timed.
func Config(mode engine.Mode, pipelined bool, threads int) engine.Config {
	return engine.Config{Mode: mode, DenseParams: engine.DenseDevice, Hyper: optim.DefaultHyper(), Pipelined: pipelined,
		Seed: 1, HostThreads: threads,
		LSP: lsp.Config{D: 512, R: 16, Alpha: 0.5, CheckEvery: 100, CalibSamples: 32, ProjLR: 0.05, NoFit: true}}
}

// Result is a job's timed steps.
type Result struct {
	Seconds   []float64 // each timed step
	LinkBytes int64     // link bytes per step (both directions)
}

// Median is the median step time.
func (r Result) Median() float64 {
	s := slices.Clone(r.Seconds)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Mean is the mean step time.
func (r Result) Mean() float64 {
	t := 0.0
	for _, s := range r.Seconds {
		t += s
	}
	return t / float64(max(len(r.Seconds), 1))
}

// Measure times j with engine configuration ec on a CPU backend of cfg,
// wrapped by wrap when it is not nil (a tracer, say).
func Measure(j Job, ec engine.Config, cfg cpu.Config, wrap func(backend.Backend) backend.Backend) (Result, error) {
	r, err := Start(j, ec, cfg, wrap)
	if err != nil {
		return Result{}, err
	}
	defer r.Close()
	if j.Timed != nil {
		j.Timed()
	}
	var res Result
	t0 := r.be.Traffic()
	for range j.Steps {
		sec, err := r.Step()
		if err != nil {
			return Result{}, err
		}
		res.Seconds = append(res.Seconds, sec)
	}
	t1 := r.be.Traffic()
	res.LinkBytes = (t1.D2H + t1.H2D - t0.D2H - t0.H2D) / int64(max(j.Steps, 1))
	return res, nil
}

// Runner is an engine ready to step, warmed up: several can be alive at
// once and stepped in turn, so that a machine whose speed drifts slows
// them alike.
type Runner struct {
	be      backend.Backend
	e       *engine.Engine
	batches []data.Batch
}

// Start builds j's engine with ec on a CPU backend of cfg (wrapped by wrap
// when not nil) and runs its warm-up steps.
func Start(j Job, ec engine.Config, cfg cpu.Config, wrap func(backend.Backend) backend.Backend) (*Runner, error) {
	var be backend.Backend = cpu.New(cfg)
	if wrap != nil {
		be = wrap(be)
	}
	return StartOn(be, j, ec, backend.F32)
}

// StartOn is Start on any backend be, with weights and activations of
// dtype dt: the GPU benchmarks (bench/kernels) run it on the CUDA
// backend in bf16. The Runner owns be: Close closes it.
func StartOn(be backend.Backend, j Job, ec engine.Config, dt backend.DType) (*Runner, error) {
	spec := j.Spec
	if spec == nil {
		var err error
		if spec, err = catalog.Preset(j.Preset); err != nil {
			be.Close()
			return nil, err
		}
	}
	e, err := engine.New(be, spec, j.B, j.T, 1, dt, ec)
	if err != nil {
		be.Close()
		return nil, fmt.Errorf("%s: %w", j.Preset, err)
	}
	r := &Runner{be: be, e: e}
	if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, spec.Init(1)); err != nil {
		r.Close()
		return nil, err
	}
	if err := e.Init(); err != nil {
		r.Close()
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b := data.Batch{B: j.B, T: j.T, Inputs: make([]int32, j.B*j.T), Targets: make([]int32, j.B*j.T), NumTargets: j.B * j.T}
	for i := range b.Inputs {
		b.Inputs[i] = int32(rng.IntN(spec.VocabSize()))
		b.Targets[i] = b.Inputs[i]
	}
	r.batches = []data.Batch{b}
	for range max(j.Warm, 1) {
		if _, err := r.Step(); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// MemStats is the runner's backend memory: its high-water mark is the
// device memory the engine's steps needed.
func (r *Runner) MemStats() backend.MemStats { return r.be.MemStats() }

// Engine is the runner's engine (bench/kernels replays its graph's nodes).
func (r *Runner) Engine() *engine.Engine { return r.e }

// Step runs one step and returns its wall time in seconds.
func (r *Runner) Step() (float64, error) {
	start := time.Now()
	if _, err := r.e.Step(r.batches, 1e-4); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds(), nil
}

// Close frees the engine and closes the backend.
func (r *Runner) Close() {
	r.e.Free()
	r.be.Close()
}

// LoadAvg is the first three fields of /proc/loadavg ("unknown" where it
// cannot be read): the benchmarks that time steps print it at their start
// and end, since other work on a shared machine shows in their times.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
