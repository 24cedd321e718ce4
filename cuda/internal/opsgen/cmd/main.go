// Command opsgen writes cuda/ops_gen.go, the CUDA backend's launches, from
// the op table and kernels.h (package cuda/internal/opsgen). Run it in
// cuda/, as `go generate ./cuda` does:
//
//	go run ./internal/opsgen/cmd
//
// It writes the file only when its contents change.
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/lsp-offload/lsp-offload/cuda/internal/opsgen"
)

func main() {
	out, err := opsgen.Generate()
	if err == nil {
		if old, rerr := os.ReadFile("ops_gen.go"); rerr != nil || !bytes.Equal(old, out) {
			err = os.WriteFile("ops_gen.go", out, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "opsgen:", err)
		os.Exit(1)
	}
}
