package engine

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// TestCheckOnDevice runs a projector check, whose fits run on the
// backend's ops (train/lsp/devicefit.go), on the device tests' backend (the CUDA
// one on the simulated runtime in cudasim builds, the CPU backend in its
// hazard mode otherwise) with its hazards checked, against the same check
// on the CPU backend at the same dtype: every matrix refitted lower, no
// hazard, and the ratios of the projectors in use (the same draws, on
// gradients that differ only by the order of sums) within 1% of the CPU
// run's.
func TestCheckOnDevice(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.FitIters = 20
	cfg.LSP.Accept = lsp.AcceptFit
	dt := deviceDType(backend.F32)
	dev := newDeviceTrainer(t, cfg, dt, 1, true, 5)
	ref := newTrainer(t, cfg, dt, 1, cpu.Config{Threads: 2})
	got, err := dev.e.Check(batches(77, dev.e.CalibBatches()))
	if err != nil {
		t.Fatal(err)
	}
	want, err := ref.e.Check(batches(77, ref.e.CalibBatches()))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || len(got) != small.L*4 {
		t.Fatalf("%d and %d reports for %d matrices", len(got), len(want), small.L*4)
	}
	for i, r := range got {
		if !r.Resampled || !(r.RatioAfter < r.RatioBefore) || r.Iters == 0 || !(r.Seconds > 0) {
			t.Errorf("%s: %+v, want a refit that lowers the ratio, timed", r.Matrix, r)
		}
		if d := math.Abs(r.RatioBefore-want[i].RatioBefore) / want[i].RatioBefore; d > 0.01 {
			t.Errorf("%s: ratio before %v, CPU backend %v", r.Matrix, r.RatioBefore, want[i].RatioBefore)
		}
	}
	if hz := dev.hazards(); len(hz) > 0 {
		t.Errorf("hazards: %v", hz)
	}
}
