// The profile command: a few real training steps in each update mode on
// the backend at hand, every device op timed by events and every host
// node by the wall clock (train/profile), and where each step's time went
// by phase, op family and stream: a table on stdout, a record per step in
// <out>/metrics.jsonl.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/profile"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// profileDefaults are the train command's defaults for a short run:
// five steps, no held-out set (so no evaluation), checkpoints only at the
// end, in out/profile.
func profileDefaults() train.Config {
	c := train.Defaults()
	c.Steps, c.EvalFraction, c.EvalGenerate, c.EvalEvery, c.CheckpointEvery = 5, 0, 0, 0, 0
	c.Out = filepath.Join("out", "profile")
	return c
}

// bindProfileFlags binds the train command's flags, except --mode, which
// here also takes all, to c, and --mode to mode.
func bindProfileFlags(fs *flag.FlagSet, c *train.Config, mode *string) {
	tf := flag.NewFlagSet("", flag.ContinueOnError)
	bindTrainFlags(tf, c)
	tf.VisitAll(func(f *flag.Flag) {
		switch f.Name {
		case "mode", "resume", "overwrite":
			return // the profile's own --mode; each run starts afresh in its own directory
		case "out":
			f.Usage = "output `DIR`: metrics.jsonl with a profile record per step, and one directory per mode with that run's outputs (replaced)"
		}
		fs.Var(f.Value, f.Name, f.Usage)
	})
	fs.StringVar(mode, "mode", *mode, "update `MODE`: native, zero, lsp, lora, or all (one run each, in that order)")
}

// profileFlags is the profile command's flag set, bound to the
// configuration and the --mode it returns, which hold the profile's
// defaults until parsed.
func profileFlags() (*flag.FlagSet, *train.Config, *string) {
	fs := flag.NewFlagSet("lsp-train profile", flag.ContinueOnError)
	c, mode := profileDefaults(), "all"
	bindProfileFlags(fs, &c, &mode)
	return fs, &c, &mode
}

func newProfileFlags() *flag.FlagSet {
	fs, _, _ := profileFlags()
	return fs
}

func profileCmd(args []string, stdout io.Writer, stderr *os.File) error {
	fs, cfg, mode := profileFlags()
	if err := parseSubcommandFlags(fs, args, stderr, "lsp-train profile [flags]",
		"Trains --steps steps in each --mode on --device with every device op timed by a pair of events and every\n"+
			"host node by the wall clock, and prints where a step's time went: by phase (forward, backward, optimizer,\n"+
			"device-host copies, projector checks, host Adam), by op family, and each stream's busy and idle time;\n"+
			"the mean over the steps after the first (which warms up). <out>/metrics.jsonl has every step."); err != nil {
		return err
	}
	var modes []engine.Mode
	if *mode == "all" {
		modes = slices.Clone(engine.Modes)
	} else if m, err := engine.ParseMode(*mode); err != nil {
		return fmt.Errorf("--mode: %v (or all)", err)
	} else {
		modes = []engine.Mode{m}
	}
	defaultDType(fs, cfg)
	defaultMinLR(fs, cfg)
	if cfg.Steps < 1 {
		return fmt.Errorf("--steps: %d, want at least 1", cfg.Steps)
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	mw, err := metrics.Create(filepath.Join(cfg.Out, "metrics.jsonl"), -1)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	defer mw.Close()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var cols []profileColumn
	var backendName string
	for _, m := range modes {
		c := *cfg
		c.Mode, c.Out, c.Overwrite = m, filepath.Join(cfg.Out, string(m)), true
		if err := checkFitFlags(fs, c); err != nil {
			return err
		}
		steps, name, err := profileRun(c, mw, logger)
		if err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		backendName = name
		cols = append(cols, profileColumn{mode: m, steps: steps})
	}
	if err := mw.Close(); err != nil {
		return err
	}
	printProfile(stdout, *cfg, backendName, cols)
	fmt.Fprintf(stdout, "\nEvery step: %s (event %q); each mode's run: %s/<mode>/\n",
		filepath.Join(cfg.Out, "metrics.jsonl"), metrics.ProfileEvent, cfg.Out)
	return nil
}

// profileColumn is one mode's profiled steps.
type profileColumn struct {
	mode  engine.Mode
	steps []profile.Step
}

// profileRun trains c on a backend of its own, wrapped by a recorder,
// writes each step's profile to mw and returns the steps and the
// backend's name.
func profileRun(c train.Config, mw *metrics.Writer, logger *slog.Logger) ([]profile.Step, string, error) {
	be, err := device.Open(device.Config{Kind: c.Device, MemBudget: c.DeviceMem, Threads: c.Threads, Seed: c.Seed,
		LinkBandwidth: c.LinkBandwidth})
	if err != nil {
		return nil, "", fmt.Errorf("--device: %w", err)
	}
	rec := profile.Wrap(be)
	if c.Mode == engine.LoRA {
		rec.CountAdapters(c.LoRAR)
	}
	var steps []profile.Step
	opts := train.Options{Logger: logger, Backend: rec.Backend(), Ready: rec.Start,
		AfterStep: func(t train.StepTimes) error {
			st, err := rec.Step(profile.Times{Wall: t.Total, Engine: t.Engine, Check: t.Check})
			if err != nil {
				return fmt.Errorf("step %d: %w", t.Step, err)
			}
			steps = append(steps, st)
			return mw.Write(metrics.Record{Step: t.Step, Event: metrics.ProfileEvent,
				Profile: st.Metrics(string(c.Mode), be.Name(), string(c.Schedule))})
		}}
	_, err = train.Run(context.Background(), c, opts)
	name := be.Name()
	return steps, name, errors.Join(err, rec.Backend().Close())
}

// printProfile prints the table: one column per mode, the mean of its
// steps after the first (the first alone when there is one): the mean,
// not the median, so that a projector check every few steps counts at
// its share of a step.
func printProfile(w io.Writer, cfg train.Config, backendName string, cols []profileColumn) {
	med := make([]profile.Step, len(cols))
	for i, c := range cols {
		s := c.steps
		if len(s) > 1 {
			s = s[1:]
		}
		med[i] = profile.Mean(s)
	}
	which := "mean of steps 2.." + fmt.Sprint(cfg.Steps) + " (step 1 warms up)"
	if cfg.Steps == 1 {
		which = "one step, including the warm-up"
	}
	fmt.Fprintf(w, "profile: %s on %s, micro-batch %d x %d, %d per step, %v, %s schedule; %s\n",
		cfg.Model, backendName, cfg.Batch, cfg.SeqLen, cfg.GradAccum, cfg.DType, cfg.Schedule, which)
	fmt.Fprintf(w, "device: sums of op times by events; host and wall: wall clock; ms\n")
	if cfg.Device.Base() == device.CUDA && strings.Contains(cudaRuntime, "SIMULATED") {
		fmt.Fprintf(w, "SIMULATED: --device cuda in this build is the simulated CUDA runtime (make sim): its times are the CPU's, not a GPU's\n")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprint(tw, "\t")
	for _, c := range cols {
		fmt.Fprintf(tw, "%10s\t", c.mode)
	}
	fmt.Fprintln(tw)
	row := func(label string, get func(profile.Step) float64) {
		fmt.Fprintf(tw, "%s\t", label)
		for _, m := range med {
			fmt.Fprintf(tw, "%10.3f\t", get(m)*1e3)
		}
		fmt.Fprintln(tw)
	}
	heading := func(s string) { fmt.Fprintf(tw, "%s\t%s\n", s, tabs(len(cols))) }
	row("step (wall)", func(s profile.Step) float64 { return s.Wall })
	row("  engine step (wall)", func(s profile.Step) float64 { return s.Engine })
	row("  projector check (wall)", func(s profile.Step) float64 { return s.Times.Check })
	row("device ops (events)", func(s profile.Step) float64 { return s.Device })
	heading("by phase")
	for _, p := range profile.Phases() {
		label := "  " + string(p)
		if p == profile.HostAdam {
			label += " (wall)"
		}
		row(label, func(s profile.Step) float64 { return s.Phases[p] })
	}
	heading("by op family (events)")
	for _, f := range trace.Families() {
		if !slices.ContainsFunc(med, func(s profile.Step) bool { return s.FamilyOps[f] > 0 }) {
			continue
		}
		row("  "+string(f), func(s profile.Step) float64 { return s.Families[f] })
		if f == trace.Gemm && slices.ContainsFunc(med, func(s profile.Step) bool { return s.AdapterOps > 0 }) {
			// The unfused adapter path, within gemm: what a fused
			// kernel would save at most.
			row("    of which lora adapters", func(s profile.Step) float64 { return s.Adapters })
		}
	}
	heading("streams: busy / idle")
	var streams []string
	for _, m := range med {
		for s := range m.Busy {
			if !slices.Contains(streams, s) {
				streams = append(streams, s)
			}
		}
	}
	slices.Sort(streams)
	for _, s := range streams {
		fmt.Fprintf(tw, "  %s\t", s)
		for _, m := range med {
			if b, ok := m.Busy[s]; ok {
				fmt.Fprintf(tw, "%s\t", fmt.Sprintf("%.3f / %.3f", b*1e3, m.Idle[s]*1e3))
			} else {
				fmt.Fprintf(tw, "%10s\t", "-")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func tabs(n int) string {
	s := ""
	for range n - 1 {
		s += "\t"
	}
	return s
}
