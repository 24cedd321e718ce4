//go:build cudasim

package main

import (
	"errors"

	"github.com/lsp-offload/lsp-offload/train/trace"
)

// haveCublas: the simulated runtime has no cuBLAS.
const haveCublas = false

func cublasGemm(trace.GemmArgs, int) (float64, error) {
	return 0, errors.New("no cuBLAS on the simulated runtime")
}
