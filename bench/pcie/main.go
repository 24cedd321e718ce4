// Command pcie measures the host-device link of CUDA device 0 (make
// bench-pcie); the measurement is package bench/pciebench, which the GPU
// bundle's binary also runs (lsp-train bench-pcie).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/lsp-offload/lsp-offload/bench/pciebench"
)

func main() {
	if err := pciebench.Run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench-pcie:", err)
		os.Exit(1)
	}
}
