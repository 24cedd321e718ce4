// Command trainstep times this project's native training step (the CPU
// backend, engine.Native, pipelined, fp32) for one preset and prints one
// machine-readable line, for bench/peers/train_peers.sh, which runs it once
// per round interleaved with PyTorch's step:
//
//	trainstep preset=gpt2 threads=2 B=4 T=256 steps=2 best_s=10.873 mean_s=11.020 setup_s=1.234
//
// best_s and mean_s are seconds per step over the timed steps, after one
// warm-up step; setup_s (building the engine and model, and the warm-up
// step) is not in them. The engine is bench/train's native row
// (bench/internal/steps: dense parameters on the device,
// optim.DefaultHyper, random tokens).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/lsp-offload/lsp-offload/bench/internal/steps"
	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/engine"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "trainstep:", err)
		os.Exit(1)
	}
}

func run() error {
	preset := flag.String("preset", "tiny", "model preset ("+catalog.PresetList()+")")
	threads := flag.Int("threads", runtime.NumCPU(), "compute threads")
	batch := flag.Int("batch", 0, "sequences per step (0: bench/train's, 32 for tiny, 4 otherwise)")
	seq := flag.Int("seq", 0, "tokens per sequence (0: bench/train's, 24 for tiny, 256 otherwise)")
	nSteps := flag.Int("steps", 3, "timed steps, after one warm-up")
	flag.Parse()
	if *nSteps < 1 || *threads < 1 {
		return fmt.Errorf("-steps = %d, -threads = %d: want both >= 1", *nSteps, *threads)
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
	var setupSec float64
	j := steps.Job{Preset: *preset, B: B, T: T, Steps: *nSteps, Timed: func() { setupSec = time.Since(setup).Seconds() }}
	res, err := steps.Measure(j, steps.Config(engine.Native, true, *threads), cpu.Config{Threads: *threads}, nil)
	if err != nil {
		return fmt.Errorf("-preset %s B=%d T=%d: %w", *preset, B, T, err)
	}
	best := slices.Min(res.Seconds)
	fmt.Printf("trainstep preset=%s threads=%d B=%d T=%d steps=%d best_s=%.4f mean_s=%.4f setup_s=%.3f\n",
		*preset, *threads, B, T, *nSteps, best, res.Mean(), setupSec)
	return nil
}
