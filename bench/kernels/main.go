// Command kernels times the CUDA kernels at the shapes a model trains at
// (make bench-kernels); the measurement is package bench/kernelbench,
// which the GPU bundle's binary also runs (lsp-train bench-kernels).
package main

import (
	"github.com/lsp-offload/lsp-offload/bench/internal/gpubench"
	"github.com/lsp-offload/lsp-offload/bench/kernelbench"
)

func main() {
	gpubench.Main("bench-kernels", kernelbench.Run)
}
