// Command train measures training throughput (tokens/s) of the CPU
// backend for the tiny and gpt2 (124M) presets: forward, backward and AdamW
// on random tokens, after one warm-up step. It is part of `make bench`.
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
	"github.com/lsp-offload/lsp-offload/train/gpt2"
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
	fmt.Printf("training throughput, CPU backend, %d threads, SIMD %v\n", *threads, host.ActiveSIMD())
	fmt.Printf("%-8s %4s %5s %6s %12s %12s\n", "model", "B", "T", "steps", "s/step", "tokens/s")
	for _, j := range []job{{"tiny", 32, 24, 20}, {"gpt2", 4, 256, 3}} {
		sec, err := measure(j, *threads)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench train:", err)
			os.Exit(1)
		}
		fmt.Printf("%-8s %4d %5d %6d %12.3f %12.0f\n", j.preset, j.B, j.T, j.steps, sec, float64(j.B*j.T)/sec)
	}
}

// measure returns seconds per training step.
func measure(j job, threads int) (float64, error) {
	cfg, err := gpt2.Preset(j.preset)
	if err != nil {
		return 0, err
	}
	be := cpu.New(cpu.Config{Threads: threads})
	defer be.Close()
	s := be.DefaultStream()
	m, err := gpt2.New(be, cfg, j.B, j.T, backend.F32)
	if err != nil {
		return 0, err
	}
	if err := backend.Upload(be, s, m.Params, gpt2.Init(cfg, 1)); err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]int32, j.B*j.T)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(cfg.V))
	}
	if err := backend.UploadInt32(be, s, m.Inputs, tokens); err != nil {
		return 0, err
	}
	if err := backend.UploadInt32(be, s, m.Targets, tokens); err != nil {
		return 0, err
	}
	var ts []optim.Tensor
	for _, p := range m.Layout() {
		ts = append(ts, optim.Tensor{Name: p.Name, Offset: p.Offset, Len: p.Len(), Decay: p.Decay})
	}
	opt, err := optim.New(be, optim.DefaultHyper(), m.Params, m.Grads, ts)
	if err != nil {
		return 0, err
	}
	step := func() error {
		for _, f := range []func() error{
			func() error { return m.ZeroGrads(s) },
			func() error { return m.Forward(s) },
			func() error { return m.CrossEntropy(s, 1/float32(len(tokens))) },
			func() error { return m.Backward(s) },
			func() error { return opt.Step(s, 1e-4) },
		} {
			if err := f(); err != nil {
				return err
			}
		}
		return be.Synchronize(s)
	}
	if err := step(); err != nil { // warm-up
		return 0, err
	}
	start := time.Now()
	for i := 0; i < j.steps; i++ {
		if err := step(); err != nil {
			return 0, err
		}
	}
	return time.Since(start).Seconds() / float64(j.steps), nil
}
