// Tests of the SwiGLU reference against float64 formulas, whose derivative
// is checked by central finite differences.

package cpu

import (
	"math"
	"testing"
)

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
