//go:build !cuda && !cudasim

package device

import (
	"slices"
	"strings"
	"testing"
)

// TestCUDARefused: a build without the CUDA backend refuses cuda and cuda:N
// at the flag check, saying how to get it.
func TestCUDARefused(t *testing.T) {
	for _, k := range []Kind{CUDA, "cuda:1"} {
		be, err := Open(Config{Kind: k})
		if err == nil || !strings.Contains(err.Error(), "not available in this build") || !strings.Contains(err.Error(), "-tags cuda") {
			t.Errorf("Open(%q) = %v, %v; want a refusal saying how to build with CUDA", k, be, err)
		}
		if err := Check(k); err == nil || !strings.Contains(err.Error(), "not available in this build") {
			t.Errorf("Check(%q) = %v", k, err)
		}
	}
	if got := Built(); !slices.Equal(got, []Kind{CPU}) {
		t.Errorf("Built() = %v, want [cpu]", got)
	}
}
