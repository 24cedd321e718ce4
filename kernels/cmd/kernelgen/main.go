// Command kernelgen writes the Go face of the CUDA launchers from their
// headers (see package kernels/internal/kernelgen): kernels.h into package
// kernels (launch_gen.go, launchers_gen.go) and the simulator's self-test
// launchers (simtest/selftest.h) into kernels/simtest (selftest_gen.go).
//
// Run it in the kernels directory, as `go generate ./kernels` does:
//
//	go run ./cmd/kernelgen [-dir .]
//
// It writes only files whose contents change, and fails, naming the line,
// on a header it cannot read (then it writes nothing).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/lsp-offload/lsp-offload/kernels/internal/kernelgen"
)

func main() {
	dir := flag.String("dir", ".", "the kernels directory")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "kernelgen:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	files := map[string][]byte{}
	for _, t := range kernelgen.Targets {
		src, err := os.ReadFile(filepath.Join(dir, t.Header))
		if err != nil {
			return err
		}
		out, err := kernelgen.Generate(t, src)
		if err != nil {
			return err
		}
		for name, data := range out {
			files[name] = data
		}
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		path := filepath.Join(dir, name)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, files[name]) {
			continue
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return err
		}
		fmt.Println("kernelgen: wrote", path)
	}
	return nil
}
