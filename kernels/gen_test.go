package kernels_test

import (
	"bytes"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels/internal/kernelgen"
)

// TestGeneratedUpToDate regenerates the Go faces from the headers in memory
// and compares them with the committed files: a launcher added to
// kernels.h (or selftest.h) without `go generate ./kernels` fails here, in
// plain `go test`, with no CUDA needed.
func TestGeneratedUpToDate(t *testing.T) {
	for _, target := range kernelgen.Targets {
		src, err := os.ReadFile(target.Header)
		if err != nil {
			t.Fatal(err)
		}
		files, err := kernelgen.Generate(target, src)
		if err != nil {
			t.Fatalf("%s: %v", target.Header, err)
		}
		names := make([]string, 0, len(files))
		for name := range files {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			have, err := os.ReadFile(name)
			if err != nil {
				t.Errorf("%s (from %s): %v; run `go generate ./kernels`", name, target.Header, err)
				continue
			}
			if !bytes.Equal(have, files[name]) {
				t.Errorf("%s is out of date with %s: run `go generate ./kernels` and commit the result; first difference:\n%s",
					name, target.Header, firstDiff(string(have), string(files[name])))
			}
		}
	}
}

// firstDiff shows the first line where two texts differ.
func firstDiff(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(h), len(w)); i++ {
		var a, b string
		if i < len(h) {
			a = h[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return "line " + strconv.Itoa(i+1) + ":\n  committed: " + a + "\n  generated: " + b
		}
	}
	return "(none)"
}
