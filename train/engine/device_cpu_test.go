//go:build !(cuda || cudasim)

package engine

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// deviceBackend opens the backend that the device tests (zero matches
// native, pipelined matches sequential, every edge is needed) run on: in
// this build the CPU backend, in its hazard mode (declared accesses checked
// at enqueue, seeded random delays) when hazard is set. Builds with -tags
// cuda or cudasim run the same tests on the CUDA backend
// (device_cuda_test.go).
func deviceBackend(t *testing.T, hazard bool, seed uint64) (backend.Backend, func() []string) {
	t.Helper()
	bc := cpu.Config{Threads: 2}
	if hazard {
		bc = hazardConfig(seed)
	}
	be := cpu.New(bc)
	return be, cpuHazards(be)
}

// deviceIsCUDA: the device tests run on the CUDA backend in this build.
const deviceIsCUDA = false

// deviceDType is the weights' dtype the device tests use for dt: dt itself
// on the CPU backend, which has every dtype.
func deviceDType(dt backend.DType) backend.DType { return dt }
