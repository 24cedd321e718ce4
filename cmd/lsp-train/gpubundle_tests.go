// gpu-test: the Go test binaries the GPU bundle carries.
//
// Why whole test binaries, embedded: the kernel tests (kernels/simtest),
// the backend's conformance suite (cuda) and the CPU-vs-CUDA training
// comparison (train's TestCUDATrainsLikeCPU) are _test.go files with
// their own TestMain, helpers and child processes (a test that poisons
// the device re-runs the test binary as a child). Moving them into
// importable packages would rewrite thousands of lines of tests and
// change how `go test` finds them; embedding the binaries `go test -c`
// builds keeps them exactly as CI runs them, with their -test.run
// selection, in one file to copy. The cost is size: each carries its own
// copy of the kernels, so the bundle compresses them (gzip) and the
// Makefile checks the folder's size.

package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// testPayloads are the embedded test binaries by name (kernels, cuda,
// train): gzip'd `go test -c` output; empty in a build that is not a
// bundle (see gpubundle_payload.go).
var testPayloads = map[string][]byte{}

// bundleSrcEnv, when set, is a checkout whose package folders the test
// binaries run in, as go test runs them: the simulated kernel tests check
// that they were built from the sources there (CI sets it). Unset (on a
// GPU machine with only the bundle), they run in an empty folder.
const bundleSrcEnv = "LSP_BUNDLE_SRC"

// testPackageDir is each payload's package folder in a checkout.
var testPackageDir = map[string]string{"kernels": "kernels/simtest", "cuda": "cuda", "train": "train"}

// gpuTestCmd runs `lsp-train gpu-test NAME [test flags]`: the embedded test
// binary NAME with the flags given (-test.v, -test.run, ...), its output
// and exit status passed through.
func gpuTestCmd(args []string, stdout io.Writer, stderr *os.File) error {
	var names []string
	for n := range testPayloads {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(stdout, "usage: lsp-train gpu-test NAME [-test.run REGEXP] [-test.v] ...\nruns the bundle's test binary NAME (this binary has: %s)\n",
			strings.Join(append(names, "none")[:max(len(names), 1)], ", "))
		return nil
	}
	gz, ok := testPayloads[args[0]]
	if !ok {
		if len(names) == 0 {
			return errors.New("this binary carries no test binaries: build it with make gpu-bundle (or make cudasim-bundle-test)")
		}
		return fmt.Errorf("no test binary %q (have %s)", args[0], strings.Join(names, ", "))
	}
	tmp, err := os.MkdirTemp("", "lsp-gpu-test-")
	if err != nil {
		return fmt.Errorf("gpu-test: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, args[0]+".test")
	if err := unpack(gz, bin); err != nil {
		return fmt.Errorf("gpu-test %s: %w", args[0], err)
	}
	cmd := exec.Command(bin, args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, stdout, stderr
	cmd.Dir = tmp
	if src := os.Getenv(bundleSrcEnv); src != "" {
		cmd.Dir = filepath.Join(src, testPackageDir[args[0]])
	}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return exitStatus{code: ee.ExitCode(), err: fmt.Errorf("gpu-test %s: %w", args[0], err)}
		}
		return fmt.Errorf("gpu-test %s: %w", args[0], err)
	}
	return nil
}

// exitStatus passes a child's exit status on (exitCoder).
type exitStatus struct {
	code int
	err  error
}

func (e exitStatus) Error() string { return e.err.Error() }
func (e exitStatus) Unwrap() error { return e.err }
func (e exitStatus) ExitCode() int { return max(e.code, 1) }

// unpack writes the gunzipped gz to an executable file at path.
func unpack(gz []byte, path string) error {
	r, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
