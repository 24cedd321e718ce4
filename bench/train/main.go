// Command train measures training throughput (tokens/s) of the CPU backend
// in each update mode (native, zero, lsp) for the tiny and gpt2 (124M)
// presets: full steps through train/engine (forward, backward, the mode's
// offload schedule, pipelined) on random tokens, after one warm-up step.
// lsp runs with never-fitted projectors (d 512 capped per matrix, r 16) so
// that only steady-state steps are timed; its projector checks cost extra
// every --check-every steps. It is part of `make bench`.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/models"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

type job struct {
	preset      string
	B, T, steps int
}

func main() {
	threads := flag.Int("threads", runtime.NumCPU(), "compute threads")
	flag.Parse()
	host.SetThreads(*threads)
	fmt.Printf("training throughput, CPU backend, %d threads, SIMD %v, pipelined schedule, link not charged\n", *threads, host.ActiveSIMD())
	fmt.Printf("%-6s %-6s %4s %5s %6s %10s %10s %14s\n", "model", "mode", "B", "T", "steps", "s/step", "tokens/s", "link MiB/step")
	for _, j := range []job{{"tiny", 32, 24, 20}, {"gpt2", 4, 256, 3}} {
		for _, mode := range []engine.Mode{engine.Native, engine.Zero, engine.LSP} {
			sec, link, err := measure(j, mode, *threads)
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench train:", err)
				os.Exit(1)
			}
			fmt.Printf("%-6s %-6s %4d %5d %6d %10.3f %10.0f %14.2f\n", j.preset, mode, j.B, j.T, j.steps, sec,
				float64(j.B*j.T)/sec, float64(link)/(1<<20))
		}
	}
}

// measure returns seconds per training step and link bytes per step.
func measure(j job, mode engine.Mode, threads int) (float64, int64, error) {
	cfg, err := models.Preset(j.preset)
	if err != nil {
		return 0, 0, err
	}
	be := cpu.New(cpu.Config{Threads: threads})
	defer be.Close()
	ec := engine.Config{Mode: mode, DenseParams: engine.DenseDevice, Hyper: optim.DefaultHyper(), Pipelined: true,
		Seed: 1, HostThreads: threads,
		LSP: engine.LSPConfig{D: 512, R: 16, Alpha: 0.5, CheckEvery: 100, CalibSamples: 32, ProjLR: 0.05, NoFit: true}}
	e, err := engine.New(be, cfg, j.B, j.T, 1, backend.F32, ec)
	if err != nil {
		return 0, 0, err
	}
	defer e.Free()
	if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, cfg.Init(1)); err != nil {
		return 0, 0, err
	}
	if err := e.Init(); err != nil {
		return 0, 0, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b := data.Batch{B: j.B, T: j.T, Inputs: make([]int32, j.B*j.T), Targets: make([]int32, j.B*j.T), NumTargets: j.B * j.T}
	for i := range b.Inputs {
		b.Inputs[i] = int32(rng.IntN(cfg.VocabSize()))
		b.Targets[i] = b.Inputs[i]
	}
	batches := []data.Batch{b}
	if _, err := e.Step(batches, 1e-4); err != nil { // warm-up
		return 0, 0, err
	}
	t0 := be.Traffic()
	start := time.Now()
	for i := 0; i < j.steps; i++ {
		if _, err := e.Step(batches, 1e-4); err != nil {
			return 0, 0, err
		}
	}
	sec := time.Since(start).Seconds() / float64(j.steps)
	t1 := be.Traffic()
	return sec, (t1.D2H + t1.H2D - t0.D2H - t0.H2D) / int64(j.steps), nil
}
