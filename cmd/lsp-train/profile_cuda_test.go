//go:build cuda || cudasim

package main

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/device"
)

// TestProfileCUDA profiles tiny in every mode on the CUDA backend: on a
// GPU, or under -tags cudasim on the simulated runtime (make
// cudasim-profile-test), where the events time the simulator's streams.
func TestProfileCUDA(t *testing.T) {
	probe, err := device.Open(device.Config{Kind: device.CUDA})
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	if err := probe.Close(); err != nil {
		t.Fatal(err)
	}
	checkProfile(t, "cuda")
}
