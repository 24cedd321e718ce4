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

// TestPerRank: under mpirun, --device cuda gives local rank r GPU r (on
// the simulated runtime, every process's own device 0, so cuda for all),
// and more ranks on a machine than GPUs is refused naming the way out; a
// device named per rank (cuda:N) and cpu stay as given.
func TestPerRank(t *testing.T) {
	for _, k := range []Kind{"cuda:1", CPU} {
		if got, err := PerRank(k, 3); err != nil || got != k {
			t.Errorf("PerRank(%s, 3) = %s, %v; want it kept", k, got, err)
		}
	}
	if got, err := PerRank(CUDA, -1); err != nil || got != CUDA {
		t.Errorf("PerRank(cuda) outside mpirun = %s, %v; want cuda", got, err)
	}
	devs, err := cuda.Devices()
	if err != nil {
		if got, perr := PerRank(CUDA, 1); perr != nil || got != CUDA {
			t.Errorf("PerRank(cuda, 1) without devices = %s, %v; want cuda (opening it says why)", got, perr)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	for r := 0; r < len(devs)+1; r++ {
		got, err := PerRank(CUDA, r)
		switch {
		case cuda.Simulated():
			if err != nil || got != CUDA {
				t.Errorf("simulated: PerRank(cuda, %d) = %s, %v; want cuda", r, got, err)
			}
		case r < len(devs):
			if want := Kind("cuda:" + strconv.Itoa(r)); err != nil || got != want {
				t.Errorf("PerRank(cuda, %d) = %s, %v; want %s", r, got, err, want)
			}
		default:
			if err == nil || !strings.Contains(err.Error(), "-npernode") {
				t.Errorf("PerRank(cuda, %d) with %d devices = %s, %v; want an error naming mpirun -npernode", r, len(devs), got, err)
			}
		}
	}
}
