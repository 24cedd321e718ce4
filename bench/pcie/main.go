// Command pcie measures the host-device link of CUDA device 0 (make
// bench-pcie); the measurement is package bench/pciebench, which the GPU
// bundle's binary also runs (lsp-train bench-pcie).
package main

import (
	"github.com/lsp-offload/lsp-offload/bench/internal/gpubench"
	"github.com/lsp-offload/lsp-offload/bench/pciebench"
)

func main() {
	gpubench.Main("bench-pcie", pciebench.Run)
}
