package opsgen

import (
	"bytes"
	"os"
	"testing"
)

// TestGeneratedUpToDate: an op added to the table or a launcher changed in
// kernels.h without `go generate ./cuda` fails here, in plain `go test`.
func TestGeneratedUpToDate(t *testing.T) {
	want, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("../../ops_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Error("cuda/ops_gen.go is out of date with the op table or kernels.h: run `go generate ./cuda` and commit the result")
	}
}
