// Command kernels times the CUDA kernels at the shapes a model trains at
// (make bench-kernels); the measurement is package bench/kernelbench,
// which the GPU bundle's binary also runs (lsp-train bench-kernels).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/lsp-offload/lsp-offload/bench/kernelbench"
)

func main() {
	if err := kernelbench.Run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench-kernels:", err)
		os.Exit(1)
	}
}
