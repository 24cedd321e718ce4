//go:build cuda

package simtest

import (
	"fmt"
	"os"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
)

// TestMain runs the kernel tests on GPU 0, or says why it cannot and exits
// 0 (a machine without a usable GPU skips them, as one without CUDA's
// headers skips the simulator tests).
func TestMain(m *testing.M) {
	desc, err := DeviceInfo()
	if err != nil {
		fmt.Printf("simtest: SKIP: the GPU kernel tests need a CUDA device of sm_80 or newer: %v\n", err)
		os.Exit(0)
	}
	// Every launch waits for the GPU and reports a fault of its kernel as
	// its own error, before the test reads the results through host views.
	kernels.SetSynchronous(true)
	fmt.Printf("simtest: GPU mode on %s; build/libkernels.a %s\n", desc, kernels.Library())
	fmt.Println("simtest: not in this build: the simulator's own tests (sim_test.go: self tests, guard-page crashes, barrier removal, SetSeed schedules, the stale-source check)")
	os.Exit(m.Run())
}
