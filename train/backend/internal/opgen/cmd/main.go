// Command opgen writes train/backend/ops_gen.go from the op table,
// optable.go (package train/backend/internal/opgen). Run it in
// train/backend, as `go generate ./train/backend` does:
//
//	go run ./internal/opgen/cmd
//
// It writes the file only when its contents change.
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/lsp-offload/lsp-offload/train/backend/internal/opgen"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "opgen:", err)
		os.Exit(1)
	}
}

func run() error {
	src, err := os.ReadFile("optable.go")
	if err != nil {
		return err
	}
	out, err := opgen.Generate(src)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile("ops_gen.go"); err == nil && bytes.Equal(old, out) {
		return nil
	}
	return os.WriteFile("ops_gen.go", out, 0o644)
}
