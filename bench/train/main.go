// Command train measures training throughput (tokens/s) of the CPU backend
// in each update mode (native, zero, lsp) for the tiny and gpt2 (124M)
// presets: full steps through train/engine (forward, backward, the mode's
// offload schedule, pipelined) on random tokens, after one warm-up step.
// lsp runs with never-fitted projectors (d 512 capped per matrix, r 16) so
// that only steady-state steps are timed; its projector checks cost extra
// every --check-every steps. It is part of `make bench`.
//
// With -families it also times one more step per row with every op timed
// on its stream (trace.WrapTimed) and prints the seconds per op family, so
// that a change to one kind of kernel can be compared before and after.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/lsp-offload/lsp-offload/bench/internal/steps"
	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

func main() {
	threads := flag.Int("threads", runtime.NumCPU(), "compute threads")
	models := flag.String("models", "tiny,gpt2", "comma-separated presets to run (tiny, gpt2)")
	modes := flag.String("modes", "native,zero,lsp", "comma-separated update modes to run")
	gpt2T := flag.Int("gpt2-t", 256, "sequence length of the gpt2 rows (batch 4)")
	families := flag.Bool("families", false, "also time one step per row op by op and print the seconds per op family")
	flag.Parse()
	host.SetThreads(*threads)
	jobs := map[string]steps.Job{
		"tiny": {Preset: "tiny", B: 32, T: 24, Steps: 20},
		"gpt2": {Preset: "gpt2", B: 4, T: *gpt2T, Steps: 3},
	}
	fmt.Printf("training throughput, CPU backend, %d threads, SIMD %v, pipelined schedule, link not charged, load %s\n",
		*threads, host.ActiveSIMD(), steps.LoadAvg())
	fmt.Printf("%-6s %-6s %4s %5s %6s %10s %10s %14s\n", "model", "mode", "B", "T", "steps", "s/step", "tokens/s", "link MiB/step")
	var tables []string
	for _, name := range strings.Split(*models, ",") {
		j, ok := jobs[name]
		if !ok {
			fail(fmt.Errorf("-models: unknown preset %q (tiny, gpt2)", name))
		}
		for _, ms := range strings.Split(*modes, ",") {
			mode, err := engine.ParseMode(ms)
			if err != nil {
				fail(fmt.Errorf("-modes: %w", err))
			}
			r, err := steps.Measure(j, steps.Config(mode, true, *threads), cpu.Config{Threads: *threads}, nil)
			if err != nil {
				fail(err)
			}
			sec := r.Mean()
			fmt.Printf("%-6s %-6s %4d %5d %6d %10.3f %10.0f %14.2f\n", j.Preset, mode, j.B, j.T, j.Steps, sec,
				float64(j.B*j.T)/sec, float64(r.LinkBytes)/(1<<20))
			if *families {
				t, err := familyTable(j, mode, *threads)
				if err != nil {
					fail(err)
				}
				tables = append(tables, t)
			}
		}
	}
	for _, t := range tables {
		fmt.Print("\n", t)
	}
	fmt.Printf("load at the end %s\n", steps.LoadAvg())
}

// familyTable times one step of j in mode (pipelined, after a warm-up)
// with every op timed by events and returns the seconds and op count per
// family, and the rest of the step (host work, waits, gaps).
func familyTable(j steps.Job, mode engine.Mode, threads int) (string, error) {
	var w *trace.Backend
	j.Warm, j.Steps = 1, 1
	j.Timed = func() { w.Reset() }
	res, err := steps.Measure(j, steps.Config(mode, true, threads), cpu.Config{Threads: threads}, func(be backend.Backend) backend.Backend {
		w = trace.WrapTimed(be)
		return w
	})
	if err != nil {
		return "", err
	}
	ops, err := w.Times()
	if err != nil {
		return "", err
	}
	sec := map[trace.Family]float64{}
	count := map[trace.Family]int{}
	sum := 0.0
	for _, o := range ops {
		sec[o.Family] += o.Seconds
		count[o.Family]++
		sum += o.Seconds
	}
	step := res.Seconds[0]
	var sb strings.Builder
	fmt.Fprintf(&sb, "per op family, %s B=%d T=%d %s pipelined, one step of %.3f s, ops timed on their streams:\n", j.Preset, j.B, j.T, mode, step)
	fmt.Fprintf(&sb, "%-12s %5s %9s %7s\n", "family", "ops", "s", "%step")
	for _, f := range trace.Families() {
		if count[f] == 0 {
			continue
		}
		fmt.Fprintf(&sb, "%-12s %5d %9.4f %7.1f\n", f, count[f], sec[f], 100*sec[f]/step)
	}
	fmt.Fprintf(&sb, "%-12s %5d %9.4f %7.1f\n", "ops total", len(ops), sum, 100*sum/step)
	fmt.Fprintf(&sb, "%-12s %5s %9.4f %7.1f  (host work, waits, gaps; negative when streams overlap)\n", "rest", "", step-sum, 100*(step-sum)/step)
	return sb.String(), nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench train:", err)
	os.Exit(1)
}
