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
//
// With -recompute listing several settings (none,attn,layer) each row is
// run under each of them, their engines alive at once and stepped in
// turn, round after round, so that the time each setting adds is measured
// against the first setting (the control) on the same machine state; the
// table gives the device high-water mark each reached and the memory plan
// beside it.
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
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

func main() {
	threads := flag.Int("threads", runtime.NumCPU(), "compute threads")
	models := flag.String("models", "tiny,gpt2", "comma-separated presets to run (tiny, gpt2)")
	modes := flag.String("modes", "native,zero,lsp", "comma-separated update modes to run")
	gpt2T := flag.Int("gpt2-t", 256, "sequence length of the gpt2 rows (batch 4)")
	families := flag.Bool("families", false, "also time one step per row op by op and print the seconds per op family")
	recompute := flag.String("recompute", "none", "comma-separated --recompute settings; several: each row under each, interleaved, with time and memory against the first")
	flag.Parse()
	var settings []model.Recompute
	for _, s := range strings.Split(*recompute, ",") {
		rc, err := model.ParseRecompute(s)
		if err != nil {
			fail(fmt.Errorf("-recompute: %w", err))
		}
		settings = append(settings, rc)
	}
	host.SetThreads(*threads)
	jobs := map[string]steps.Job{
		"tiny": {Preset: "tiny", B: 32, T: 24, Steps: 20},
		"gpt2": {Preset: "gpt2", B: 4, T: *gpt2T, Steps: 3},
	}
	fmt.Printf("training throughput, CPU backend, %d threads, SIMD %v, pipelined schedule, link not charged, load %s\n",
		*threads, host.ActiveSIMD(), steps.LoadAvg())
	if len(settings) == 1 {
		fmt.Printf("%-6s %-6s %4s %5s %6s %10s %10s %14s\n", "model", "mode", "B", "T", "steps", "s/step", "tokens/s", "link MiB/step")
	}
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
			if len(settings) > 1 {
				t, err := recomputeTable(j, mode, settings, *threads)
				if err != nil {
					fail(err)
				}
				tables = append(tables, t)
				continue
			}
			ec := steps.Config(mode, true, *threads)
			ec.Recompute = settings[0]
			r, err := steps.Measure(j, ec, cpu.Config{Threads: *threads}, nil)
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

// recomputeTable runs j in mode under each recompute setting, the
// engines alive at once and stepped in turn for j.Steps rounds, and
// writes each setting's median step, its ratio to the first setting's
// median over the same rounds, and its device high-water mark beside the
// memory plan.
func recomputeTable(j steps.Job, mode engine.Mode, settings []model.Recompute, threads int) (string, error) {
	runners := make([]*steps.Runner, len(settings))
	plans := make([]int64, len(settings))
	defer func() {
		for _, r := range runners {
			if r != nil {
				r.Close()
			}
		}
	}()
	spec, err := catalog.Preset(j.Preset)
	if err != nil {
		return "", err
	}
	for i, rc := range settings {
		ec := steps.Config(mode, true, threads)
		ec.Recompute = rc
		p, err := engine.MemoryOf(spec, j.B, j.T, 1, backend.F32, ec)
		if err != nil {
			return "", err
		}
		plans[i] = p.DeviceTotal()
		if runners[i], err = steps.Start(j, ec, cpu.Config{Threads: threads}, nil); err != nil {
			return "", err
		}
	}
	secs := make([]steps.Result, len(settings))
	for range j.Steps {
		for i, r := range runners {
			s, err := r.Step()
			if err != nil {
				return "", err
			}
			secs[i].Seconds = append(secs[i].Seconds, s)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "recompute, %s B=%d T=%d %s pipelined, %d interleaved rounds, load %s:\n", j.Preset, j.B, j.T, mode, j.Steps, steps.LoadAvg())
	fmt.Fprintf(&sb, "%-9s %10s %9s %14s %14s\n", "recompute", "s/step", "x "+settings[0].String(), "device MiB", "plan MiB")
	for i, rc := range settings {
		fmt.Fprintf(&sb, "%-9v %10.3f %9.3f %14.2f %14.2f\n", rc, secs[i].Median(), secs[i].Median()/secs[0].Median(),
			float64(runners[i].MemStats().HighWater)/(1<<20), float64(plans[i])/(1<<20))
	}
	return sb.String(), nil
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
	sec, count, sum := trace.ByFamily(ops)
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
