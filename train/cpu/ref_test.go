// What the float64 references of ref_<family>_test.go share. Those are
// written from the maths, not from the references of ref_<family>.go:
// naive loops over whole matrices, with the backward passes (layernorm,
// RMSNorm, attention, gelu, SwiGLU, cross-entropy) checked against central
// finite differences of their own forward passes (fdCheck), so a mistake
// in a reference cannot hide a mistake in an op.

package cpu

import (
	"math"
	"testing"
)

// fdCheck compares grad with central differences of f at x: grad[i] must
// be within tol*(1+|grad[i]|) of (f(x+h e_i) - f(x-h e_i)) / 2h.
func fdCheck(t *testing.T, what string, f func([]float64) float64, x, grad []float64, tol float64) {
	t.Helper()
	const h = 1e-5
	xp := append([]float64(nil), x...)
	for i := range x {
		xp[i] = x[i] + h
		up := f(xp)
		xp[i] = x[i] - h
		down := f(xp)
		xp[i] = x[i]
		fd := (up - down) / (2 * h)
		if math.Abs(fd-grad[i]) > tol*(1+math.Abs(grad[i])) {
			t.Fatalf("reference %s: d/dx[%d] = %v, finite difference %v", what, i, grad[i], fd)
		}
	}
}

func dot64(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}
