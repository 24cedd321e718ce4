// Dense float64 references and random inputs shared by the package's tests.
// The dense paths are written independently of the sparse code under test
// (plain triple loops on dense() matrices, Gauss-Jordan inversion); they
// share only linalg.go's transpose, a copy with nothing to get wrong.

package lsp

import (
	"math"
	"math/rand/v2"
	"testing"
)

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }

// mustProjector draws a projector or fails the test.
func mustProjector(t testing.TB, m, d, r int, rng *rand.Rand) *Projector {
	t.Helper()
	p, err := NewProjector(m, d, r, rng)
	if err != nil {
		t.Fatalf("NewProjector(%d, %d, %d): %v", m, d, r, err)
	}
	return p
}

// randMat is an m x n float32 matrix of N(0,1) entries.
func randMat(rng *rand.Rand, m, n int) []float32 {
	out := make([]float32, m*n)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}

// lowRank is U V^T (m x n, rank k, N(0,1) factors) plus noise*N(0,1).
func lowRank(rng *rand.Rand, m, n, k int, noise float64) []float32 {
	u, v := make([]float64, m*k), make([]float64, n*k)
	for i := range u {
		u[i] = rng.NormFloat64()
	}
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	uv := dMul(u, transpose(v, n, k), m, k, n)
	out := make([]float32, m*n)
	for i, x := range uv {
		out[i] = float32(x + noise*rng.NormFloat64())
	}
	return out
}

// dense returns p as an M x D matrix, row-major, in float64: the tests'
// reference (the package itself never densifies a projector).
func (p *Projector) dense() []float64 {
	out := make([]float64, p.M*p.D)
	for i := range p.M {
		for s := range p.R {
			out[i*p.D+int(p.Idx[i*p.R+s])] = float64(p.Val[i*p.R+s])
		}
	}
	return out
}

func to64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// dMul is the p x r product of a (p x q) and b (q x r).
func dMul(a, b []float64, p, q, r int) []float64 {
	out := make([]float64, p*r)
	for i := range p {
		for j := range r {
			var s float64
			for k := range q {
				s += a[i*q+k] * b[k*r+j]
			}
			out[i*r+j] = s
		}
	}
	return out
}

// denseS is P^T G Q from dense P, Q.
func denseS(P, Q *Projector, G []float32) []float64 {
	m, n, d := P.M, Q.M, P.D
	ptg := dMul(transpose(P.dense(), m, d), to64(G), d, m, n)
	return dMul(ptg, Q.dense(), d, n, d)
}

// denseRatio forms P P^T G Q Q^T explicitly.
func denseRatio(P, Q *Projector, G []float32) float64 {
	m, n, d := P.M, Q.M, P.D
	Pd, Qd := P.dense(), Q.dense()
	R := dMul(dMul(Pd, denseS(P, Q, G), m, d, d), transpose(Qd, n, d), m, d, n)
	var num, den float64
	for i, g := range G {
		e := R[i] - float64(g)
		num += e * e
		den += float64(g) * float64(g)
	}
	return math.Sqrt(num / den)
}

// dInverse inverts a d x d matrix by Gauss-Jordan with partial pivoting.
func dInverse(t testing.TB, a []float64, d int) []float64 {
	t.Helper()
	w := make([]float64, d*2*d)
	for i := range d {
		copy(w[i*2*d:], a[i*d:(i+1)*d])
		w[i*2*d+d+i] = 1
	}
	for c := range d {
		piv := c
		for i := c + 1; i < d; i++ {
			if math.Abs(w[i*2*d+c]) > math.Abs(w[piv*2*d+c]) {
				piv = i
			}
		}
		if w[piv*2*d+c] == 0 {
			t.Fatalf("dInverse: singular at column %d", c)
		}
		for j := range 2 * d {
			w[c*2*d+j], w[piv*2*d+j] = w[piv*2*d+j], w[c*2*d+j]
		}
		pv := w[c*2*d+c]
		for j := range 2 * d {
			w[c*2*d+j] /= pv
		}
		for i := range d {
			if i == c {
				continue
			}
			f := w[i*2*d+c]
			for j := range 2 * d {
				w[i*2*d+j] -= f * w[c*2*d+j]
			}
		}
	}
	out := make([]float64, d*d)
	for i := range d {
		copy(out[i*d:(i+1)*d], w[i*2*d+d:(i+1)*2*d])
	}
	return out
}

// maxRelDiff is max|a-b| / max(max|b|, tiny).
func maxRelDiff(a, b []float64) float64 {
	var diff, scale float64
	for i := range a {
		diff = max(diff, math.Abs(a[i]-b[i]))
		scale = max(scale, math.Abs(b[i]))
	}
	return diff / max(scale, 1e-300)
}
