// Package devicetest is what the tests of the CUDA path share: whether
// the CUDA backend opens here (a build with the cuda or cudasim tag, and a
// device, real or simulated), and opening it for one test.
package devicetest

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/device"
)

// RequireCUDA skips t unless the CUDA backend opens here. It opens and
// closes a probe, so a test that opens its backends later (per subtest)
// is skipped as a whole, before any reference work on the CPU.
func RequireCUDA(t testing.TB) {
	t.Helper()
	probe, err := device.Open(device.Config{Kind: device.CUDA})
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	if err := probe.Close(); err != nil {
		t.Fatal(err)
	}
}

// OpenCUDA opens the CUDA backend for t, with no memory budget, and
// closes it when t ends; t fails when it does not open (RequireCUDA
// first where it may not).
func OpenCUDA(t testing.TB) backend.Backend {
	t.Helper()
	be, err := device.Open(device.Config{Kind: device.CUDA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}
