// The float64 references of GELU and SwiGLU, whose derivatives central
// finite differences check, and the SwiGLU reference against them (GELU's
// is checked through the op, ops_test.go's TestGelu, which calls it).

package cpu

import (
	"math"
	"testing"
)

// gelu64 is HF's gelu_new, the tanh approximation.
func gelu64(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
	}
	return out
}

// geluGrad64 is the derivative of HF's gelu_new, 0.5x(1+tanh(u)) with
// u = sqrt(2/pi)(x + 0.044715x^3).
func geluGrad64(x []float64) []float64 {
	c := math.Sqrt(2 / math.Pi)
	out := make([]float64, len(x))
	for i, v := range x {
		th := math.Tanh(c * (v + 0.044715*v*v*v))
		out[i] = 0.5*(1+th) + 0.5*v*(1-th*th)*c*(1+3*0.044715*v*v)
	}
	return out
}

// TestGeluReference64 checks the float64 GELU derivative against central
// differences of the float64 GELU.
func TestGeluReference64(t *testing.T) {
	gx := f64s(randVals(newRand(99), 50, 5))
	fdCheck(t, "gelu", func(v []float64) float64 {
		var s float64
		for _, y := range gelu64(v) {
			s += y
		}
		return s
	}, gx, geluGrad64(gx), 1e-6)
}

func swiglu64(g, u float64) float64 { return g / (1 + math.Exp(-g)) * u }

func TestSwiGLUReference(t *testing.T) {
	r := newRand(11)
	const n = 257
	gate, up, dout := randVals(r, n, 8), randVals(r, n, 3), randVals(r, n, 2)
	gate[0], gate[1], gate[2] = 0, 30, -30 // the flat tails of the sigmoid

	out := make([]float32, n)
	SwiGLUForward(out, gate, up)
	want := make([]float64, n)
	for i := range want {
		want[i] = swiglu64(float64(gate[i]), float64(up[i]))
	}
	near(t, "out", out, want, 1e-6, 1e-6)

	dgate, dup := make([]float32, n), make([]float32, n)
	SwiGLUBackward(dgate, dup, dout, gate, up)
	wantG, wantU := make([]float64, n), make([]float64, n)
	const h = 1e-5
	for i := range wantG {
		g, u, dy := float64(gate[i]), float64(up[i]), float64(dout[i])
		wantG[i] = dy * (swiglu64(g+h, u) - swiglu64(g-h, u)) / (2 * h)
		wantU[i] = dy * (swiglu64(g, u+h) - swiglu64(g, u-h)) / (2 * h)
	}
	near(t, "dgate", dgate, wantG, 1e-5, 1e-5)
	near(t, "dup", dup, wantU, 1e-5, 1e-5)

	// In place: dgate aliases dout.
	d := append([]float32(nil), dout...)
	SwiGLUBackward(d, dup, d, gate, up)
	same(t, "dgate in place", d, dgate)
}
