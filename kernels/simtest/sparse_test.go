//go:build lsp_sim

// Tests of kernels/sparse.cu (LSP sparse projection) under the simulator,
// against the CPU references of train/cpu/ref_sparse.go and against dense
// float64 maths, for every seed of Seeds.
//
// Shapes (BT, m, n, d, r): ragged (37, 70, 45, 12, 3); realistic (37, 256,
// 256, 32, 4); a large-m one (11, 2100, 130, 150, 5), whose m spans three
// 1024-input chunks of compress, whose d spans two 128-column groups and
// three 64-wide S tiles, and whose W has more rows than blocks in a
// column; a full one (5, 9, 7, 7, 7, every column of each row set) and the
// smallest (1, 1, 1, 1, 1). BT = 37 takes S through three 16-token stages.
// Input buffers alternate per seed between a guard page after their end
// and one before their start, so any out-of-bounds access crashes.
//
// Tolerances:
//   - compress A, B and S vs the CPU reference: exact (atol = rtol = 0).
//     The references (train/cpu/ref_sparse.go) perform the kernels' fp32
//     operations in the kernels' order, each product rounded before it is
//     added, and the simulator's g++ build (x86-64, no -mfma) contracts
//     nothing, so any difference is a bug. (On a GPU nvcc may contract the
//     compress and S sums into FMAs: there they agree only to a few ulps of
//     the sum of the magnitudes of the terms.)
//   - S vs dense float64 P^T (X^T dY) Q: per entry 1e-5 times the sum of
//     the magnitudes of its terms (|P|^T |X|^T |dY| |Q|), which bounds the
//     rounding of fp32 sums of a few thousand terms.
//   - apply: W bit-exact against the CPU reference (same fp32 operations,
//     uncontracted on the device too, and the same rounding bits) and T
//     exact; against dense float64 (1 - lr wd) W + P Delta Q^T each element
//     within one bf16 ulp (of |x| + e) plus e = 1e-5 times the magnitude of
//     its terms.

package simtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

type sparseShape struct{ BT, m, n, d, r int }

func (s sparseShape) String() string {
	return fmt.Sprintf("BT%d_m%d_n%d_d%d_r%d", s.BT, s.m, s.n, s.d, s.r)
}

var sparseShapes = []sparseShape{
	{BT: 37, m: 70, n: 45, d: 12, r: 3},
	{BT: 37, m: 256, n: 256, d: 32, r: 4},
	{BT: 11, m: 2100, n: 130, d: 150, r: 5},
	{BT: 5, m: 9, n: 7, d: 7, r: 7},
	{BT: 1, m: 1, n: 1, d: 1, r: 1},
}

// sparseProj is a (d,r)-sparse projector in both storages, on the host.
type sparseProj struct {
	rows, d, r     int
	idx            []int32
	val            []float32
	colptr, rowidx []int32
	colval         []float32
}

// newSparseProj draws r distinct random columns per row, values N(0, 1/r).
func newSparseProj(t *testing.T, rng *rand.Rand, rows, d, r int) sparseProj {
	t.Helper()
	p := sparseProj{rows: rows, d: d, r: r, idx: make([]int32, rows*r), val: make([]float32, rows*r)}
	for i := range rows {
		for s, a := range rng.Perm(d)[:r] {
			p.idx[i*r+s] = int32(a)
			p.val[i*r+s] = float32(rng.NormFloat64() / math.Sqrt(float64(r)))
		}
	}
	var err error
	if p.colptr, p.rowidx, p.colval, err = cpu.SparseColumns(p.idx, p.val, rows, d, r); err != nil {
		t.Fatal(err)
	}
	return p
}

// sparseAlloc copies data to a buffer whose guard page sits after its end
// (mode even) or before its start (mode odd).
func sparseAlloc[E int32 | float32 | uint16](t *testing.T, mode uint64, data []E) *Buffer {
	t.Helper()
	size := 4
	if _, ok := any(data).([]uint16); ok {
		size = 2
	}
	var b *Buffer
	if mode%2 == 0 {
		b = Alloc(t, size*len(data))
	} else {
		b = AllocBefore(t, size*len(data))
	}
	switch v := any(data).(type) {
	case []int32:
		copy(b.Int32(), v)
	case []float32:
		copy(b.Float32(), v)
	case []uint16:
		copy(b.Uint16(), v)
	}
	return b
}

func (p sparseProj) columns(t *testing.T, mode uint64) SparseColumns {
	return SparseColumns{sparseAlloc(t, mode, p.colptr), sparseAlloc(t, mode, p.rowidx), sparseAlloc(t, mode, p.colval)}
}

func (p sparseProj) rowsOnDevice(t *testing.T, mode uint64) SparseRows {
	return SparseRows{sparseAlloc(t, mode, p.idx), sparseAlloc(t, mode, p.val)}
}

// randBF16 draws n bf16 values N(0, scale^2).
func randBF16(rng *rand.Rand, n int, scale float64) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = bf16.FromFloat32(float32(rng.NormFloat64() * scale))
	}
	return out
}

// sparseS64 is S = P^T (X^T dY) Q in float64 with G = X^T dY formed
// densely; with abs, every factor is replaced by its magnitude (the sum of
// the magnitudes of S's terms, for tolerances).
func sparseS64(X, dY []uint16, P, Q sparseProj, BT, m, n int, abs bool) []float64 {
	f := func(x float64) float64 {
		if abs {
			return math.Abs(x)
		}
		return x
	}
	d := P.d
	G := make([]float64, m*n)
	for t := range BT {
		for i := range m {
			x := f(float64(bf16.ToFloat32(X[t*m+i])))
			g := G[i*n : (i+1)*n]
			for j := range n {
				g[j] += x * f(float64(bf16.ToFloat32(dY[t*n+j])))
			}
		}
	}
	GQ := make([]float64, m*d) // G Q: Q's rows are sparse
	for i := range m {
		for j := range n {
			for s := range Q.r {
				GQ[i*d+int(Q.idx[j*Q.r+s])] += G[i*n+j] * f(float64(Q.val[j*Q.r+s]))
			}
		}
	}
	S := make([]float64, d*d)
	for i := range m {
		for s := range P.r {
			a, p := int(P.idx[i*P.r+s]), f(float64(P.val[i*P.r+s]))
			for b := range d {
				S[a*d+b] += p * GQ[i*d+b]
			}
		}
	}
	return S
}

// compareS64 checks S against the dense value within 1e-5 of the
// magnitude of its terms.
func compareS64(t *testing.T, name string, got []float32, want, scale []float64) {
	t.Helper()
	worst, excess := -1, 0.0
	for k := range want {
		if d := math.Abs(float64(got[k])-want[k]) - 1e-5*scale[k]; d > excess || math.IsNaN(d) {
			worst, excess = k, d
		}
	}
	if worst >= 0 {
		t.Errorf("%s: S[%d] = %v, dense float64 %v, |diff| exceeds 1e-5 * %.4g", name, worst, got[worst], want[worst], scale[worst])
		failFast(t)
	}
}

// TestSparseCompress runs compress A, compress B and S (written, then
// accumulated over a second micro-batch) against the CPU references and
// the dense definition.
func TestSparseCompress(t *testing.T) {
	for _, sh := range sparseShapes {
		t.Run(sh.String(), func(t *testing.T) {
			for _, seed := range Seeds {
				SetSeed(seed)
				rng := rand.New(rand.NewPCG(seed, uint64(sh.m)))
				P := newSparseProj(t, rng, sh.m, sh.d, sh.r)
				Q := newSparseProj(t, rng, sh.n, sh.d, sh.r)
				Pc, Qc := P.columns(t, seed), Q.columns(t, seed+1)
				S := Alloc(t, 4*sh.d*sh.d)
				wantS := make([]float32, sh.d*sh.d)
				s64, abs64 := make([]float64, sh.d*sh.d), make([]float64, sh.d*sh.d)
				for mb := range 2 {
					name := fmt.Sprintf("seed %d micro-batch %d", seed, mb)
					X, dY := randBF16(rng, sh.BT*sh.m, 1), randBF16(rng, sh.BT*sh.n, 1)
					A, B := Alloc(t, 4*sh.d*sh.BT), Alloc(t, 4*sh.BT*sh.d)
					if err := SparseCompressA(A, sparseAlloc(t, seed, X), Pc, sh.BT, sh.m, sh.d); err != nil {
						t.Fatal(err)
					}
					if err := SparseCompressB(B, sparseAlloc(t, seed+1, dY), Qc, sh.BT, sh.n, sh.d); err != nil {
						t.Fatal(err)
					}
					if err := SparseS(S, A, B, sh.BT, sh.d, mb > 0); err != nil {
						t.Fatal(err)
					}
					wantA, wantB := make([]float32, sh.d*sh.BT), make([]float32, sh.BT*sh.d)
					if err := cpu.SparseCompressA(wantA, X, P.colptr, P.rowidx, P.colval, sh.BT, sh.m, sh.d); err != nil {
						t.Fatal(err)
					}
					if err := cpu.SparseCompressB(wantB, dY, Q.colptr, Q.rowidx, Q.colval, sh.BT, sh.n, sh.d); err != nil {
						t.Fatal(err)
					}
					if err := cpu.SparseS(wantS, wantA, wantB, sh.BT, sh.d, mb > 0); err != nil {
						t.Fatal(err)
					}
					Compare(t, name+" A", A.Float32(), wantA, 0, 0)
					Compare(t, name+" B", B.Float32(), wantB, 0, 0)
					Compare(t, name+" S", S.Float32(), wantS, 0, 0)
					d64 := sparseS64(X, dY, P, Q, sh.BT, sh.m, sh.n, false)
					a64 := sparseS64(X, dY, P, Q, sh.BT, sh.m, sh.n, true)
					for k := range s64 {
						s64[k] += d64[k]
						abs64[k] += a64[k]
					}
					compareS64(t, name+" S vs dense", S.Float32(), s64, abs64)
				}
			}
		})
	}
}

// Matrices reading the same input share P: one compressed A serves two
// matrices with their own Q, and each S matches its dense definition.
func TestSparseSharedP(t *testing.T) {
	const BT, m, d, r = 23, 70, 12, 3
	for _, seed := range Seeds {
		SetSeed(seed)
		rng := rand.New(rand.NewPCG(seed, 7))
		P := newSparseProj(t, rng, m, d, r)
		X := randBF16(rng, BT*m, 1)
		A := Alloc(t, 4*d*BT)
		if err := SparseCompressA(A, sparseAlloc(t, seed, X), P.columns(t, seed), BT, m, d); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{45, 33} {
			Q := newSparseProj(t, rng, n, d, r)
			dY := randBF16(rng, BT*n, 1)
			B, S := Alloc(t, 4*BT*d), Alloc(t, 4*d*d)
			if err := SparseCompressB(B, sparseAlloc(t, seed, dY), Q.columns(t, seed), BT, n, d); err != nil {
				t.Fatal(err)
			}
			if err := SparseS(S, A, B, BT, d, false); err != nil {
				t.Fatal(err)
			}
			compareS64(t, fmt.Sprintf("seed %d n %d", seed, n), S.Float32(),
				sparseS64(X, dY, P, Q, BT, m, n, false), sparseS64(X, dY, P, Q, BT, m, n, true))
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

// sparseApply64 is (1 - lr wd) W + P Delta Q^T in float64 and the sum of
// the magnitudes of its terms.
func sparseApply64(W []uint16, Delta []float32, P, Q sparseProj, m, n int, lr, wd float32) (x, scale []float64) {
	d := P.d
	T, Ta := make([]float64, d*n), make([]float64, d*n) // Delta Q^T and |Delta| |Q|^T
	for a := range d {
		for j := range n {
			for s := range Q.r {
				v := float64(Delta[a*d+int(Q.idx[j*Q.r+s])]) * float64(Q.val[j*Q.r+s])
				T[a*n+j] += v
				Ta[a*n+j] += math.Abs(v)
			}
		}
	}
	decay := 1 - float64(lr)*float64(wd)
	x, scale = make([]float64, m*n), make([]float64, m*n)
	for i := range m {
		for j := range n {
			w := decay * float64(bf16.ToFloat32(W[i*n+j]))
			s, sa := w, math.Abs(w)
			for k := range P.r {
				p := float64(P.val[i*P.r+k])
				a := int(P.idx[i*P.r+k])
				s += p * T[a*n+j]
				sa += math.Abs(p) * Ta[a*n+j]
			}
			x[i*n+j], scale[i*n+j] = s, sa
		}
	}
	return x, scale
}

// TestSparseApply compares apply with the CPU reference bit for bit, with
// dense float64 within one stochastic rounding, and checks that a fixed
// seed reproduces and another seed rounds differently.
func TestSparseApply(t *testing.T) {
	const lr, wd, step, matrix = 2e-3, 0.1, 1234, 5
	for _, sh := range sparseShapes {
		t.Run(sh.String(), func(t *testing.T) {
			for _, seed := range Seeds {
				SetSeed(seed)
				rng := rand.New(rand.NewPCG(seed, uint64(sh.n)))
				P := newSparseProj(t, rng, sh.m, sh.d, sh.r)
				Q := newSparseProj(t, rng, sh.n, sh.d, sh.r)
				W0 := randBF16(rng, sh.m*sh.n, 0.05)
				Delta := make([]float32, sh.d*sh.d)
				for k := range Delta {
					Delta[k] = float32(rng.NormFloat64() * 1e-2)
				}
				args := SparseApplyArgs{
					W: sparseAlloc(t, seed, W0), T: Alloc(t, 4*sh.d*sh.n), Delta: sparseAlloc(t, seed, Delta),
					P: P.rowsOnDevice(t, seed), Q: Q.rowsOnDevice(t, seed+1),
					M: sh.m, N: sh.n, D: sh.d, R: sh.r, LR: lr, WD: wd, Seed: seed, Step: step, Matrix: matrix,
				}
				if err := SparseApply(args); err != nil {
					t.Fatal(err)
				}
				wantW, wantT := slices.Clone(W0), make([]float32, sh.d*sh.n)
				if err := cpu.SparseApply(wantW, wantT, Delta, P.idx, P.val, Q.idx, Q.val, sh.m, sh.n, sh.d, sh.r,
					lr, wd, seed, step, matrix); err != nil {
					t.Fatal(err)
				}
				name := fmt.Sprintf("seed %d", seed)
				Compare(t, name+" T", args.T.Float32(), wantT, 0, 0)
				got := slices.Clone(args.W.Uint16())
				CompareBits(t, name+" W", got, wantW)

				x, scale := sparseApply64(W0, Delta, P, Q, sh.m, sh.n, lr, wd)
				for k, h := range got {
					g := float64(bf16.ToFloat32(h))
					e := 1e-5 * scale[k]
					if d := math.Abs(g - x[k]); !(d <= bf16Ulp(math.Abs(x[k])+e)+e) {
						t.Fatalf("%s: W[%d] = %v, dense float64 %v: more than one bf16 ulp (%.3g) apart",
							name, k, g, x[k], bf16Ulp(math.Abs(x[k])+e))
					}
				}

				// The same seed reproduces; seed+100 changes some rounding
				// when enough elements are inexact.
				for _, s2 := range []uint64{seed, seed + 100} {
					copy(args.W.Uint16(), W0)
					args.Seed = s2
					if err := SparseApply(args); err != nil {
						t.Fatal(err)
					}
					same := slices.Equal(args.W.Uint16(), got)
					if s2 == seed && !same {
						t.Fatalf("%s: a second run with the same seed differs", name)
					}
					if s2 != seed && same && sh.m*sh.n >= 1000 {
						t.Fatalf("%s: seed %d rounds every element as seed %d does", name, s2, seed)
					}
				}
			}
		})
	}
}

// The launchers reject bad sizes and missing buffers with
// cudaErrorInvalidValue (code 1) before launching anything.
func TestSparseArgs(t *testing.T) {
	f := Alloc(t, 64)
	cols := SparseColumns{f, f, f}
	rows := SparseRows{f, f}
	apply := func(mod func(*SparseApplyArgs)) error {
		a := SparseApplyArgs{W: f, T: f, Delta: f, P: rows, Q: rows, M: 2, N: 2, D: 2, R: 1, LR: 1}
		mod(&a)
		return SparseApply(a)
	}
	tests := []struct {
		name string
		err  error
	}{
		{"compress A BT 0", SparseCompressA(f, f, cols, 0, 2, 2)},
		{"compress A d 0", SparseCompressA(f, f, cols, 2, 2, 0)},
		{"compress B n 0", SparseCompressB(f, f, cols, 2, 0, 2)},
		{"compress B nil colval", SparseCompressB(f, f, SparseColumns{f, f, nil}, 2, 2, 2)},
		{"S d 0", SparseS(f, f, f, 2, 0, false)},
		{"S nil A", SparseS(f, nil, f, 2, 2, false)},
		{"apply r > d", apply(func(a *SparseApplyArgs) { a.R = 3 })},
		{"apply r 0", apply(func(a *SparseApplyArgs) { a.R = 0 })},
		{"apply m 0", apply(func(a *SparseApplyArgs) { a.M = 0 })},
		{"apply d too big", apply(func(a *SparseApplyArgs) { a.D, a.R = 65536, 1 })},
		{"apply nil T", apply(func(a *SparseApplyArgs) { a.T = nil })},
	}
	for _, tc := range tests {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if !containsInvalidValue(tc.err) {
			t.Errorf("%s: %v, want cudaErrorInvalidValue", tc.name, tc.err)
		}
	}
}

func containsInvalidValue(err error) bool {
	return err != nil && strings.Contains(err.Error(), "cudaErrorInvalidValue")
}
