//go:build cuda || cudasim

package main

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/device/devicetest"
)

// TestProfileCUDA profiles tiny in every mode on the CUDA backend: on a
// GPU, or under -tags cudasim on the simulated runtime (make
// cudasim-profile-test), where the events time the simulator's streams.
func TestProfileCUDA(t *testing.T) {
	devicetest.RequireCUDA(t)
	checkProfile(t, "cuda")
}
