//go:build cudasim

package kernelbench

import (
	"errors"

	"github.com/lsp-offload/lsp-offload/train/trace"
)

// cublasMissing: the simulated runtime has no cuBLAS.
func cublasMissing() string { return "the simulated runtime has no cuBLAS" }

func cublasGemm(trace.GemmArgs, int) (float64, error) {
	return 0, errors.New("no cuBLAS on the simulated runtime")
}
