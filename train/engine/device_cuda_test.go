//go:build cuda || cudasim

package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// deviceBackend opens the backend that the device tests (zero matches
// native, pipelined matches sequential, every edge is needed) run on: in
// this build the CUDA backend, on a GPU (-tags cuda; skipped without one)
// or on the simulated runtime (-tags cudasim). The arena is small (the
// simulated device memory is real, filled memory, and the edge test opens
// a backend per edge). In hazard mode the simulated runtime delays every
// queued op by a seeded random time (cuda.SetHazardDelays), so a missing
// edge lets work run out of order.
func deviceBackend(t *testing.T, check bool, seed uint64) (backend.Backend, func() []string) {
	t.Helper()
	delay := time.Duration(0)
	if check {
		delay = 200 * time.Microsecond
	}
	cuda.SetHazardDelays(seed, delay)
	be, err := cuda.New(cuda.Config{MemBudget: 64 << 20, CheckGoroutine: true})
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !check {
		return be, func() []string { return nil }
	}
	// The delays make a missing edge likely to change results; the check
	// around the backend makes it certain to be reported, whatever the
	// timing (an edge whose absence corrupts nothing in 3 steps, such as
	// the non-finite flag's copy down, is found only this way).
	w := hazard.Wrap(be)
	return w, func() []string {
		var out []string
		for _, h := range w.Hazards() {
			out = append(out, h.String())
		}
		return out
	}
}

// deviceIsCUDA: the device tests run on the CUDA backend in this build.
const deviceIsCUDA = true

// deviceDType is the weights' dtype the device tests use for dt: bf16,
// the only one the CUDA matmul takes.
func deviceDType(backend.DType) backend.DType { return backend.BF16 }
