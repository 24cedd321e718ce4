//go:build cuda || cudasim

package plan

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/device/devicetest"
)

// TestMeasuredOpsCUDA is TestMeasuredOpsFromEvents on the CUDA backend (a
// GPU, or the simulated runtime under -tags cudasim, whose events time the
// kernels as they run on the CPU): the planner's graph priced with per-op
// times measured by the backend's own events, the hook a GPU's predictions
// are checked with.
func TestMeasuredOpsCUDA(t *testing.T) {
	devicetest.RequireCUDA(t)
	checkMeasuredOps(t, backend.BF16, func() (backend.Backend, error) { return device.Open(device.Config{Kind: device.CUDA}) })
}
