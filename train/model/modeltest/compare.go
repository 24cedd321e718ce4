package modeltest

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// SameBits reports the first element whose bits differ.
func SameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %.9g, want %.9g bit for bit", what, i, got[i], want[i])
			return
		}
	}
}

// CloseTo compares got with want elementwise, |got - want| <= rtol *
// (scale + |want|) with scale the tensor's largest magnitude (so that
// near-zero entries of a large tensor do not demand more than fp32 can
// give), and reports the worst entry; a NaN is always the worst.
func CloseTo(t *testing.T, what string, got, want []float32, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	worst, at := 0.0, 0
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if r := d / (rtol * (scale + math.Abs(float64(want[i])))); r > worst || math.IsNaN(d) {
			worst, at = r, i
			if math.IsNaN(d) {
				worst = math.Inf(1)
			}
		}
	}
	if worst > 1 {
		t.Errorf("%s: worst index %d: got %.8g, want %.8g (tolerance %.1e relative to the tensor scale %.3g)",
			what, at, got[at], want[at], rtol, scale)
	}
}

// CloseToF64 compares with a float64 reference, relative to its scale.
func CloseToF64(t *testing.T, what string, got []float32, want []float64, rtol float64) {
	t.Helper()
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	if scale == 0 {
		t.Errorf("%s: reference is all zero", what)
	}
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > rtol*scale {
			t.Errorf("%s[%d] = %.8g, want %.8g", what, i, got[i], want[i])
			return
		}
	}
}

// Must stops the test at a non-nil err.
func Must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Download is x's values, read on be's default stream.
func Download(t *testing.T, be backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	v, err := backend.Download(be, be.DefaultStream(), x)
	Must(t, err)
	return v
}

// MeanLoss is the mean of m's per-position losses (after CrossEntropy)
// over n counted targets, summed in float64.
func MeanLoss(t *testing.T, be backend.Backend, m model.Model, n int) float64 {
	t.Helper()
	var sum float64
	for _, v := range Download(t, be, m.Buffers().Losses) {
		sum += float64(v)
	}
	return sum / float64(n)
}

// Logits runs arch's model with params at fp32, on a CPU backend of its
// own, over the B x T tokens ids, and returns its logits [B*T*V].
func Logits(t *testing.T, arch model.Arch, params []float32, ids []int32, B, T int) []float32 {
	t.Helper()
	be := cpu.New(cpu.Config{})
	defer be.Close()
	m, err := arch.NewModel(be, B, T, backend.F32, model.Options{})
	Must(t, err)
	defer m.Free()
	s := be.DefaultStream()
	bufs := m.Buffers()
	Must(t, backend.Upload(be, s, bufs.Params, params))
	Must(t, backend.UploadInt32(be, s, bufs.Inputs, ids))
	Must(t, m.Forward(s))
	return Download(t, be, bufs.Logits)
}
