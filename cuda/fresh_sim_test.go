//go:build cudasim

// The stale-build check of the simulated build, as kernels/simtest has
// it: Go's build cache keys this package on its own files and on
// CGO_CXXFLAGS, not on the kernels and the runtime it includes from
// ../kernels, so after editing kernels/gemm.cu a plain `go test` may link
// objects compiled from the old source. `make cudasim-test` passes a hash
// of the sources (-DLSP_SIM_SOURCES, the Makefile's SIM_HASH), which both
// forces a rebuild and lets checkFresh compare the exact hash; without it
// the check compares modification times with the compile time.

package cuda

import (
	"github.com/lsp-offload/lsp-offload/internal/simfresh"
)

// checkFresh reports a stale build (see internal/simfresh).
func checkFresh() error {
	return simfresh.Check(simBuildInfo(), "..",
		"Go's build cache does not see the kernel and runtime sources outside cuda/; run `make cudasim-test` (RUN=TestName to select tests), which rebuilds with a hash of the sources")
}
