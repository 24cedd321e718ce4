//go:build cuda

package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
)

// TestMain runs the tests on device 0, or says in one line why it cannot
// and exits 0: a machine without a usable GPU (sm_80 or newer) skips the
// package, as one without CUDA's headers skips the simulator tests.
func TestMain(m *testing.M) {
	if !inChild() {
		devs, err := Devices()
		if err == nil {
			_, err = pick(devs, 0)
		}
		if err != nil {
			fmt.Printf("cuda: SKIP: the CUDA backend tests need a CUDA device of sm_80 or newer: %v\n", err)
			os.Exit(0)
		}
		fmt.Printf("cuda: GPU mode on %s; build/libkernels.a %s\n", devs[0], kernels.Library())
	}
	os.Exit(m.Run())
}
