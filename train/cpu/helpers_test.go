// Helpers shared by the CPU backend's tests: backends that close themselves,
// tensors filled from Go slices, seeded random data, and the tolerance check
// |got - want| <= atol + rtol*|want| that every numeric test states.

package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// newBE starts a backend that is closed when the test ends. Tests that
// provoke async errors read them themselves, so Close's error is dropped.
// A failed test leaves it open: its streams may be deadlocked, and Close
// would then hang instead of letting the failure be reported.
func newBE(t testing.TB, cfg Config) *Backend {
	t.Helper()
	be := New(cfg)
	t.Cleanup(func() {
		if !t.Failed() {
			_ = be.Close()
		}
	})
	return be
}

// alloc allocates n elements of dt or fails the test.
func alloc(t testing.TB, be *Backend, name string, n int, dt backend.DType) backend.Tensor {
	t.Helper()
	x, err := be.Alloc(name, n, dt)
	if err != nil {
		t.Fatalf("alloc %s: %v", name, err)
	}
	return x
}

// tensorOf allocates a tensor of dt holding vals (rounded if bf16).
func tensorOf(t testing.TB, be *Backend, name string, dt backend.DType, vals []float32) backend.Tensor {
	t.Helper()
	x := alloc(t, be, name, len(vals), dt)
	if err := backend.Upload(be, be.DefaultStream(), x, vals); err != nil {
		t.Fatalf("upload %s: %v", name, err)
	}
	return x
}

// intsOf allocates an I32 tensor holding vals.
func intsOf(t testing.TB, be *Backend, name string, vals []int32) backend.Tensor {
	t.Helper()
	x := alloc(t, be, name, len(vals), backend.I32)
	if err := backend.UploadInt32(be, be.DefaultStream(), x, vals); err != nil {
		t.Fatalf("upload %s: %v", name, err)
	}
	return x
}

// get downloads x (after the work on the default stream) as fp32.
func get(t testing.TB, be *Backend, x backend.Tensor) []float32 {
	t.Helper()
	v, err := backend.Download(be, be.DefaultStream(), x)
	if err != nil {
		t.Fatalf("download %v: %v", x, err)
	}
	return v
}

// mustSync synchronizes s and fails the test on any error.
func mustSync(t testing.TB, be *Backend, s backend.Stream) {
	t.Helper()
	if err := be.Synchronize(s); err != nil {
		t.Fatalf("synchronize %s: %v", s.Name(), err)
	}
}

// ok fails the test when an enqueue returned an error.
func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// randVals returns n seeded values uniform in [-a, a).
func randVals(r *rand.Rand, n int, a float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((2*r.Float64() - 1) * a)
	}
	return v
}

// roundBF16 rounds every value to the nearest bfloat16 (ties to even).
func roundBF16(v []float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = bf16.ToFloat32(bf16.FromFloat32(x))
	}
	return out
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

func f64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// near fails the test at the first element outside atol + rtol*|want|.
func near(t testing.TB, what string, got []float32, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := float64(got[i]), want[i]
		if math.IsNaN(g) || math.Abs(g-w) > atol+rtol*math.Abs(w) {
			t.Fatalf("%s[%d] = %v, want %v (atol %g, rtol %g)", what, i, g, w, atol, rtol)
		}
	}
}

// same fails the test unless got and want are bit-identical.
func same(t testing.TB, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v (%#08x), want %v (%#08x)", what, i, got[i],
				math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// newStream creates a stream or fails the test.
func newStream(t testing.TB, be *Backend, name string) backend.Stream {
	t.Helper()
	s, err := be.NewStream(name)
	if err != nil {
		t.Fatalf("new stream %s: %v", name, err)
	}
	return s
}

// newEvent creates an event or fails the test.
func newEvent(t testing.TB, be *Backend, name string) backend.Event {
	t.Helper()
	e, err := be.NewEvent(name)
	if err != nil {
		t.Fatalf("new event %s: %v", name, err)
	}
	return e
}

// lnScratch is scratch enough for LayerNormBackward over N rows of C.
func lnScratch(t testing.TB, be *Backend, N, C int) backend.Tensor {
	t.Helper()
	return alloc(t, be, "layernorm scratch", max(backend.LayerNormBackwardScratch(N, C), 1), backend.F32)
}

// attnScratch is scratch enough for AttentionBackward.
func attnScratch(t testing.TB, be *Backend, B, T, NH int) backend.Tensor {
	t.Helper()
	return alloc(t, be, "attention scratch", max(backend.AttentionBackwardScratch(B, T, NH), 1), backend.F32)
}

// sumWork is SumSquares' work.
func sumWork(t testing.TB, be *Backend) backend.Tensor {
	t.Helper()
	return alloc(t, be, "sum squares work", backend.SumSquaresWork, backend.F64)
}

// hostRange is n bytes at off of a host buffer, as ops declare them.
func hostRange(h backend.HostBuffer, off, n int) backend.Range { return hazard.HostRange(h, off, n) }
