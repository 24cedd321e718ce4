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
	"os"
	"runtime"

	"github.com/lsp-offload/lsp-offload/bench/internal/steps"
	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/engine"
)

func main() {
	threads := flag.Int("threads", runtime.NumCPU(), "compute threads")
	flag.Parse()
	host.SetThreads(*threads)
	fmt.Printf("training throughput, CPU backend, %d threads, SIMD %v, pipelined schedule, link not charged\n", *threads, host.ActiveSIMD())
	fmt.Printf("%-6s %-6s %4s %5s %6s %10s %10s %14s\n", "model", "mode", "B", "T", "steps", "s/step", "tokens/s", "link MiB/step")
	for _, j := range []steps.Job{{Preset: "tiny", B: 32, T: 24, Steps: 20}, {Preset: "gpt2", B: 4, T: 256, Steps: 3}} {
		for _, mode := range []engine.Mode{engine.Native, engine.Zero, engine.LSP} {
			r, err := steps.Measure(j, steps.Config(mode, true, *threads), cpu.Config{Threads: *threads}, nil)
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench train:", err)
				os.Exit(1)
			}
			sec := r.Mean()
			fmt.Printf("%-6s %-6s %4d %5d %6d %10.3f %10.0f %14.2f\n", j.Preset, mode, j.B, j.T, j.Steps, sec,
				float64(j.B*j.T)/sec, float64(r.LinkBytes)/(1<<20))
		}
	}
}
