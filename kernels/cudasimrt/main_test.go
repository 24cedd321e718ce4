//go:build cudasim

package cudasimrt

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/internal/simfresh"
)

// TestMain refuses a stale build: Go's build cache keys this package on its
// own files and on the cgo flags, not on the runtime and kernels it
// includes from ../, so `make cudasim-rt-test` passes their hash
// (-DLSP_SIM_SOURCES, the Makefile's SIM_SRCS, as for simtest).
func TestMain(m *testing.M) {
	if err := checkFresh(); err != nil {
		fmt.Fprintf(os.Stderr, "cudasimrt: %v\n", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// checkFresh reports a stale build (see internal/simfresh).
func checkFresh() error {
	return simfresh.Check(buildInfo(), filepath.Join("..", ".."),
		"Go's build cache does not see the sources this package includes from ../; run `make cudasim-rt-test` (RUN=TestName selects tests), which rebuilds with a hash of them")
}
