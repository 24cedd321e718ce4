//go:build cuda || cudasim

package device

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// TestOpenCUDA: --device cuda opens device 0 with the --device-mem budget,
// or, on a machine without a usable device, says that no device was found;
// cuda:N past the last device names the ones there are.
func TestOpenCUDA(t *testing.T) {
	if got := Built(); !slices.Equal(got, []Kind{CPU, CUDA}) {
		t.Errorf("Built() = %v, want [cpu cuda]", got)
	}
	be, err := Open(Config{Kind: CUDA, MemBudget: 8 << 20})
	if errors.Is(err, cuda.ErrNoDevice) {
		if !strings.Contains(err.Error(), "no CUDA device found") || !strings.Contains(err.Error(), "--device cpu") {
			t.Errorf("no device: %v; want it said, with the way out", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if be.Name() != "cuda:0" || be.MemStats().Budget != 8<<20 {
		t.Errorf("opened %s with budget %d, want cuda:0 with %d", be.Name(), be.MemStats().Budget, 8<<20)
	}
	x, err := be.Alloc("x", 3, backend.BF16)
	if err != nil {
		t.Fatal(err)
	}
	if err := be.Fill(be.DefaultStream(), x, 2); err != nil {
		t.Fatal(err)
	}
	if v, err := backend.Download(be, be.DefaultStream(), x); err != nil || !slices.Equal(v, []float32{2, 2, 2}) {
		t.Errorf("fill on cuda: %v, %v", v, err)
	}
	devs, err := cuda.Devices()
	if err != nil {
		t.Fatal(err)
	}
	past := Kind("cuda:" + strconv.Itoa(len(devs)))
	if _, err := Open(Config{Kind: past}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Open(%s) with %d device(s): %v", past, len(devs), err)
	}
}
