// Tests of the sparse projection references against dense float64 maths:
// S = P^T (X^T dY) Q, apply = (1 - lr wd) W + P Delta Q^T within the error
// of one stochastic rounding, on ragged and realistic shapes, a shared P,
// micro-batch accumulation, unbiasedness of apply over seeds, and the
// validation of row and column storage.

package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// spProjector draws a (d,r)-sparse projector of rows rows: r distinct
// random columns per row, values N(0, 1/r).
func spProjector(rng *rand.Rand, rows, d, r int) (idx []int32, val []float32) {
	idx, val = make([]int32, rows*r), make([]float32, rows*r)
	for i := range rows {
		for s, a := range rng.Perm(d)[:r] {
			idx[i*r+s] = int32(a)
			val[i*r+s] = float32(rng.NormFloat64() / math.Sqrt(float64(r)))
		}
	}
	return idx, val
}

// spDense expands row storage into a dense rows x d float64 matrix.
func spDense(idx []int32, val []float32, rows, d, r int) []float64 {
	out := make([]float64, rows*d)
	for i := range rows {
		for s := range r {
			out[i*d+int(idx[i*r+s])] = float64(val[i*r+s])
		}
	}
	return out
}

// spBF16 draws n bf16 values N(0, 1).
func spBF16(rng *rand.Rand, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = bf16.FromFloat32(float32(rng.NormFloat64()))
	}
	return out
}

// spS64 is S = P^T X^T dY Q in float64, the dense definition.
func spS64(X, dY []uint16, P, Q []float64, BT, m, n, d int) []float64 {
	G := make([]float64, m*n)
	for t := range BT {
		for i := range m {
			x := float64(bf16.ToFloat32(X[t*m+i]))
			for j := range n {
				G[i*n+j] += x * float64(bf16.ToFloat32(dY[t*n+j]))
			}
		}
	}
	GQ := make([]float64, m*d)
	for i := range m {
		for j := range n {
			for b := range d {
				GQ[i*d+b] += G[i*n+j] * Q[j*d+b]
			}
		}
	}
	S := make([]float64, d*d)
	for i := range m {
		for a := range d {
			for b := range d {
				S[a*d+b] += P[i*d+a] * GQ[i*d+b]
			}
		}
	}
	return S
}

// spAbsS64 is |P|^T |X|^T |dY| |Q|: per entry of S, the sum of the
// magnitudes of its terms, which bounds the rounding error of fp32 sums.
func spAbsS64(X, dY []uint16, P, Q []float64, BT, m, n, d int) []float64 {
	abs := func(v []uint16) []uint16 {
		out := make([]uint16, len(v))
		for i, h := range v {
			out[i] = h &^ 0x8000
		}
		return out
	}
	absf := func(v []float64) []float64 {
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = math.Abs(x)
		}
		return out
	}
	return spS64(abs(X), abs(dY), absf(P), absf(Q), BT, m, n, d)
}

type spShape struct{ BT, m, n, d, r int }

var spShapes = []spShape{
	{BT: 37, m: 70, n: 45, d: 12, r: 3},
	{BT: 37, m: 256, n: 256, d: 32, r: 4},
	{BT: 5, m: 9, n: 7, d: 7, r: 7},
	{BT: 1, m: 1, n: 1, d: 1, r: 1},
}

// TestSparseReferenceS checks S from compress A, compress B and the product
// against the dense float64 definition: each entry within 1e-5 of the sum
// of the magnitudes of its terms (fp32 sums of at most a few thousand
// terms), and accumulation over two micro-batches.
func TestSparseReferenceS(t *testing.T) {
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for _, sh := range spShapes {
		for seed := range seeds {
			rng := rand.New(rand.NewPCG(seed, 99))
			pidx, pval := spProjector(rng, sh.m, sh.d, sh.r)
			qidx, qval := spProjector(rng, sh.n, sh.d, sh.r)
			pc, pr, pv, err := SparseColumns(pidx, pval, sh.m, sh.d, sh.r)
			if err != nil {
				t.Fatal(err)
			}
			qc, qr, qv, err := SparseColumns(qidx, qval, sh.n, sh.d, sh.r)
			if err != nil {
				t.Fatal(err)
			}
			P, Q := spDense(pidx, pval, sh.m, sh.d, sh.r), spDense(qidx, qval, sh.n, sh.d, sh.r)
			S := make([]float32, sh.d*sh.d)
			want := make([]float64, sh.d*sh.d)
			scale := make([]float64, sh.d*sh.d)
			for mb := range 2 { // two micro-batches: the second accumulates
				X, dY := spBF16(rng, sh.BT*sh.m), spBF16(rng, sh.BT*sh.n)
				A, B := make([]float32, sh.d*sh.BT), make([]float32, sh.BT*sh.d)
				if err := SparseCompressA(A, X, pc, pr, pv, sh.BT, sh.m, sh.d); err != nil {
					t.Fatal(err)
				}
				if err := SparseCompressB(B, dY, qc, qr, qv, sh.BT, sh.n, sh.d); err != nil {
					t.Fatal(err)
				}
				if err := SparseS(S, A, B, sh.BT, sh.d, mb > 0); err != nil {
					t.Fatal(err)
				}
				s64 := spS64(X, dY, P, Q, sh.BT, sh.m, sh.n, sh.d)
				a64 := spAbsS64(X, dY, P, Q, sh.BT, sh.m, sh.n, sh.d)
				for k := range want {
					want[k] += s64[k]
					scale[k] += a64[k]
				}
				for k := range want {
					if d := math.Abs(float64(S[k]) - want[k]); d > 1e-5*scale[k]+1e-30 {
						t.Fatalf("%+v seed %d batch %d: S[%d] = %v, want %v (|diff| %.3g > %.3g)", sh, seed, mb, k, S[k], want[k], d, 1e-5*scale[k])
					}
				}
			}
		}
	}
}

// Matrices reading the same input share P: one A serves both, and each S
// matches its own dense definition.
func TestSparseReferenceSharedP(t *testing.T) {
	const BT, m, d, r = 21, 40, 8, 3
	rng := rand.New(rand.NewPCG(5, 6))
	pidx, pval := spProjector(rng, m, d, r)
	pc, pr, pv, err := SparseColumns(pidx, pval, m, d, r)
	if err != nil {
		t.Fatal(err)
	}
	X := spBF16(rng, BT*m)
	A := make([]float32, d*BT)
	if err := SparseCompressA(A, X, pc, pr, pv, BT, m, d); err != nil {
		t.Fatal(err)
	}
	P := spDense(pidx, pval, m, d, r)
	for _, n := range []int{17, 33} {
		qidx, qval := spProjector(rng, n, d, r)
		qc, qr, qv, err := SparseColumns(qidx, qval, n, d, r)
		if err != nil {
			t.Fatal(err)
		}
		dY := spBF16(rng, BT*n)
		B, S := make([]float32, BT*d), make([]float32, d*d)
		if err := SparseCompressB(B, dY, qc, qr, qv, BT, n, d); err != nil {
			t.Fatal(err)
		}
		if err := SparseS(S, A, B, BT, d, false); err != nil {
			t.Fatal(err)
		}
		Q := spDense(qidx, qval, n, d, r)
		want, scale := spS64(X, dY, P, Q, BT, m, n, d), spAbsS64(X, dY, P, Q, BT, m, n, d)
		for k := range want {
			if diff := math.Abs(float64(S[k]) - want[k]); diff > 1e-5*scale[k] {
				t.Fatalf("n=%d: S[%d] = %v, want %v", n, k, S[k], want[k])
			}
		}
	}
}

// bf16Ulp is the distance between consecutive bf16 values around |v|.
func bf16Ulp(v float64) float64 {
	if v == 0 {
		return math.Ldexp(1, -133)
	}
	_, e := math.Frexp(math.Abs(v)) // |v| = f 2^e, f in [0.5, 1)
	return math.Ldexp(1, max(e-1, -126)-7)
}

// TestSparseReferenceApply: every element is within one bf16 ulp of the
// dense float64 value, up to 1e-5 of the magnitude of its terms (the fp32
// error before rounding); the mean over 256 seeds is within 6 standard
// errors of it (SR is unbiased); a fixed seed reproduces; T is Delta Q^T.
// -short uses 16 seeds instead of 256 (the bound scales with them).
func TestSparseReferenceApply(t *testing.T) {
	seeds := 256
	if testing.Short() {
		seeds = 16
	}
	for _, sh := range spShapes {
		rng := rand.New(rand.NewPCG(uint64(sh.m), 3))
		pidx, pval := spProjector(rng, sh.m, sh.d, sh.r)
		qidx, qval := spProjector(rng, sh.n, sh.d, sh.r)
		P, Q := spDense(pidx, pval, sh.m, sh.d, sh.r), spDense(qidx, qval, sh.n, sh.d, sh.r)
		W0 := spBF16(rng, sh.m*sh.n)
		Delta := make([]float32, sh.d*sh.d)
		for k := range Delta {
			Delta[k] = float32(rng.NormFloat64() * 1e-2)
		}
		const lr, wd = 1e-3, 0.1
		w0 := make([]float32, len(W0))
		bf16.ToFloat32Slice(w0, W0)
		want, scale, _, _ := spApplyF64(w0, Delta, P, Q, sh.m, sh.n, sh.d, lr, wd)
		T := make([]float32, sh.d*sh.n)
		mean := make([]float64, sh.m*sh.n)
		var first []uint16
		for seed := range uint64(seeds) {
			W := slices.Clone(W0)
			if err := SparseApply(W, T, Delta, pidx, pval, qidx, qval, sh.m, sh.n, sh.d, sh.r, lr, wd, seed, 17, 4); err != nil {
				t.Fatal(err)
			}
			if seed == 0 {
				first = W
			}
			for k, h := range W {
				g := float64(bf16.ToFloat32(h))
				e := 1e-5 * scale[k] // fp32 error before the rounding
				if d := math.Abs(g - want[k]); d > bf16Ulp(math.Abs(want[k])+e)+e {
					t.Fatalf("%+v seed %d: W[%d] = %v, want %v within one bf16 ulp (%.3g)", sh, seed, k, g, want[k], bf16Ulp(want[k]))
				}
				mean[k] += g / float64(seeds)
			}
		}
		for k := range mean {
			// Each draw errs by at most one ulp: the mean's standard error is <= ulp/(2 sqrt(seeds)).
			e := 1e-5 * scale[k]
			if d := math.Abs(mean[k] - want[k]); d > 6*bf16Ulp(math.Abs(want[k])+e)/(2*math.Sqrt(float64(seeds)))+e {
				t.Fatalf("%+v: mean of W[%d] over %d seeds %v, want %v (biased rounding?)", sh, k, seeds, mean[k], want[k])
			}
		}
		W := slices.Clone(W0)
		if err := SparseApply(W, T, Delta, pidx, pval, qidx, qval, sh.m, sh.n, sh.d, sh.r, lr, wd, 0, 17, 4); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(W, first) {
			t.Fatalf("%+v: seed 0 does not reproduce", sh)
		}
		for a := range sh.d {
			for j := range sh.n {
				var s float64
				for b := range sh.d {
					s += float64(Delta[a*sh.d+b]) * Q[j*sh.d+b]
				}
				if d := math.Abs(float64(T[a*sh.n+j]) - s); d > 1e-6*(1+math.Abs(s)) {
					t.Fatalf("%+v: T[%d,%d] = %v, want %v", sh, a, j, T[a*sh.n+j], s)
				}
			}
		}
	}
}

func TestSparseColumns(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	const rows, d, r = 50, 9, 4
	idx, val := spProjector(rng, rows, d, r)
	colptr, rowidx, colval, err := SparseColumns(idx, val, rows, d, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSparseColumns(colptr, rowidx, colval, rows, d); err != nil {
		t.Fatal(err)
	}
	dense := spDense(idx, val, rows, d, r)
	got := make([]float64, rows*d)
	for a := range d {
		for k := colptr[a]; k < colptr[a+1]; k++ {
			got[int(rowidx[k])*d+a] = float64(colval[k])
		}
	}
	if !slices.Equal(got, dense) || int(colptr[d]) != rows*r {
		t.Fatal("column storage does not hold the row storage's entries")
	}
}

func TestSparseValidation(t *testing.T) {
	idx := []int32{0, 1, 2, 1}
	val := []float32{1, 2, 3, 4}
	okCols := func() ([]int32, []int32, []float32) {
		return []int32{0, 1, 3, 4}, []int32{0, 0, 1, 1}, []float32{1, 2, 4, 3}
	}
	tests := []struct {
		name, want string
		err        func() error
	}{
		{"r > d", "1 <= r <= d", func() error { return CheckSparseRows(idx, val, 2, 2, 3) }},
		{"short idx", "entries", func() error { return CheckSparseRows(idx[:3], val, 2, 3, 2) }},
		{"column out of range", "outside", func() error { return CheckSparseRows([]int32{0, 3, 2, 1}, val, 2, 3, 2) }},
		{"duplicate column", "twice", func() error { return CheckSparseRows([]int32{0, 1, 2, 2}, val, 2, 3, 2) }},
		{"colptr not from 0", "starting at 0", func() error {
			_, r, v := okCols()
			return CheckSparseColumns([]int32{1, 1, 3, 4}, r, v, 2, 3)
		}},
		{"colptr decreasing", "decreases", func() error {
			_, _, v := okCols()
			return CheckSparseColumns([]int32{0, 2, 1, 4}, []int32{0, 1, 0, 1}, v, 2, 3)
		}},
		{"row out of range", "outside", func() error {
			c, _, v := okCols()
			return CheckSparseColumns(c, []int32{0, 0, 2, 1}, v, 2, 3)
		}},
		{"rows not ascending", "ascending", func() error {
			c, _, v := okCols()
			return CheckSparseColumns(c, []int32{0, 1, 0, 1}, v, 2, 3)
		}},
		{"compress short X", "X has", func() error {
			c, r, v := okCols()
			return SparseCompressA(make([]float32, 6), make([]uint16, 3), c, r, v, 2, 2, 3)
		}},
		{"S short", "sparse S", func() error { return SparseS(make([]float32, 3), make([]float32, 4), make([]float32, 4), 2, 2, false) }},
		{"apply bad Q", "Q:", func() error {
			return SparseApply(make([]uint16, 4), make([]float32, 6), make([]float32, 9), idx, val, []int32{0, 0, 1, 2}, val, 2, 2, 3, 2, 1, 0, 0, 0, 0)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	c, r, v := okCols()
	if err := CheckSparseColumns(c, r, v, 2, 3); err != nil {
		t.Fatalf("valid column storage rejected: %v", err)
	}
}
