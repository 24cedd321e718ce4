//go:build cuda || cudasim

package devicetest

import (
	"errors"
	"testing"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// CheckedCUDA is the CUDA backend, in a 64 MiB budget and refusing calls
// off its device goroutine, behind the hazard wrapper: when t ends it is
// closed and every hazard it saw is one of t's errors. t is skipped
// without a device.
func CheckedCUDA(t testing.TB) *hazard.Backend {
	t.Helper()
	raw, err := cuda.New(cuda.Config{MemBudget: 64 << 20, CheckGoroutine: true})
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	be := hazard.Wrap(raw)
	t.Cleanup(func() {
		for _, h := range be.Hazards() {
			t.Errorf("hazard: %v", h)
		}
		be.Close()
	})
	return be
}
