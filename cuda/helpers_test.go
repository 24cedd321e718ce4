//go:build cuda || cudasim

// Helpers of the backend's tests: backends that close themselves, tensors
// with values, comparisons, and running one test in a child process.

package cuda

import (
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/backend/backendtest"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// testBudget is the arena of the tests' backends: small, as simulated
// device memory is real memory.
const testBudget = 64 << 20

// newBE opens device 0 with cfg (a testBudget arena unless cfg says) and
// closes it when the test ends, failing the test if Close fails.
func newBE(t testing.TB, cfg Config) *Backend {
	t.Helper()
	if cfg.MemBudget == 0 {
		cfg.MemBudget = testBudget
	}
	be, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := be.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return be
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr fails unless err is an error saying every one of subs.
var wantErr = backendtest.WantErr

func alloc(t testing.TB, be backend.Backend, name string, n int, dt backend.DType) backend.Tensor {
	t.Helper()
	x, err := be.Alloc(name, n, dt)
	if err != nil {
		t.Fatalf("alloc %s: %v", name, err)
	}
	return x
}

func newStream(t testing.TB, be backend.Backend, name string) backend.Stream {
	t.Helper()
	s, err := be.NewStream(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newEvent(t testing.TB, be backend.Backend, name string) backend.Event {
	t.Helper()
	e, err := be.NewEvent(name)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// put uploads vals into x on the default stream and waits.
func put(t testing.TB, be backend.Backend, x backend.Tensor, vals []float32) {
	t.Helper()
	ok(t, backend.Upload(be, be.DefaultStream(), x, vals))
}

// get downloads x as fp32 after the work on the default stream.
func get(t testing.TB, be backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	v, err := backend.Download(be, be.DefaultStream(), x)
	if err != nil {
		t.Fatalf("download %v: %v", x, err)
	}
	return v
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

// randVals returns n values uniform in [-scale, scale).
func randVals(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = scale * (2*r.Float32() - 1)
	}
	return v
}

// roundBF16 rounds v to bf16 (nearest even), as an upload to a bf16
// tensor does.
func roundBF16(v []float32) []float32 {
	h := make([]uint16, len(v))
	bf16.FromFloat32Slice(h, v)
	out := make([]float32, len(v))
	bf16.ToFloat32Slice(out, h)
	return out
}

// same fails unless got and want are equal bit for bit.
func same(t testing.TB, what string, got, want []float32) {
	t.Helper()
	compare(t, what, got, want, 0, 0)
}

// compare fails unless |got[i] - want[i]| <= atol + rtol*|want[i]| for
// every i (NaN only where want is NaN); it reports the first few misses.
func compare(t testing.TB, what string, got, want []float32, atol, rtol float64) bool {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return false
	}
	bad := 0
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(w) || math.IsNaN(g) {
			if math.IsNaN(w) != math.IsNaN(g) {
				bad++
				if bad <= 5 {
					t.Errorf("%s[%d] = %v, want %v", what, i, g, w)
				}
			}
			continue
		}
		exact := atol == 0 && rtol == 0
		if exact && math.Float32bits(got[i]) != math.Float32bits(want[i]) || !exact && math.Abs(g-w) > atol+rtol*math.Abs(w) {
			bad++
			if bad <= 5 {
				t.Errorf("%s[%d] = %v, want %v (diff %.3g, tolerance %.3g)", what, i, g, w, math.Abs(g-w), atol+rtol*math.Abs(w))
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d values differ", what, bad, len(got))
	}
	return bad == 0
}

// cpuBE is the reference backend, with the CUDA kernels' dtype rules.
func cpuBE(t testing.TB) *cpu.Backend {
	be := cpu.New(cpu.Config{Threads: 2, KernelDTypes: true})
	t.Cleanup(func() { _ = be.Close() })
	return be
}

// runChild runs test name of this binary in a child process with
// childEnv set, and returns its output; the child's failure fails t.
func runChild(t *testing.T, name string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", name, err, out)
	}
	return string(out)
}
