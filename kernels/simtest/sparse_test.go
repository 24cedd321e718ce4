//go:build lsp_sim || cuda

// Tests of kernels/sparse.cu (LSP sparse projection) under the simulator,
// against the CPU backend's ops (train/cpu/ops_sparse.go, run through a
// cpu.Backend on tensors of the same dtypes) and against dense float64
// maths, for every seed of Seeds.
//
// Dtypes: compress runs every mix of X and dY in fp32 and bf16 (the
// model's first: bf16 activations, fp32 activation gradients), apply runs
// W in bf16 (stochastic rounding) and in fp32 (written exactly). fp32
// inputs are drawn unrounded, so a kernel that narrowed them to bf16
// would differ.
//
// Shapes (BT, m, n, d, r): ragged (37, 70, 45, 12, 3); realistic (37, 256,
// 256, 32, 4); a large-m one (11, 2100, 130, 150, 5), whose m spans three
// 1024-input chunks of compress, whose d spans two 128-column groups and
// three 64-wide S tiles, and whose W has more rows than blocks in a
// column; a full one (5, 9, 7, 7, 7, every column of each row set) and the
// smallest (1, 1, 1, 1, 1). BT = 37 takes S through three 16-token stages.
// Buffers alternate per seed between a guard page after their end and one
// before their start, so any out-of-bounds access (a bf16 stride on an
// fp32 buffer included) crashes.
//
// Tolerances:
//   - compress A, B, S, apply's T and W vs the CPU backend: bit for bit.
//     The CPU ops widen bf16 exactly and perform the kernels' fp32
//     operations in the kernels' order, each product rounded before it is
//     added, with the same stochastic-rounding bits for a bf16 W; the
//     simulator's g++ build (x86-64, no -mfma) contracts nothing, so any
//     difference is a bug. (On a GPU nvcc may contract the compress and S
//     sums into FMAs: there they agree only to a few ulps of the sum of the
//     magnitudes of the terms; apply is uncontracted there too.)
//   - S vs dense float64 P^T (X^T dY) Q: per entry 1e-5 times the sum of
//     the magnitudes of its terms (|P|^T |X|^T |dY| |Q|), which bounds the
//     rounding of fp32 sums of a few thousand terms.
//   - apply vs dense float64 (1 - lr wd) W + P Delta Q^T: with e = 1e-5
//     times the magnitude of the element's terms, a bf16 W within one bf16
//     ulp (of |x| + e) plus e, an fp32 W within e.

package simtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
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
func sparseAlloc[E int32 | float32](t *testing.T, mode uint64, data []E) *Buffer {
	t.Helper()
	var b *Buffer
	if mode%2 == 0 {
		b = Alloc(t, 4*len(data))
	} else {
		b = AllocBefore(t, 4*len(data))
	}
	switch v := any(data).(type) {
	case []int32:
		copy(b.Int32(), v)
	case []float32:
		copy(b.Float32(), v)
	}
	return b
}

// sparseFloats is NewFloatBuf with sparseAlloc's guard placement.
func sparseFloats(t *testing.T, mode uint64, vals []float32, bf16 bool) FloatBuf {
	t.Helper()
	return NewFloatBuf(t, vals, bf16, mode%2 == 1)
}

// devColumns is a projector in column storage (int32 colptr [d+1],
// rowidx [nnz], fp32 colval [nnz]) on the device.
type devColumns struct{ Colptr, Rowidx, Colval *Buffer }

// devRows is a projector in row storage (int32 idx, fp32 val, r per row).
type devRows struct{ Idx, Val *Buffer }

// compressA runs lsp_sparse_compress_a: A [d, BT] fp32 = P^T X^T, X
// [BT, m] fp32 or bf16.
func compressA(A *Buffer, X FloatBuf, P devColumns, BT, m, d int) error {
	return kernels.SparseCompressA(A.Dev(), X.Dev(), P.Colptr.Dev(), P.Rowidx.Dev(), P.Colval.Dev(), BT, m, d, X.DT(), 0)
}

// compressB runs lsp_sparse_compress_b: B [BT, d] fp32 = dY Q, dY [BT, n]
// fp32 or bf16.
func compressB(B *Buffer, dY FloatBuf, Q devColumns, BT, n, d int) error {
	return kernels.SparseCompressB(B.Dev(), dY.Dev(), Q.Colptr.Dev(), Q.Rowidx.Dev(), Q.Colval.Dev(), BT, n, d, dY.DT(), 0)
}

// applyArgs are the arguments of lsp_sparse_apply: W [m, n] (fp32,
// written exactly, or bf16, written by stochastic rounding keyed by (Seed,
// Step, Matrix, element)) <- (1 - LR*WD) W + P Delta Q^T; T is d*n floats
// of workspace.
type applyArgs struct {
	W              FloatBuf
	T, Delta, Skip *Buffer // Skip: the skip flag (fp32 [1]); nil: none
	P, Q           devRows
	M, N, D, R     int
	LR, WD         float32
	Seed, Step     uint64
	Matrix         uint32
}

// launch runs lsp_sparse_apply with a and the dtype flag wBF16 for W.
func (a applyArgs) launch(wBF16 kernels.DType) error {
	return kernels.SparseApply(a.W.Dev(), a.T.Dev(), a.Delta.Dev(), a.P.Idx.Dev(), a.P.Val.Dev(), a.Q.Idx.Dev(),
		a.Q.Val.Dev(), a.Skip.Dev(), a.M, a.N, a.D, a.R, a.LR, a.WD, a.Seed, a.Step, a.Matrix, wBF16, 0)
}

func (p sparseProj) columns(t *testing.T, mode uint64) devColumns {
	return devColumns{sparseAlloc(t, mode, p.colptr), sparseAlloc(t, mode, p.rowidx), sparseAlloc(t, mode, p.colval)}
}

func (p sparseProj) rowsOnDevice(t *testing.T, mode uint64) devRows {
	return devRows{sparseAlloc(t, mode, p.idx), sparseAlloc(t, mode, p.val)}
}

// cpuColumns and cpuRows are the projector's storages as CPU backend tensors.
func (p sparseProj) cpuColumns(r *cpuRig) (colptr, rowidx, colval backend.Tensor) {
	return r.ints("colptr", p.colptr), r.ints("rowidx", p.rowidx), r.tensor("colval", p.colval, false)
}

func (p sparseProj) cpuRows(r *cpuRig) (idx, val backend.Tensor) {
	return r.ints("idx", p.idx), r.tensor("val", p.val, false)
}

// randVals draws n values N(0, scale^2), rounded to bf16 when bf16 (what a
// buffer of that dtype holds, so both sides see the same values).
func randVals(rng *rand.Rand, n int, scale float64, bf16 bool) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64() * scale)
	}
	return roundIf(out, bf16)
}

// checkF32Bits fails unless got and want hold the same float32 bit
// patterns (so -0 differs from +0 and NaN payloads count).
func checkF32Bits(t *testing.T, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values, want %d", name, len(got), len(want))
	}
	bad, first := countDiffs(len(got), func(i int) bool { return math.Float32bits(got[i]) != math.Float32bits(want[i]) })
	if bad > 0 {
		t.Errorf("%s: %d of %d values differ from the CPU backend; first at index %d: got %.9g (0x%08x), want %.9g (0x%08x)",
			name, bad, len(got), first, got[first], math.Float32bits(got[first]), want[first], math.Float32bits(want[first]))
		failFast(t)
	}
}

// sparseS64 is S = P^T (X^T dY) Q in float64 with G = X^T dY formed
// densely; with abs, every factor is replaced by its magnitude (the sum of
// the magnitudes of S's terms, for tolerances).
func sparseS64(X, dY []float32, P, Q sparseProj, BT, m, n int, abs bool) []float64 {
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
			x := f(float64(X[t*m+i]))
			g := G[i*n : (i+1)*n]
			for j := range n {
				g[j] += x * f(float64(dY[t*n+j]))
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
// accumulated over a second micro-batch) for every dtype mix of X and dY
// against the CPU backend's ops and the dense definition.
func TestSparseCompress(t *testing.T) {
	for _, sh := range sparseShapes {
		for _, mix := range dtypeMixes {
			xb, gb := mix[0], mix[1]
			t.Run(fmt.Sprintf("%v/X_%s_dY_%s", sh, dtName(xb), dtName(gb)), func(t *testing.T) {
				cr := newCPURig(t)
				for _, seed := range Seeds {
					SetSeed(seed)
					rng := rand.New(rand.NewPCG(seed, uint64(sh.m)))
					P := newSparseProj(t, rng, sh.m, sh.d, sh.r)
					Q := newSparseProj(t, rng, sh.n, sh.d, sh.r)
					Pc, Qc := P.columns(t, seed), Q.columns(t, seed+1)
					pcp, pri, pcv := P.cpuColumns(cr)
					qcp, qri, qcv := Q.cpuColumns(cr)
					S := Alloc(t, 4*sh.d*sh.d)
					cS := cr.tensor("S", make([]float32, sh.d*sh.d), false)
					s64, abs64 := make([]float64, sh.d*sh.d), make([]float64, sh.d*sh.d)
					for mb := range 2 {
						name := fmt.Sprintf("seed %d micro-batch %d", seed, mb)
						X, dY := randVals(rng, sh.BT*sh.m, 1, xb), randVals(rng, sh.BT*sh.n, 1, gb)
						A, B := Alloc(t, 4*sh.d*sh.BT), Alloc(t, 4*sh.BT*sh.d)
						mustLaunch(t, compressA(A, sparseFloats(t, seed, X, xb), Pc, sh.BT, sh.m, sh.d))
						mustLaunch(t, compressB(B, sparseFloats(t, seed+1, dY, gb), Qc, sh.BT, sh.n, sh.d))
						mustLaunch(t, kernels.SparseS(S.Dev(), A.Dev(), B.Dev(), sh.BT, sh.d, mb > 0, 0))

						cA := cr.tensor("A", make([]float32, sh.d*sh.BT), false)
						cB := cr.tensor("B", make([]float32, sh.BT*sh.d), false)
						cr.run("SparseCompressA", cr.be.SparseCompressA(cr.s, cA, cr.tensor("X", X, xb), pcp, pri, pcv,
							sh.BT, sh.m, sh.d))
						cr.run("SparseCompressB", cr.be.SparseCompressB(cr.s, cB, cr.tensor("dY", dY, gb), qcp, qri, qcv,
							sh.BT, sh.n, sh.d))
						cr.run("SparseS", cr.be.SparseS(cr.s, cS, cA, cB, sh.BT, sh.d, mb > 0))
						checkF32Bits(t, name+" A", A.Float32(), cr.get(cA))
						checkF32Bits(t, name+" B", B.Float32(), cr.get(cB))
						checkF32Bits(t, name+" S", S.Float32(), cr.get(cS))

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
}

// Matrices reading the same input share P: one compressed A serves two
// matrices with their own Q (and dY of either dtype), and each S matches
// its dense definition.
func TestSparseSharedP(t *testing.T) {
	const BT, m, d, r = 23, 70, 12, 3
	for _, seed := range Seeds {
		SetSeed(seed)
		rng := rand.New(rand.NewPCG(seed, 7))
		P := newSparseProj(t, rng, m, d, r)
		X := randVals(rng, BT*m, 1, true)
		A := Alloc(t, 4*d*BT)
		mustLaunch(t, compressA(A, sparseFloats(t, seed, X, true), P.columns(t, seed), BT, m, d))
		for _, q := range []struct {
			n    int
			bf16 bool
		}{{45, false}, {33, true}} {
			Q := newSparseProj(t, rng, q.n, d, r)
			dY := randVals(rng, BT*q.n, 1, q.bf16)
			B, S := Alloc(t, 4*BT*d), Alloc(t, 4*d*d)
			mustLaunch(t, compressB(B, sparseFloats(t, seed, dY, q.bf16), Q.columns(t, seed), BT, q.n, d))
			mustLaunch(t, kernels.SparseS(S.Dev(), A.Dev(), B.Dev(), BT, d, false, 0))
			compareS64(t, fmt.Sprintf("seed %d n %d", seed, q.n), S.Float32(),
				sparseS64(X, dY, P, Q, BT, m, q.n, false), sparseS64(X, dY, P, Q, BT, m, q.n, true))
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
func sparseApply64(W, Delta []float32, P, Q sparseProj, m, n int, lr, wd float32) (x, scale []float64) {
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
			w := decay * float64(W[i*n+j])
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

// TestSparseApply compares apply, with W in bf16 and in fp32, with the CPU
// backend's op bit for bit and with dense float64 within one stochastic
// rounding (bf16) or fp32 rounding; a fixed seed must reproduce, and
// another seed must round differently in bf16 and change nothing in fp32.
// A skip flag that is set leaves W and T as they were (on both faces), and
// one that is clear changes nothing in the result.
func TestSparseApply(t *testing.T) {
	const lr, wd, step, matrix = 2e-3, 0.1, 1234, 5
	for _, sh := range sparseShapes {
		for _, wb := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/W_%s", sh, dtName(wb)), func(t *testing.T) {
				cr := newCPURig(t)
				for _, seed := range Seeds {
					SetSeed(seed)
					rng := rand.New(rand.NewPCG(seed, uint64(sh.n)))
					P := newSparseProj(t, rng, sh.m, sh.d, sh.r)
					Q := newSparseProj(t, rng, sh.n, sh.d, sh.r)
					W0 := randVals(rng, sh.m*sh.n, 0.05, wb)
					Delta := randVals(rng, sh.d*sh.d, 1e-2, false)
					args := applyArgs{
						W: sparseFloats(t, seed, W0, wb), T: Alloc(t, 4*sh.d*sh.n), Delta: sparseAlloc(t, seed, Delta),
						P: P.rowsOnDevice(t, seed), Q: Q.rowsOnDevice(t, seed+1),
						M: sh.m, N: sh.n, D: sh.d, R: sh.r, LR: lr, WD: wd, Seed: seed, Step: step, Matrix: matrix,
					}
					mustLaunch(t, args.launch(args.W.DT()))

					cW := cr.tensor("W", W0, wb)
					cT := cr.tensor("T", make([]float32, sh.d*sh.n), false)
					pidx, pval := P.cpuRows(cr)
					qidx, qval := Q.cpuRows(cr)
					cr.run("SparseApply", cr.be.SparseApply(cr.s, cW, cT, cr.tensor("Delta", Delta, false), pidx, pval,
						qidx, qval, backend.Tensor{}, sh.m, sh.n, sh.d, sh.r, lr, wd, seed, step, matrix))
					name := fmt.Sprintf("seed %d", seed)
					checkF32Bits(t, name+" T", args.T.Float32(), cr.get(cT))
					got := args.W.Values()
					checkF32Bits(t, name+" W", got, cr.get(cW))

					x, scale := sparseApply64(W0, Delta, P, Q, sh.m, sh.n, lr, wd)
					for k, g := range got {
						e := 1e-5 * scale[k]
						tol := e
						if wb {
							tol += bf16Ulp(math.Abs(x[k]) + e)
						}
						if d := math.Abs(float64(g) - x[k]); !(d <= tol) {
							t.Fatalf("%s: W[%d] = %v, dense float64 %v: |diff| %.3g > %.3g", name, k, g, x[k], d, tol)
						}
					}

					checkApplySkip(t, cr, args, W0, Delta, P, Q, sh, lr, wd, step, matrix)

					// The same seed reproduces; seed+100 changes some
					// rounding of a bf16 W when enough elements are inexact,
					// and nothing in an fp32 W.
					for _, s2 := range []uint64{seed, seed + 100} {
						args.W.Set(W0)
						args.Seed = s2
						mustLaunch(t, args.launch(args.W.DT()))
						again := args.W.Values()
						same := true
						for k := range again {
							same = same && math.Float32bits(again[k]) == math.Float32bits(got[k])
						}
						switch {
						case (s2 == seed || !wb) && !same:
							t.Fatalf("%s: a run with seed %d differs from the first", name, s2)
						case s2 != seed && wb && same && sh.m*sh.n >= 1000:
							t.Fatalf("%s: seed %d rounds every element as seed %d does", name, s2, seed)
						}
					}
				}
			})
		}
	}
}

// checkApplySkip runs the apply of args again, from W0, with a skip flag
// that is clear (the result must be the one without a flag) and then with
// one that is set (nothing may change, W and T alike), on the simulator
// and on the CPU backend, and leaves args.Skip nil.
func checkApplySkip(t *testing.T, cr *cpuRig, args applyArgs, W0, Delta []float32, P, Q sparseProj, sh sparseShape,
	lr, wd float32, step uint64, matrix uint32) {
	t.Helper()
	want := args.W.Values()
	wantT := append([]float32(nil), args.T.Float32()...)
	args.W.Set(W0)
	args.Skip = FromFloat32(t, []float32{0})
	mustLaunch(t, args.launch(args.W.DT()))
	checkF32Bits(t, "clear flag: W", args.W.Values(), want)
	checkF32Bits(t, "clear flag: T", args.T.Float32(), wantT)

	args.W.Set(W0)
	args.T.Float32()[0] = 12345 // a value the apply would overwrite
	wantT[0] = 12345
	args.Skip.Float32()[0] = 1
	mustLaunch(t, args.launch(args.W.DT()))
	checkF32Bits(t, "set flag: W", args.W.Values(), W0)
	checkF32Bits(t, "set flag: T", args.T.Float32(), wantT)

	cW := cr.tensor("W", W0, args.W.BF16)
	cT := cr.tensor("T", wantT, false)
	pidx, pval := P.cpuRows(cr)
	qidx, qval := Q.cpuRows(cr)
	cr.run("SparseApply", cr.be.SparseApply(cr.s, cW, cT, cr.tensor("Delta", Delta, false), pidx, pval,
		qidx, qval, cr.tensor("skip", []float32{1}, false), sh.m, sh.n, sh.d, sh.r, lr, wd, args.Seed, step, matrix))
	checkF32Bits(t, "set flag: CPU W", cr.get(cW), W0)
	checkF32Bits(t, "set flag: CPU T", cr.get(cT), wantT)
}

// The launchers reject bad sizes, missing buffers and dtype flags other
// than 0 and 1 with cudaErrorInvalidValue (code 1) before launching
// anything.
func TestSparseArgs(t *testing.T) {
	f := Alloc(t, 64)
	x := FloatBuf{Buf: f}
	cols := devColumns{f, f, f}
	rows := devRows{f, f}
	apply := func(flag kernels.DType, mod func(*applyArgs)) error {
		a := applyArgs{W: x, T: f, Delta: f, P: rows, Q: rows, M: 2, N: 2, D: 2, R: 1, LR: 1}
		mod(&a)
		return a.launch(flag)
	}
	fd := f.Dev()
	same := func(*applyArgs) {}
	tests := []struct {
		name string
		err  error
	}{
		{"compress A BT 0", compressA(f, x, cols, 0, 2, 2)},
		{"compress A d 0", compressA(f, x, cols, 2, 2, 0)},
		{"compress A nil X", compressA(f, FloatBuf{}, cols, 2, 2, 2)},
		{"compress A x_bf16 2", kernels.SparseCompressA(fd, fd, fd, fd, fd, 2, 2, 2, 2, 0)},
		{"compress B n 0", compressB(f, x, cols, 2, 0, 2)},
		{"compress B nil colval", compressB(f, x, devColumns{f, f, nil}, 2, 2, 2)},
		{"compress B dy_bf16 -1", kernels.SparseCompressB(fd, fd, fd, fd, fd, 2, 2, 2, -1, 0)},
		{"S d 0", kernels.SparseS(fd, fd, fd, 2, 0, false, 0)},
		{"S nil A", kernels.SparseS(fd, 0, fd, 2, 2, false, 0)},
		{"apply r > d", apply(0, func(a *applyArgs) { a.R = 3 })},
		{"apply r 0", apply(0, func(a *applyArgs) { a.R = 0 })},
		{"apply m 0", apply(1, func(a *applyArgs) { a.M = 0 })},
		{"apply d too big", apply(0, func(a *applyArgs) { a.D, a.R = 65536, 1 })},
		{"apply nil T", apply(0, func(a *applyArgs) { a.T = nil })},
		{"apply nil W", apply(0, func(a *applyArgs) { a.W = FloatBuf{} })},
		{"apply w_bf16 2", apply(2, same)},
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
