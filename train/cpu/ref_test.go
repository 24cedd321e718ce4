// Independent float64 references for the CPU ops, written from the maths
// (not from math.go): naive loops over whole matrices, with the backward
// passes of layernorm, attention, gelu and cross-entropy checked against
// central finite differences of their own forward passes, so a mistake in
// a reference cannot hide a mistake in an op.

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

// gemm64: C = alpha*op(A)*op(B) + beta*C, row-major, op(A) M x K.
func gemm64(transA, transB bool, M, N, K int, alpha float64, A, B []float64, beta float64, C []float64) []float64 {
	out := make([]float64, M*N)
	for i := range M {
		for j := range N {
			var s float64
			for k := range K {
				a, b := A[i*K+k], B[k*N+j]
				if transA {
					a = A[k*M+i]
				}
				if transB {
					b = B[j*K+k]
				}
				s += a * b
			}
			out[i*N+j] = alpha * s
			if beta != 0 {
				out[i*N+j] += beta * C[i*N+j]
			}
		}
	}
	return out
}

// adamW64 is PyTorch's torch.optim.AdamW step (decoupled weight decay, bias
// correction, eps added outside the square root) on a gradient first scaled
// by min(1, maxNorm/(sqrt(sumSq)+1e-6)) when maxNorm > 0, as clip_grad_norm_
// does.
type adam64 struct {
	lr, b1, b2, eps, wd, maxNorm float64
}

func (a adam64) step(p, m, v, g []float64, step int, sumSq float64) {
	coef := 1.0
	if a.maxNorm > 0 {
		coef = min(1, a.maxNorm/(math.Sqrt(sumSq)+1e-6))
	}
	bc1 := 1 - math.Pow(a.b1, float64(step))
	bc2 := 1 - math.Pow(a.b2, float64(step))
	for i := range p {
		gi := g[i] * coef
		p[i] *= 1 - a.lr*a.wd
		m[i] = a.b1*m[i] + (1-a.b1)*gi
		v[i] = a.b2*v[i] + (1-a.b2)*gi*gi
		p[i] -= a.lr / bc1 * m[i] / (math.Sqrt(v[i])/math.Sqrt(bc2) + a.eps)
	}
}
