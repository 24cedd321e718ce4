// Command calibrate measures the CPU backend as a machine for the step
// planner (package train/calibrate) and prints the description as JSON:
// GEMM at the training step's shapes of -model at -batch x -seq-len,
// memory bandwidth, the other ops at that geometry, per-op overheads, the
// link charge and the host Adam with its contention. A line on stderr says
// how long it took.
//
// Limits: wall-clock timing; on a shared machine the numbers carry the
// other load's noise.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"time"

	"github.com/lsp-offload/lsp-offload/train/calibrate"
	"github.com/lsp-offload/lsp-offload/train/catalog"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "calibrate:", err)
		os.Exit(1)
	}
}

func run() error {
	threads := flag.Int("threads", runtime.NumCPU(), "backend compute threads and host Adam workers")
	preset := flag.String("model", "gpt2", "model preset whose step shapes are measured")
	batch := flag.Int("batch", 4, "batch size B")
	seqLen := flag.Int("seq-len", 256, "sequence length T")
	d := flag.Int("lsp-d", 512, "LSP projected size d (capped per matrix)")
	r := flag.Int("lsp-r", 16, "LSP non-zeros per projector row r")
	budget := flag.Duration("budget", 30*time.Second, "time to aim for in all")
	out := flag.String("o", "", "also write the JSON to this file")
	flag.Parse()

	spec, err := catalog.Preset(*preset)
	if err != nil {
		return fmt.Errorf("-model: %w", err)
	}
	gemms, err := calibrate.StepGemms(spec, *batch, *seqLen)
	if err != nil {
		return err
	}
	size, err := calibrate.SizeOf(spec, *batch, *seqLen)
	if err != nil {
		return fmt.Errorf("-model %s: %w", *preset, err)
	}
	size.D, size.R = *d, *r
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	c, err := calibrate.Measure(ctx, calibrate.Options{Threads: *threads, Gemms: gemms, Ops: []calibrate.OpSize{size}, Budget: *budget})
	if err != nil {
		return err
	}
	js, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	js = append(js, '\n')
	if _, err := os.Stdout.Write(js); err != nil {
		return err
	}
	if *out != "" {
		if err := os.WriteFile(*out, js, 0o644); err != nil {
			return fmt.Errorf("-o: %w", err)
		}
	}
	fmt.Fprintf(os.Stderr, "calibrate: %s B=%d T=%d, %d threads: %.1f s\n", *preset, *batch, *seqLen, c.Threads, c.Seconds)
	return nil
}
