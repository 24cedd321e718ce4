//go:build cuda || cudasim

package lsp

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/device/devicetest"
)

// The fit on the CUDA backend (the simulated runtime under -tags cudasim),
// checked by the hazard wrapper, against the same host references and
// tolerances as on the CPU backend.
func init() {
	backends = append(backends, struct {
		name string
		open func(t *testing.T) backend.Backend
	}{"cuda", func(t *testing.T) backend.Backend { return devicetest.CheckedCUDA(t) }})
}
