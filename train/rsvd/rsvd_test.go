// Tests of the randomized SVD against a float64 one-sided Jacobi SVD on
// the host, on ragged shapes, on the CPU backend (plain, and in its
// KernelDTypes mode for bf16 storage, as the CUDA Gemm requires).
//
// Test matrices are G = U0 diag(s) V0^T + noise with known s (random
// orthonormal U0, V0); the reference is the exact SVD of G itself, noise
// included. What is compared: the k singular values (relative to
// sigma_1), the largest principal angle between the randomized and the
// exact top-k subspaces, left and right (sin theta = ||(I - Ur Ur^T) U||_2
// for orthonormal U), U's and V's orthonormality, and the residuals
// ||G v_j - sigma_j u_j|| / sigma_1.

package rsvd

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// newCPU is a two-thread CPU backend, closed when the test ends.
func newCPU(t *testing.T, kernelDTypes bool) *cpu.Backend {
	t.Helper()
	be := cpu.New(cpu.Config{Threads: 2, KernelDTypes: kernelDTypes})
	t.Cleanup(func() { be.Close() })
	return be
}

// orthonormal returns rows x r (r <= rows) with orthonormal columns,
// row-major: Gram-Schmidt (twice) of a Gaussian matrix.
func orthonormal(rng *rand.Rand, rows, r int) []float64 {
	cols := make([][]float64, r)
	for j := range cols {
		c := make([]float64, rows)
		for i := range c {
			c[i] = rng.NormFloat64()
		}
		for range 2 {
			for _, prev := range cols[:j] {
				d := dot(prev, c)
				for i := range c {
					c[i] -= d * prev[i]
				}
			}
		}
		nrm := math.Sqrt(dot(c, c))
		for i := range c {
			c[i] /= nrm
		}
		cols[j] = c
	}
	out := make([]float64, rows*r)
	for j, c := range cols {
		for i, v := range c {
			out[i*r+j] = v
		}
	}
	return out
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// matrix is U0 diag(s) V0^T + noise * N(0, 1) entries, m x n row-major,
// len(s) = min(m, n).
func matrix(rng *rand.Rand, m, n int, s []float64, noise float64) []float64 {
	r := len(s)
	u, v := orthonormal(rng, m, r), orthonormal(rng, n, r)
	g := make([]float64, m*n)
	for i := range m {
		for j := range n {
			x := 0.0
			for t := range r {
				x += u[i*r+t] * s[t] * v[j*r+t]
			}
			g[i*n+j] = x + noise*rng.NormFloat64()
		}
	}
	return g
}

// transpose of an m x n row-major matrix.
func transpose(a []float64, m, n int) []float64 {
	out := make([]float64, m*n)
	for i := range m {
		for j := range n {
			out[j*m+i] = a[i*n+j]
		}
	}
	return out
}

// refSVD is the thin SVD of the m x n matrix a by one-sided (Hestenes)
// Jacobi in float64: U (m x r), s (r, descending), V (n x r), r = min(m,
// n), row-major.
func refSVD(a []float64, m, n int) (u, s, v []float64) {
	if m < n {
		v, s, u = refSVD(transpose(a, m, n), n, m)
		return u, s, v
	}
	// m >= n: orthogonalise the n columns of a, rotating V alongside.
	cols := make([][]float64, n)
	vc := make([][]float64, n)
	for j := range n {
		cols[j] = make([]float64, m)
		for i := range m {
			cols[j][i] = a[i*n+j]
		}
		vc[j] = make([]float64, n)
		vc[j][j] = 1
	}
	for sweep := 0; sweep < 80; sweep++ {
		rotated := false
		for p := range n {
			for q := p + 1; q < n; q++ {
				alpha, beta, gamma := dot(cols[p], cols[p]), dot(cols[q], cols[q]), dot(cols[p], cols[q])
				if math.Abs(gamma) <= 1e-15*math.Sqrt(alpha*beta) || gamma == 0 {
					continue
				}
				rotated = true
				_, c, sn := jacobiRotation((beta - alpha) / (2 * gamma))
				rotate(cols[p], cols[q], c, sn)
				rotate(vc[p], vc[q], c, sn)
			}
		}
		if !rotated {
			break
		}
	}
	order := make([]int, n)
	norms := make([]float64, n)
	for j := range n {
		order[j] = j
		norms[j] = math.Sqrt(dot(cols[j], cols[j]))
	}
	for i := 1; i < n; i++ {
		for j := i; j > 0 && norms[order[j]] > norms[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	u, s, v = make([]float64, m*n), make([]float64, n), make([]float64, n*n)
	for c, o := range order {
		s[c] = norms[o]
		for i := range m {
			if norms[o] > 0 {
				u[i*n+c] = cols[o][i] / norms[o]
			}
		}
		for i := range n {
			v[i*n+c] = vc[o][i]
		}
	}
	return u, s, v
}

// leading is the first k columns of a rows x r row-major matrix.
func leading(a []float64, rows, r, k int) []float64 {
	out := make([]float64, rows*k)
	for i := range rows {
		copy(out[i*k:(i+1)*k], a[i*r:i*r+k])
	}
	return out
}

// sinTheta is the sine of the largest principal angle between the
// column spaces of ref and got (both rows x k, orthonormal columns):
// the spectral norm of got - ref (ref^T got).
func sinTheta(ref, got []float64, rows, k int) float64 {
	c := make([]float64, k*k) // ref^T got
	for i := range rows {
		for a := range k {
			for b := range k {
				c[a*k+b] += ref[i*k+a] * got[i*k+b]
			}
		}
	}
	res := append([]float64(nil), got...)
	for i := range rows {
		for b := range k {
			for a := range k {
				res[i*k+b] -= ref[i*k+a] * c[a*k+b]
			}
		}
	}
	_, s, _ := refSVD(res, rows, k)
	return s[0]
}

// orthoError is the largest |X^T X - I| entry of rows x k X.
func orthoError(x []float64, rows, k int) float64 {
	worst := 0.0
	for a := range k {
		for b := range k {
			d := 0.0
			for i := range rows {
				d += x[i*k+a] * x[i*k+b]
			}
			if a == b {
				d--
			}
			worst = max(worst, math.Abs(d))
		}
	}
	return worst
}

// residual is max over j of ||G v_j - sigma_j u_j|| / sigma_1.
func residual(g []float64, m, n int, u, v, sigma []float64) float64 {
	k := len(sigma)
	worst := 0.0
	for j := range k {
		r := 0.0
		for i := range m {
			x := -sigma[j] * u[i*k+j]
			for c := range n {
				x += g[i*n+c] * v[c*k+j]
			}
			r += x * x
		}
		worst = max(worst, math.Sqrt(r)/sigma[0])
	}
	return worst
}

func to32(a []float64) []float32 {
	out := make([]float32, len(a))
	for i, x := range a {
		out[i] = float32(x)
	}
	return out
}

func to64(a []float32) []float64 {
	out := make([]float64, len(a))
	for i, x := range a {
		out[i] = float64(x)
	}
	return out
}

// result is one Compute's output read back.
type result struct {
	u, v, sigma []float64
	u32, v32    []float32 // the raw downloads, for bitwise comparisons
	passes      []int
}

// device uploads g (m x n) as dt to be, returning it as the matrix the
// device holds (rounded to dt) and the tensor.
func device(t *testing.T, be backend.Backend, g []float64, m, n int, dt backend.DType) ([]float64, backend.Tensor) {
	t.Helper()
	s := be.DefaultStream()
	G, err := be.Alloc("G", m*n, dt)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.Upload(be, s, G, to32(g)); err != nil {
		t.Fatal(err)
	}
	back, err := backend.Download(be, s, G)
	if err != nil {
		t.Fatal(err)
	}
	return to64(back), G
}

// compute runs w on G with outputs of dtype out and reads them back.
func compute(t *testing.T, be backend.Backend, w *Workspace, G backend.Tensor, out backend.DType, q int, seed uint64) result {
	t.Helper()
	s := be.DefaultStream()
	U, err := be.Alloc("U", w.m*w.k, out)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Free(U)
	V, err := be.Alloc("V", w.n*w.k, out)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Free(V)
	sigma, err := w.Compute(s, G, U, V, q, seed)
	if err != nil {
		t.Fatal(err)
	}
	u32, err := backend.Download(be, s, U)
	if err != nil {
		t.Fatal(err)
	}
	v32, err := backend.Download(be, s, V)
	if err != nil {
		t.Fatal(err)
	}
	return result{u: to64(u32), v: to64(v32), sigma: sigma, u32: u32, v32: v32, passes: w.Passes()}
}

// prepare uploads g (m x n) as dt and makes a Workspace for rank k with p
// oversampling columns in the same dtype, both freed when the test ends;
// it returns the matrix the device holds (rounded to dt) with them.
func prepare(t *testing.T, be backend.Backend, g []float64, m, n, k, p int, dt backend.DType) ([]float64, backend.Tensor, *Workspace) {
	t.Helper()
	g, G := device(t, be, g, m, n, dt)
	t.Cleanup(func() { be.Free(G) })
	w, err := NewWorkspace(be, m, n, k, p, dt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Free)
	return g, G, w
}

// decompose is one rank-k Compute of g stored as dt, with the default
// oversampling and power iterations and outputs of dtype out; it returns
// the matrix the device held with the result.
func decompose(t *testing.T, be backend.Backend, g []float64, m, n, k int, dt, out backend.DType, seed uint64) ([]float64, result) {
	t.Helper()
	g, G, w := prepare(t, be, g, m, n, k, DefaultOversample, dt)
	return g, compute(t, be, w, G, out, DefaultPowerIters, seed)
}

// accuracy is how a result compares with the exact SVD of g.
type accuracy struct {
	sigmaErr       float64 // max |sigma_j - ref_j| / ref_1
	sinU, sinV     float64 // largest principal angles' sines
	orthoU, orthoV float64
	resid          float64
}

// checkBF16 fails the test unless a is within TestKernelDTypes' bf16
// tolerances.
func checkBF16(t *testing.T, a accuracy) {
	t.Helper()
	if a.sigmaErr > 1e-2 || a.sinU > 1.5e-2 || a.sinV > 1.5e-2 || a.orthoU > 2e-2 || a.orthoV > 2e-2 {
		t.Errorf("beyond bf16 tolerance: %v", a)
	}
}

func (a accuracy) String() string {
	return fmt.Sprintf("sigma %.2g, sin U %.2g, sin V %.2g, ortho U %.2g V %.2g, residual %.2g",
		a.sigmaErr, a.sinU, a.sinV, a.orthoU, a.orthoV, a.resid)
}

func measure(g []float64, m, n, k int, r result) accuracy {
	ur, sr, vr := refSVD(g, m, n)
	p := min(m, n)
	var a accuracy
	for j := range k {
		a.sigmaErr = max(a.sigmaErr, math.Abs(r.sigma[j]-sr[j])/sr[0])
	}
	a.sinU = sinTheta(leading(ur, m, p, k), r.u, m, k)
	a.sinV = sinTheta(leading(vr, n, p, k), r.v, n, k)
	a.orthoU, a.orthoV = orthoError(r.u, m, k), orthoError(r.v, n, k)
	a.resid = residual(g, m, n, r.u, r.v, r.sigma)
	return a
}

var shapes = []struct{ m, n int }{{37, 53}, {64, 200}, {129, 70}, {300, 31}}

// spectrum returns min(m, n) singular values: "gap" decays as 0.9^j and
// drops tenfold after the k-th; "decay" is 0.8^j throughout; "steep" is
// 10^(-j/2) (Y's condition number beyond fp32's Gram: the shifted first
// pass and a third pass at work); "flat" is all ones; "slow" is
// 1/sqrt(j+1).
func spectrum(kind string, r, k int) []float64 {
	s := make([]float64, r)
	for j := range s {
		switch kind {
		case "gap":
			s[j] = math.Pow(0.9, float64(j))
			if j >= k {
				s[j] /= 10
			}
		case "decay":
			s[j] = math.Pow(0.8, float64(j))
		case "flat":
			s[j] = 1
		case "steep":
			s[j] = math.Pow(10, -float64(j)/2)
		case "slow":
			s[j] = 1 / math.Sqrt(float64(j+1))
		}
	}
	return s
}

// TestDecayingSpectra: fp32 storage on the plain CPU backend, p = 10, q =
// 2, every ragged shape and k in {1, 4, 16}: with a gap after k, with a
// smooth 0.8^j decay (gap 1.25 at every j) and a steep 10^(-j/2) one, the
// top-k subspaces agree to sin theta < 2e-4 (seen: at most 4e-5, the
// 0.8^j decay at k = 16), the values to 1e-5 of sigma_1 (seen: 2e-7), and
// U and V are orthonormal to 1e-5 (seen: 4e-7).
func TestDecayingSpectra(t *testing.T) {
	be := newCPU(t, false)
	for _, sh := range shapes {
		for _, k := range []int{1, 4, 16} {
			if k >= min(sh.m, sh.n) {
				continue
			}
			for _, kind := range []string{"gap", "decay", "steep"} {
				if kind == "steep" && k > 4 {
					continue // sigma_16 = 10^-7.5 is below the noise
				}
				t.Run(fmt.Sprintf("%dx%d_k%d_%s", sh.m, sh.n, k, kind), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(sh.m*1000+sh.n), uint64(k)))
					g := matrix(rng, sh.m, sh.n, spectrum(kind, min(sh.m, sh.n), k), 1e-6)
					g, r := decompose(t, be, g, sh.m, sh.n, k, backend.F32, backend.F32, 1)
					a := measure(g, sh.m, sh.n, k, r)
					t.Logf("%v; passes %v", a, r.passes)
					if a.sigmaErr > 1e-5 || a.sinU > 2e-4 || a.sinV > 2e-4 || a.orthoU > 1e-5 || a.orthoV > 1e-5 || a.resid > 1e-4 {
						t.Errorf("inaccurate: %v", a)
					}
				})
			}
		}
	}
}

// TestFlatSpectrum: all singular values 1 (plus 1e-6 noise). The top-k
// subspace is then not unique (any k directions of the flat part are a
// correct answer, and the noise decides the exact SVD's choice), so the
// angles are not checked; what is checked is that the triplets are
// singular triplets of G: values within 1e-4 of 1, orthonormal U and V,
// and residuals ||G v - sigma u|| at the noise's level.
func TestFlatSpectrum(t *testing.T) {
	be := newCPU(t, false)
	for _, sh := range shapes {
		k := min(16, min(sh.m, sh.n)-1)
		t.Run(fmt.Sprintf("%dx%d_k%d", sh.m, sh.n, k), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(sh.m), uint64(sh.n)))
			g := matrix(rng, sh.m, sh.n, spectrum("flat", min(sh.m, sh.n), k), 1e-6)
			g, r := decompose(t, be, g, sh.m, sh.n, k, backend.F32, backend.F32, 2)
			a := measure(g, sh.m, sh.n, k, r)
			t.Logf("%v (angles not checked: flat spectrum)", a)
			if a.sigmaErr > 1e-4 || a.orthoU > 1e-4 || a.orthoV > 1e-4 || a.resid > 1e-4 {
				t.Errorf("not singular triplets: %v", a)
			}
		})
	}
}

// TestLowRank: a rank-2 G (exactly, in fp32) with k = 4, as a gradient
// of fewer tokens than k: the two values and their vectors are right, the
// other two values are 0 with zero columns of V, and U still has four
// orthonormal columns.
func TestLowRank(t *testing.T) {
	be := newCPU(t, false)
	const m, n, k, rank = 129, 70, 4, 2
	rng := rand.New(rand.NewPCG(5, 6))
	sv := make([]float64, min(m, n))
	sv[0], sv[1] = 1, 0.5
	g, r := decompose(t, be, matrix(rng, m, n, sv, 0), m, n, k, backend.F32, backend.F32, 1)
	t.Logf("sigma %v, passes %v", r.sigma, r.passes)
	if r.sigma[2] != 0 || r.sigma[3] != 0 {
		t.Errorf("sigma = %v, want the last two 0", r.sigma)
	}
	for i := range n {
		for j := rank; j < k; j++ {
			if r.v[i*k+j] != 0 {
				t.Fatalf("V[%d, %d] = %g, want 0 beyond the rank", i, j, r.v[i*k+j])
			}
		}
	}
	if e := orthoError(r.u, m, k); e > 1e-5 {
		t.Errorf("U not orthonormal: %.3g", e)
	}
	ur, sr, vr := refSVD(g, m, n)
	p := min(m, n)
	top := result{u: leading(r.u, m, k, rank), v: leading(r.v, n, k, rank), sigma: r.sigma[:rank]}
	sinU := sinTheta(leading(ur, m, p, rank), top.u, m, rank)
	sinV := sinTheta(leading(vr, n, p, rank), top.v, n, rank)
	if sinU > 1e-4 || sinV > 1e-4 || math.Abs(r.sigma[1]-sr[1]) > 1e-5 || residual(g, m, n, top.u, top.v, top.sigma) > 1e-5 {
		t.Errorf("the rank-2 part: sin U %.3g, sin V %.3g, sigma %v against %v", sinU, sinV, r.sigma[:rank], sr[:rank])
	}
}

// TestJacobiEigen: the host eigendecomposition on random symmetric
// matrices (one with a repeated eigenvalue): A v = lambda v to 1e-12 of
// ||A||, V orthogonal, values descending.
func TestJacobiEigen(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, l := range []int{1, 2, 7, 40} {
		for _, repeated := range []bool{false, true} {
			// A = W diag(d) W^T with W orthogonal; d[0] = d[1] when repeated.
			w := orthonormal(rng, l, l)
			d := make([]float64, l)
			for i := range d {
				d[i] = rng.NormFloat64()
			}
			if repeated && l > 1 {
				d[1] = d[0]
			}
			a := make([]float64, l*l)
			norm := 0.0
			for i := range l {
				for j := range l {
					for k := range l {
						a[i*l+j] += w[i*l+k] * d[k] * w[j*l+k]
					}
				}
				norm = max(norm, math.Abs(d[i]))
			}
			lam, vecs := jacobiEigen(a, l)
			if e := orthoError(vecs, l, l); e > 1e-12 {
				t.Errorf("l = %d: eigenvectors not orthonormal: %.3g", l, e)
			}
			for c := range l {
				if c > 0 && lam[c] > lam[c-1] {
					t.Errorf("l = %d: values not descending: %v", l, lam)
				}
				for i := range l {
					r := -lam[c] * vecs[i*l+c]
					for j := range l {
						r += a[i*l+j] * vecs[j*l+c]
					}
					if math.Abs(r) > 1e-12*norm {
						t.Fatalf("l = %d, repeated %v: (A v - lambda v)[%d] = %.3g for value %d", l, repeated, i, r, c)
					}
				}
			}
		}
	}
}

// TestPowerIterationsHelp: on a slowly decaying spectrum (1/sqrt(j+1),
// no gap) with little oversampling, q = 2 must bring the left and right
// angles well below q = 0's.
func TestPowerIterationsHelp(t *testing.T) {
	be := newCPU(t, false)
	const m, n, k, p = 129, 70, 4, 2
	rng := rand.New(rand.NewPCG(7, 7))
	g, G, w := prepare(t, be, matrix(rng, m, n, spectrum("slow", min(m, n), k), 1e-6), m, n, k, p, backend.F32)
	var sin [3]float64
	for _, q := range []int{0, 2} {
		a := measure(g, m, n, k, compute(t, be, w, G, backend.F32, q, 3))
		t.Logf("q = %d: %v", q, a)
		sin[q] = max(a.sinU, a.sinV)
	}
	if !(sin[2] < sin[0]/3) {
		t.Errorf("power iterations did not help: sin theta %.3g with q = 0, %.3g with q = 2", sin[0], sin[2])
	}
}

// TestDeterministic: the same seed gives the same bits (on one backend);
// another seed other bits, as accurate.
func TestDeterministic(t *testing.T) {
	be := newCPU(t, false)
	const m, n, k = 64, 200, 4
	rng := rand.New(rand.NewPCG(11, 12))
	g, G, w := prepare(t, be, matrix(rng, m, n, spectrum("gap", min(m, n), k), 1e-6), m, n, k, DefaultOversample, backend.F32)
	a, b, c := compute(t, be, w, G, backend.F32, 2, 42), compute(t, be, w, G, backend.F32, 2, 42), compute(t, be, w, G, backend.F32, 2, 43)
	same := func(x, y result) bool {
		for i := range x.u32 {
			if math.Float32bits(x.u32[i]) != math.Float32bits(y.u32[i]) {
				return false
			}
		}
		for i := range x.v32 {
			if math.Float32bits(x.v32[i]) != math.Float32bits(y.v32[i]) {
				return false
			}
		}
		for i := range x.sigma {
			if math.Float64bits(x.sigma[i]) != math.Float64bits(y.sigma[i]) {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Error("the same seed gave different bits")
	}
	if same(a, c) {
		t.Error("seeds 42 and 43 gave the same bits: is Omega keyed by the seed?")
	}
	if acc := measure(g, m, n, k, c); acc.sinU > 1e-3 || acc.sinV > 1e-3 {
		t.Errorf("seed 43: %v", acc)
	}
}

// TestKernelDTypes: on the CPU backend that refuses what the CUDA Gemm
// refuses, an fp32 G is refused (Gemm takes bf16 A and B) with an error
// that says where; a bf16 G runs, with fp32 and with bf16 outputs. bf16
// stores Omega, Y, Q, Z and Bt with 8 bits, so the tolerances are
// bf16's: angles within 1.5e-2 (seen: 4e-3), orthonormality within 2e-2
// (seen: 9e-3), values within 1e-2 of sigma_1 (seen: 3e-3), against the
// exact SVD of the bf16-rounded G.
func TestKernelDTypes(t *testing.T) {
	be := newCPU(t, true)
	s := be.DefaultStream()
	t.Run("fp32 refused", func(t *testing.T) {
		const m, n, k = 37, 53, 4
		_, G, w := prepare(t, be, make([]float64, m*n), m, n, k, 2, backend.F32)
		U, _ := be.Alloc("U", m*k, backend.F32)
		V, _ := be.Alloc("V", n*k, backend.F32)
		_, err := w.Compute(s, G, U, V, 1, 1)
		if err == nil || !strings.Contains(err.Error(), "Y = G Omega") || !strings.Contains(err.Error(), "bf16") {
			t.Errorf("fp32 G on KernelDTypes: err = %v, want the Gemm's refusal", err)
		}
	})
	for _, sh := range shapes {
		for _, k := range []int{4, 16} {
			for _, out := range []backend.DType{backend.F32, backend.BF16} {
				t.Run(fmt.Sprintf("%dx%d_k%d_out_%v", sh.m, sh.n, k, out), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(sh.m+sh.n), uint64(k)))
					g := matrix(rng, sh.m, sh.n, spectrum("gap", min(sh.m, sh.n), k), 1e-4)
					g, r := decompose(t, be, g, sh.m, sh.n, k, backend.BF16, out, 5)
					a := measure(g, sh.m, sh.n, k, r)
					t.Logf("%v; passes %v", a, r.passes)
					checkBF16(t, a)
				})
			}
		}
	}
}

// TestBadArguments: refused with errors that name the problem.
func TestBadArguments(t *testing.T) {
	be := newCPU(t, false)
	s := be.DefaultStream()
	for _, c := range []struct {
		m, n, k, p int
		dt         backend.DType
		want       string
	}{
		{37, 53, 38, 0, backend.F32, "k = 38"},
		{37, 53, 0, 0, backend.F32, "k = 0"},
		{37, 53, 4, -1, backend.F32, "oversampling"},
		{0, 53, 4, 1, backend.F32, "positive"},
		{37, 53, 4, 1, backend.I32, "dtype"},
	} {
		if _, err := NewWorkspace(be, c.m, c.n, c.k, c.p, c.dt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewWorkspace(%d, %d, %d, %d, %v): err = %v, want %q", c.m, c.n, c.k, c.p, c.dt, err, c.want)
		}
		if b := WorkspaceBytes(c.m, c.n, c.k, c.p, c.dt); b != 0 {
			t.Errorf("WorkspaceBytes of refused arguments = %d", b)
		}
	}

	const m, n, k = 37, 53, 4
	w, err := NewWorkspace(be, m, n, k, 3, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	G, _ := be.Alloc("G", m*n, backend.F32)
	short, _ := be.Alloc("short", m*n-1, backend.F32)
	Gb, _ := be.Alloc("Gb", m*n, backend.BF16)
	U, _ := be.Alloc("U", m*k, backend.F32)
	V, _ := be.Alloc("V", n*k, backend.F32)
	Vi, _ := be.Alloc("Vi", n*k, backend.I32)
	Gnan, _ := be.Alloc("Gnan", m*n, backend.F32)
	nan := make([]float32, m*n)
	for i := range nan {
		nan[i] = float32(i%7) - 3
	}
	nan[100] = float32(math.NaN())
	if err := backend.Upload(be, s, Gnan, nan); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		G, U, V backend.Tensor
		q       int
		want    string
	}{
		{"short G", short, U, V, 1, "G"},
		{"bf16 G for fp32 workspace", Gb, U, V, 1, "the workspace fp32"},
		{"U for V", G, U, U, 1, "V"},
		{"short U", G, short.Slice(0, m*k-1), V, 1, "U"},
		{"i32 V", G, U, Vi, 1, "V"},
		{"negative q", G, U, V, -1, "power iterations"},
		{"zero G", G, U, V, 1, "rank deficient"},
		{"NaN in G", Gnan, U, V, 1, "not finite"},
	} {
		_, err := w.Compute(s, c.G, c.U, c.V, c.q, 1)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "rsvd of 37 x 53") {
			t.Errorf("%s: err = %v, want one naming %q", c.name, err, c.want)
		}
		if c.name == "zero G" && !errors.Is(err, ErrRankDeficient) {
			t.Errorf("zero G: err = %v, want ErrRankDeficient", err)
		}
	}
	w.Free()
	if _, err := w.Compute(s, G, U, V, 1, 1); err == nil || !strings.Contains(err.Error(), "after Free") {
		t.Errorf("after Free: err = %v", err)
	}
}

// TestWorkspaceBytes: what NewWorkspace allocates is WorkspaceBytes,
// and what the backend's memory says.
func TestWorkspaceBytes(t *testing.T) {
	be := newCPU(t, false)
	for _, c := range []struct {
		m, n, k, p int
		dt         backend.DType
	}{{37, 53, 4, 10, backend.F32}, {300, 31, 16, 10, backend.BF16}, {64, 200, 60, 10, backend.BF16}} {
		before := be.MemStats().InUse
		w, err := NewWorkspace(be, c.m, c.n, c.k, c.p, c.dt)
		if err != nil {
			t.Fatal(err)
		}
		want := WorkspaceBytes(c.m, c.n, c.k, c.p, c.dt)
		if got := be.MemStats().InUse - before; got != want || w.Bytes() != want {
			t.Errorf("%+v: allocated %d (Bytes %d), WorkspaceBytes %d", c, got, w.Bytes(), want)
		}
		if l := w.Columns(); l != min(c.k+c.p, c.m, c.n) {
			t.Errorf("%+v: l = %d", c, l)
		}
		w.Free()
	}
}

// TestFLOPs: the 7B MLP shape's cost, the number the header and the
// report quote, against a full SVD's 4 m^2 n + 8 m^3.
func TestFLOPs(t *testing.T) {
	const m, n = 4096, 11008
	got := FLOPs(m, n, 512, 10, 2)
	full := 4.0*m*m*n + 8.0*m*m*m
	t.Logf("FLOPs(4096, 11008, k 512, p 10, q 2) = %.3g; full SVD %.3g; WorkspaceBytes bf16 = %d", got, full, WorkspaceBytes(m, n, 512, 10, backend.BF16))
	if got < 3.5e11 || got > 4.2e11 {
		t.Errorf("FLOPs = %.3g, want about 3.8e11", got)
	}
	if FLOPs(m, n, 512, 10, 0) >= got || FLOPs(m, n, 128, 10, 2) >= got {
		t.Error("FLOPs does not grow with q and k")
	}
}
