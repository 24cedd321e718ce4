//go:build cuda || cudasim

package lsp

import (
	"errors"
	"testing"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// The fit on the CUDA backend (the simulated runtime under -tags cudasim),
// checked by the hazard wrapper, against the same host references and
// tolerances as on the CPU backend.
func init() {
	backends = append(backends, struct {
		name string
		open func(t *testing.T) backend.Backend
	}{"cuda", func(t *testing.T) backend.Backend {
		be, err := cuda.New(cuda.Config{MemBudget: 64 << 20, CheckGoroutine: true})
		if errors.Is(err, cuda.ErrNoDevice) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		w := hazard.Wrap(be)
		t.Cleanup(func() {
			for _, h := range w.Hazards() {
				t.Errorf("hazard: %v", h)
			}
		})
		return w
	}})
}
