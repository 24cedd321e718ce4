package engine

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/backend/backendtest"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
)

// TestNoHostAllocsPerStep: once warmed up, steps pin no host memory (on
// CUDA every pinned free synchronizes the device): the loss read-back, the
// gradient norm, the dense Adam's norms and the projector checks with
// their refits all go through buffers allocated before.
func TestNoHostAllocsPerStep(t *testing.T) {
	for _, tc := range pipelinedModes() {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrainer(t, tc.cfg, backend.BF16, 2, cpu.Config{Threads: 2})
			step := func(i int) {
				t.Helper()
				if tr.e.CheckDue() || tc.cfg.Mode == LSP && i > 0 {
					// A check every step: each refits (and uploads) projectors.
					if _, err := tr.e.Check(batches(500+uint64(i), tr.e.CalibBatches())); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := tr.e.Step(batches(uint64(i), 2), 1e-2); err != nil {
					t.Fatal(err)
				}
				if _, err := tr.e.GradNorm(); err != nil {
					t.Fatal(err)
				}
			}
			step(0) // warm-up: the staging buffer is allocated by the first transfer, if not before
			warm := tr.cpu.HostAllocs()
			for i := 1; i <= 3; i++ {
				step(i)
			}
			if n := tr.cpu.HostAllocs() - warm; n != 0 {
				t.Errorf("%d host allocations in 3 steps after warm-up, want 0", n)
			}
		})
	}
}

// TestFreeEndsGoroutines: an engine's streams, events and host workers end
// with Free; nothing it started outlives it.
func TestFreeEndsGoroutines(t *testing.T) {
	for _, mode := range []Mode{Native, Zero, LSP} {
		for _, pipelined := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pipelined=%v", mode, pipelined), func(t *testing.T) {
				be := cpu.New(cpu.Config{Threads: 2})
				defer be.Close()
				before := backendtest.QuietGoroutines()
				cfg := testConfig(mode)
				cfg.Pipelined = pipelined
				e, err := New(be, small, testB, testT, 1, backend.F32, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, gpt2.Init(small, 11)); err != nil {
					t.Fatal(err)
				}
				if err := e.Init(); err != nil {
					t.Fatal(err)
				}
				if _, err := e.Step(batches(1, 1), 1e-2); err != nil {
					t.Fatal(err)
				}
				if runtime.NumGoroutine() < before+2 {
					t.Fatalf("%d goroutines with the engine, %d before: its streams are not counted", runtime.NumGoroutine(), before)
				}
				if err := e.Free(); err != nil {
					t.Fatalf("Free: %v", err)
				}
				if n := backendtest.SettledGoroutines(before); n > before {
					t.Errorf("%d goroutines after Free, %d before New", n, before)
				}
				if in := be.MemStats().InUse; in != 0 {
					t.Errorf("%d device bytes still allocated after Free", in)
				}
			})
		}
	}
}
