// Command trainstep times this project's native training step (the CPU
// backend, engine.Native, pipelined, fp32) for one preset and prints one
// machine-readable line, for bench/peers/train_peers.sh, which runs it once
// per round interleaved with PyTorch's step:
//
//	trainstep preset=gpt2 threads=2 B=4 T=256 steps=2 best_s=10.873 mean_s=11.020 setup_s=1.234
//
// best_s and mean_s are seconds per step over the timed steps, after one
// warm-up step; setup_s (building the engine and model) is not in them.
// The engine is set up as bench/train sets up its native rows: dense
// parameters on the device, optim.DefaultHyper, random tokens with the
// inputs as targets, lr 1e-4.
package main

import (
	"flag"
	"fmt"
	"math"
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

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "trainstep:", err)
		os.Exit(1)
	}
}

func run() error {
	preset := flag.String("preset", "tiny", "model preset ("+models.PresetList()+")")
	threads := flag.Int("threads", runtime.NumCPU(), "compute threads")
	batch := flag.Int("batch", 0, "sequences per step (0: bench/train's, 32 for tiny, 4 otherwise)")
	seq := flag.Int("seq", 0, "tokens per sequence (0: bench/train's, 24 for tiny, 256 otherwise)")
	steps := flag.Int("steps", 3, "timed steps, after one warm-up")
	flag.Parse()
	if *steps < 1 || *threads < 1 {
		return fmt.Errorf("-steps = %d, -threads = %d: want both >= 1", *steps, *threads)
	}
	B, T := 4, 256
	if *preset == "tiny" {
		B, T = 32, 24
	}
	if *batch > 0 {
		B = *batch
	}
	if *seq > 0 {
		T = *seq
	}
	host.SetThreads(*threads)

	setup := time.Now()
	cfg, err := models.Preset(*preset)
	if err != nil {
		return fmt.Errorf("-preset: %w", err)
	}
	be := cpu.New(cpu.Config{Threads: *threads})
	defer be.Close()
	ec := engine.Config{Mode: engine.Native, DenseParams: engine.DenseDevice, Hyper: optim.DefaultHyper(),
		Pipelined: true, Seed: 1, HostThreads: *threads}
	e, err := engine.New(be, cfg, B, T, 1, backend.F32, ec)
	if err != nil {
		return fmt.Errorf("engine for %s B=%d T=%d: %w", *preset, B, T, err)
	}
	defer e.Free()
	if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, cfg.Init(1)); err != nil {
		return fmt.Errorf("uploading %s parameters: %w", *preset, err)
	}
	if err := e.Init(); err != nil {
		return fmt.Errorf("engine init: %w", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b := data.Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T), NumTargets: B * T}
	for i := range b.Inputs {
		b.Inputs[i] = int32(rng.IntN(cfg.VocabSize()))
		b.Targets[i] = b.Inputs[i]
	}
	batches := []data.Batch{b}
	setupSec := time.Since(setup).Seconds()

	best, total := math.Inf(1), 0.0
	for i := 0; i <= *steps; i++ { // step 0 is the warm-up
		t0 := time.Now()
		if _, err := e.Step(batches, 1e-4); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		if i == 0 {
			continue
		}
		d := time.Since(t0).Seconds()
		best, total = min(best, d), total+d
	}
	fmt.Printf("trainstep preset=%s threads=%d B=%d T=%d steps=%d best_s=%.4f mean_s=%.4f setup_s=%.3f\n",
		*preset, *threads, B, T, *steps, best, total/float64(*steps), setupSec)
	return nil
}
