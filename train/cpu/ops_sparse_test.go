// Tests of the LSP sparse projection ops through the Backend: compression
// and S against dense float64 maths on ragged shapes with fp32 and bf16
// inputs, a shared P, bit identity with the ref_sparse references and
// across thread counts, apply against dense maths (fp32 W to rounding, bf16
// W within one ulp and unbiased over seeds), argument and index errors, and
// the accesses the ops declare to the hazard checker.

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// u32 is the unit roundoff of fp32, 2^-24.
const u32 = 0x1p-24

// spOpShapes are ragged (no size a multiple of another) plus one with
// d = m = n.
var spOpShapes = []spShape{
	{BT: 5, m: 7, n: 9, d: 3, r: 2},
	{BT: 33, m: 64, n: 48, d: 16, r: 4},
	{BT: 17, m: 40, n: 40, d: 40, r: 8},
}

// spDev is one (d,r)-sparse projector: host row and column storage, its
// dense float64 form, and both storages on the device.
type spDev struct {
	idx            []int32
	val            []float32
	colptr, rowidx []int32
	colval         []float32
	dense          []float64
	maxCol         int // the most entries in one column

	tColptr, tRowidx, tColval, tIdx, tVal backend.Tensor
}

func newSpDev(t *testing.T, be *Backend, rng *rand.Rand, rows, d, r int) spDev {
	t.Helper()
	p := spDev{}
	p.idx, p.val = spProjector(rng, rows, d, r)
	var err error
	p.colptr, p.rowidx, p.colval, err = SparseColumns(p.idx, p.val, rows, d, r)
	if err != nil {
		t.Fatal(err)
	}
	p.dense = spDense(p.idx, p.val, rows, d, r)
	for a := range d {
		p.maxCol = max(p.maxCol, int(p.colptr[a+1]-p.colptr[a]))
	}
	p.tColptr, p.tRowidx = intsOf(t, be, "colptr", p.colptr), intsOf(t, be, "rowidx", p.rowidx)
	p.tColval = tensorOf(t, be, "colval", backend.F32, p.colval)
	p.tIdx, p.tVal = intsOf(t, be, "idx", p.idx), tensorOf(t, be, "val", backend.F32, p.val)
	return p
}

// spSF64 is S = P^T X^T dY Q in float64 from fp32 X [BT,m] and dY [BT,n].
// With abs every factor is replaced by its magnitude: per entry, the sum of
// the magnitudes of its terms, which scales the fp32 rounding error.
func spSF64(X, dY []float32, P, Q []float64, BT, m, n, d int, abs bool) []float64 {
	f := func(x float64) float64 {
		if abs {
			return math.Abs(x)
		}
		return x
	}
	G := make([]float64, m*n)
	for t := range BT {
		for i := range m {
			x := f(float64(X[t*m+i]))
			for j := range n {
				G[i*n+j] += x * f(float64(dY[t*n+j]))
			}
		}
	}
	GQ := make([]float64, m*d)
	for i := range m {
		for j := range n {
			for b := range d {
				GQ[i*d+b] += G[i*n+j] * f(Q[j*d+b])
			}
		}
	}
	S := make([]float64, d*d)
	for i := range m {
		for a := range d {
			for b := range d {
				S[a*d+b] += f(P[i*d+a]) * GQ[i*d+b]
			}
		}
	}
	return S
}

// spGather64 is x P in float64 for x [BT,rows] and a dense P [rows,d],
// and the sums of the magnitudes of the terms.
func spGather64(x []float32, P []float64, BT, rows, d int) (out, scale []float64) {
	out, scale = make([]float64, BT*d), make([]float64, BT*d)
	for t := range BT {
		for i := range rows {
			for a := range d {
				v := float64(x[t*rows+i]) * P[i*d+a]
				out[t*d+a] += v
				scale[t*d+a] += math.Abs(v)
			}
		}
	}
	return out, scale
}

// spT64 transposes a rows x cols matrix.
func spT64(x []float64, rows, cols int) []float64 {
	out := make([]float64, len(x))
	for i := range rows {
		for j := range cols {
			out[j*rows+i] = x[i*cols+j]
		}
	}
	return out
}

// spNear fails unless every |got - want| <= tol * scale.
func spNear(t *testing.T, what string, got []float32, want, scale []float64, tol float64) {
	t.Helper()
	for k := range want {
		if d := math.Abs(float64(got[k]) - want[k]); !(d <= tol*scale[k]) {
			t.Fatalf("%s[%d] = %v, want %v (|diff| %.3g > %.3g)", what, k, got[k], want[k], d, tol*scale[k])
		}
	}
}

// TestSparseOpsCompress: A, B and S (accumulated over two micro-batches)
// through the Backend against P^T (X^T dY) Q in float64, for fp32 and bf16
// inputs. Tolerances are first-order bounds of the fp32 sums, relative to
// the sum of the magnitudes of each entry's terms: (k+1) 2^-24 for A and B
// (k the longest column), (kP + kQ + BT + 3) 2^-24 for S.
func TestSparseOpsCompress(t *testing.T) {
	for _, sh := range spOpShapes {
		for _, dt := range []backend.DType{backend.F32, backend.BF16} {
			be := newBE(t, Config{Threads: 2})
			s := be.DefaultStream()
			rng := newRand(uint64(sh.m*1000 + sh.d))
			P, Q := newSpDev(t, be, rng, sh.m, sh.d, sh.r), newSpDev(t, be, rng, sh.n, sh.d, sh.r)
			A, B := alloc(t, be, "A", sh.d*sh.BT, backend.F32), alloc(t, be, "B", sh.BT*sh.d, backend.F32)
			S := alloc(t, be, "S", sh.d*sh.d, backend.F32)
			want, scale := make([]float64, sh.d*sh.d), make([]float64, sh.d*sh.d)
			for mb := range 2 {
				what := fmt.Sprintf("%+v %v batch %d", sh, dt, mb)
				xv, yv := randVals(rng, sh.BT*sh.m, 2), randVals(rng, sh.BT*sh.n, 2)
				if dt == backend.BF16 {
					xv, yv = roundBF16(xv), roundBF16(yv)
				}
				X, dY := tensorOf(t, be, "X", dt, xv), tensorOf(t, be, "dY", dt, yv)
				ok(t, be.SparseCompressA(s, A, X, P.tColptr, P.tRowidx, P.tColval, sh.BT, sh.m, sh.d))
				ok(t, be.SparseCompressB(s, B, dY, Q.tColptr, Q.tRowidx, Q.tColval, sh.BT, sh.n, sh.d))
				ok(t, be.SparseS(s, S, A, B, sh.BT, sh.d, mb > 0))

				// A = (X P)^T and B = dY Q on their own.
				wa, sa := spGather64(xv, P.dense, sh.BT, sh.m, sh.d)
				wb, sb := spGather64(yv, Q.dense, sh.BT, sh.n, sh.d)
				spNear(t, what+": A", get(t, be, A), spT64(wa, sh.BT, sh.d), spT64(sa, sh.BT, sh.d), float64(P.maxCol+1)*u32)
				spNear(t, what+": B", get(t, be, B), wb, sb, float64(Q.maxCol+1)*u32)

				s64 := spSF64(xv, yv, P.dense, Q.dense, sh.BT, sh.m, sh.n, sh.d, false)
				a64 := spSF64(xv, yv, P.dense, Q.dense, sh.BT, sh.m, sh.n, sh.d, true)
				for k := range want {
					want[k] += s64[k]
					scale[k] += a64[k]
				}
				spNear(t, what+": S", get(t, be, S), want, scale, float64(P.maxCol+Q.maxCol+sh.BT+3)*u32)
			}
		}
	}
}

// TestSparseOpsSharedP: two matrices read the same X and share P (one A),
// with their own Q, n and dY dtype; each S matches its dense definition.
func TestSparseOpsSharedP(t *testing.T) {
	const BT, m, d, r = 21, 40, 8, 3
	be := newBE(t, Config{Threads: 2})
	s := be.DefaultStream()
	rng := newRand(11)
	P := newSpDev(t, be, rng, m, d, r)
	xv := roundBF16(randVals(rng, BT*m, 2))
	X := tensorOf(t, be, "X", backend.BF16, xv)
	A := alloc(t, be, "A", d*BT, backend.F32)
	ok(t, be.SparseCompressA(s, A, X, P.tColptr, P.tRowidx, P.tColval, BT, m, d))
	for _, c := range []struct {
		n  int
		dt backend.DType
	}{{17, backend.F32}, {33, backend.BF16}} {
		Q := newSpDev(t, be, rng, c.n, d, r)
		yv := randVals(rng, BT*c.n, 2)
		if c.dt == backend.BF16 {
			yv = roundBF16(yv)
		}
		dY := tensorOf(t, be, "dY", c.dt, yv)
		B, S := alloc(t, be, "B", BT*d, backend.F32), alloc(t, be, "S", d*d, backend.F32)
		ok(t, be.SparseCompressB(s, B, dY, Q.tColptr, Q.tRowidx, Q.tColval, BT, c.n, d))
		ok(t, be.SparseS(s, S, A, B, BT, d, false))
		want := spSF64(xv, yv, P.dense, Q.dense, BT, m, c.n, d, false)
		scale := spSF64(xv, yv, P.dense, Q.dense, BT, m, c.n, d, true)
		spNear(t, fmt.Sprintf("n=%d: S", c.n), get(t, be, S), want, scale, float64(P.maxCol+Q.maxCol+BT+2)*u32)
	}
}

// spInputs is one full set of inputs of the four ops.
type spInputs struct {
	sh               spShape
	X, dY, W0, Delta []float32
	P, Q             struct {
		idx []int32
		val []float32
	}
	lr, wd     float32
	seed, step uint64
	matrix     uint32
}

func newSpInputs(sh spShape, seed uint64, bf16Exact bool) spInputs {
	rng := newRand(seed)
	in := spInputs{sh: sh, lr: 1e-3, wd: 0.1, seed: seed, step: 7, matrix: 3}
	in.P.idx, in.P.val = spProjector(rng, sh.m, sh.d, sh.r)
	in.Q.idx, in.Q.val = spProjector(rng, sh.n, sh.d, sh.r)
	in.X, in.dY, in.W0 = randVals(rng, sh.BT*sh.m, 2), randVals(rng, sh.BT*sh.n, 2), randVals(rng, sh.m*sh.n, 2)
	if bf16Exact {
		in.X, in.dY, in.W0 = roundBF16(in.X), roundBF16(in.dY), roundBF16(in.W0)
	}
	in.Delta = randVals(rng, sh.d*sh.d, 1e-2)
	return in
}

// spOut holds the outputs of the four ops (W as fp32 values).
type spOut struct{ A, B, S, T, W []float32 }

// runSparseOps runs compress A, compress B, S twice (written, then
// accumulated) and apply on a backend of threads threads, with X, dY and
// W stored as dt.
func runSparseOps(t *testing.T, threads int, dt backend.DType, in spInputs) spOut {
	t.Helper()
	sh := in.sh
	be := newBE(t, Config{Threads: threads})
	s := be.DefaultStream()
	dev := func(rows int, idx []int32, val []float32) spDev {
		p := spDev{}
		var err error
		p.colptr, p.rowidx, p.colval, err = SparseColumns(idx, val, rows, sh.d, sh.r)
		if err != nil {
			t.Fatal(err)
		}
		p.tColptr, p.tRowidx = intsOf(t, be, "colptr", p.colptr), intsOf(t, be, "rowidx", p.rowidx)
		p.tColval = tensorOf(t, be, "colval", backend.F32, p.colval)
		p.tIdx, p.tVal = intsOf(t, be, "idx", idx), tensorOf(t, be, "val", backend.F32, val)
		return p
	}
	P, Q := dev(sh.m, in.P.idx, in.P.val), dev(sh.n, in.Q.idx, in.Q.val)
	X, dY, W := tensorOf(t, be, "X", dt, in.X), tensorOf(t, be, "dY", dt, in.dY), tensorOf(t, be, "W", dt, in.W0)
	Delta := tensorOf(t, be, "Delta", backend.F32, in.Delta)
	A, B := alloc(t, be, "A", sh.d*sh.BT, backend.F32), alloc(t, be, "B", sh.BT*sh.d, backend.F32)
	S, T := alloc(t, be, "S", sh.d*sh.d, backend.F32), alloc(t, be, "T", sh.d*sh.n, backend.F32)
	ok(t, be.SparseCompressA(s, A, X, P.tColptr, P.tRowidx, P.tColval, sh.BT, sh.m, sh.d))
	ok(t, be.SparseCompressB(s, B, dY, Q.tColptr, Q.tRowidx, Q.tColval, sh.BT, sh.n, sh.d))
	ok(t, be.SparseS(s, S, A, B, sh.BT, sh.d, false))
	ok(t, be.SparseS(s, S, A, B, sh.BT, sh.d, true))
	ok(t, be.SparseApply(s, W, T, Delta, P.tIdx, P.tVal, Q.tIdx, Q.tVal, backend.Tensor{}, sh.m, sh.n, sh.d, sh.r,
		in.lr, in.wd, in.seed, in.step, in.matrix))
	return spOut{A: get(t, be, A), B: get(t, be, B), S: get(t, be, S), T: get(t, be, T), W: get(t, be, W)}
}

// spRef runs the ref_sparse references on bf16-exact inputs.
func spRef(t *testing.T, in spInputs) spOut {
	t.Helper()
	sh := in.sh
	bits := func(v []float32) []uint16 {
		out := make([]uint16, len(v))
		bf16.FromFloat32Slice(out, v)
		return out
	}
	pc, pr, pv, err := SparseColumns(in.P.idx, in.P.val, sh.m, sh.d, sh.r)
	if err != nil {
		t.Fatal(err)
	}
	qc, qr, qv, err := SparseColumns(in.Q.idx, in.Q.val, sh.n, sh.d, sh.r)
	if err != nil {
		t.Fatal(err)
	}
	o := spOut{A: make([]float32, sh.d*sh.BT), B: make([]float32, sh.BT*sh.d), S: make([]float32, sh.d*sh.d),
		T: make([]float32, sh.d*sh.n), W: make([]float32, sh.m*sh.n)}
	W := bits(in.W0)
	for _, err := range []error{
		SparseCompressA(o.A, bits(in.X), pc, pr, pv, sh.BT, sh.m, sh.d),
		SparseCompressB(o.B, bits(in.dY), qc, qr, qv, sh.BT, sh.n, sh.d),
		SparseS(o.S, o.A, o.B, sh.BT, sh.d, false),
		SparseS(o.S, o.A, o.B, sh.BT, sh.d, true),
		SparseApply(W, o.T, in.Delta, in.P.idx, in.P.val, in.Q.idx, in.Q.val, sh.m, sh.n, sh.d, sh.r,
			in.lr, in.wd, in.seed, in.step, in.matrix),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	bf16.ToFloat32Slice(o.W, W)
	return o
}

// TestSparseOpsMatchReference: with bf16 X, dY and W every output equals
// the references' bits, on 1 and 3 threads. fp32 tensors holding the same
// values take the same summation orders: A, B, S and T are those bits too,
// and the fp32 W is the value before rounding (rounding it with the keyed
// bits gives the reference's W). fp32 inputs of full precision give the
// same bits on 1 and 3 threads.
func TestSparseOpsMatchReference(t *testing.T) {
	for _, sh := range spOpShapes {
		in := newSpInputs(sh, uint64(sh.m), true)
		ref := spRef(t, in)
		key := SRKey(in.seed, in.step, in.matrix)
		for _, threads := range []int{1, 3} {
			what := fmt.Sprintf("%+v threads %d", sh, threads)
			got := runSparseOps(t, threads, backend.BF16, in)
			same(t, what+" bf16: A", got.A, ref.A)
			same(t, what+" bf16: B", got.B, ref.B)
			same(t, what+" bf16: S", got.S, ref.S)
			same(t, what+" bf16: T", got.T, ref.T)
			same(t, what+" bf16: W", got.W, ref.W)

			got = runSparseOps(t, threads, backend.F32, in)
			same(t, what+" fp32: A", got.A, ref.A)
			same(t, what+" fp32: B", got.B, ref.B)
			same(t, what+" fp32: S", got.S, ref.S)
			same(t, what+" fp32: T", got.T, ref.T)
			rounded := make([]float32, len(got.W))
			for k, x := range got.W {
				rounded[k] = bf16.ToFloat32(RoundBF16Bits(x, SRBits(key, uint64(k))))
			}
			same(t, what+" fp32: SR(W)", rounded, ref.W)
		}
		full := newSpInputs(sh, uint64(sh.m)+1, false)
		one, three := runSparseOps(t, 1, backend.F32, full), runSparseOps(t, 3, backend.F32, full)
		for _, c := range []struct {
			name string
			a, b []float32
		}{{"A", one.A, three.A}, {"B", one.B, three.B}, {"S", one.S, three.S}, {"T", one.T, three.T}, {"W", one.W, three.W}} {
			same(t, fmt.Sprintf("%+v fp32 threads 3 vs 1: %s", sh, c.name), c.b, c.a)
		}
	}
}

// spApplyF64 is (1 - lr wd) W + P Delta Q^T in float64 for fp32 W values,
// through T = Delta Q^T; with each value, the sum of the magnitudes of its
// terms.
func spApplyF64(W, Delta []float32, P, Q []float64, m, n, d int, lr, wd float32) (x, xs, T, Ts []float64) {
	T, Ts = make([]float64, d*n), make([]float64, d*n)
	for a := range d {
		for j := range n {
			for b := range d {
				v := float64(Delta[a*d+b]) * Q[j*d+b]
				T[a*n+j] += v
				Ts[a*n+j] += math.Abs(v)
			}
		}
	}
	x, xs = make([]float64, m*n), make([]float64, m*n)
	decay := 1 - float64(lr)*float64(wd)
	for i := range m {
		for j := range n {
			w := decay * float64(W[i*n+j])
			v, vs := w, math.Abs(w)
			for a := range d {
				v += P[i*d+a] * T[a*n+j]
				vs += math.Abs(P[i*d+a]) * Ts[a*n+j]
			}
			x[i*n+j], xs[i*n+j] = v, vs
		}
	}
	return x, xs, T, Ts
}

// TestSparseOpsApply: T is Delta Q^T within (r+1) 2^-24 of the magnitudes
// of its terms; an fp32 W is (1 - lr wd) W + P Delta Q^T within (2r+4)
// 2^-24 of its terms' magnitudes (the first-order bound of its fp32 sums
// and products) and does not depend on the seed; a bf16 W is within one
// bf16 ulp of it (plus that fp32 error), reproduces under the same seed,
// and changes with the seed, the step or the matrix.
func TestSparseOpsApply(t *testing.T) {
	const lr, wd = 1e-3, 0.1
	for _, sh := range spOpShapes {
		for _, dt := range []backend.DType{backend.F32, backend.BF16} {
			what := fmt.Sprintf("%+v %v", sh, dt)
			be := newBE(t, Config{Threads: 2})
			s := be.DefaultStream()
			rng := newRand(uint64(sh.n) * 7)
			P, Q := newSpDev(t, be, rng, sh.m, sh.d, sh.r), newSpDev(t, be, rng, sh.n, sh.d, sh.r)
			W0 := randVals(rng, sh.m*sh.n, 2)
			if dt == backend.BF16 {
				W0 = roundBF16(W0)
			}
			dv := randVals(rng, sh.d*sh.d, 1e-2)
			Delta, T := tensorOf(t, be, "Delta", backend.F32, dv), alloc(t, be, "T", sh.d*sh.n, backend.F32)
			apply := func(seed, step uint64, matrix uint32) []float32 {
				W := tensorOf(t, be, "W", dt, W0)
				ok(t, be.SparseApply(s, W, T, Delta, P.tIdx, P.tVal, Q.tIdx, Q.tVal, backend.Tensor{}, sh.m, sh.n, sh.d, sh.r, lr, wd, seed, step, matrix))
				return get(t, be, W)
			}
			got := apply(1, 10, 2)
			x, xs, T64, Ts := spApplyF64(W0, dv, P.dense, Q.dense, sh.m, sh.n, sh.d, lr, wd)
			spNear(t, what+": T", get(t, be, T), T64, Ts, float64(sh.r+1)*u32)
			tol := float64(2*sh.r+4) * u32
			if dt == backend.F32 {
				spNear(t, what+": W", got, x, xs, tol)
			} else {
				for k, g := range got {
					e := tol * xs[k]
					if d := math.Abs(float64(g) - x[k]); d > bf16Ulp(math.Abs(x[k])+e)+e {
						t.Fatalf("%s: W[%d] = %v, want %v within one bf16 ulp (%.3g)", what, k, g, x[k], bf16Ulp(x[k]))
					}
				}
			}
			if again := apply(1, 10, 2); !slices.Equal(again, got) {
				t.Fatalf("%s: the same seed, step and matrix give other bits", what)
			}
			for _, c := range []struct {
				name       string
				seed, step uint64
				matrix     uint32
			}{{"seed", 2, 10, 2}, {"step", 1, 11, 2}, {"matrix", 1, 10, 3}} {
				other := apply(c.seed, c.step, c.matrix)
				if differ := !slices.Equal(other, got); differ != (dt == backend.BF16) {
					t.Fatalf("%s: another %s changes W: %v, want %v", what, c.name, differ, dt == backend.BF16)
				}
			}
		}
	}
}

// TestSparseOpsApplyUnbiased applies a tiny Delta (updates of a fraction
// of a bf16 ulp) to a bf16 W under 2000 seeds: the mean of the rounded
// results is within 4 standard errors of the exact value (one draw errs by
// at most one ulp, so the standard error is at most ulp/(2 sqrt(2000)));
// rounding to nearest would miss that bound, so the test can fail.
func TestSparseOpsApplyUnbiased(t *testing.T) {
	const m, n, d, r, seeds = 7, 9, 3, 2, 2000
	const lr, wd = 1e-3, 0.1
	be := newBE(t, Config{Threads: 2})
	s := be.DefaultStream()
	rng := newRand(21)
	P, Q := newSpDev(t, be, rng, m, d, r), newSpDev(t, be, rng, n, d, r)
	W0 := roundBF16(randVals(rng, m*n, 2))
	dv := randVals(rng, d*d, 1e-3)
	W0t, W := tensorOf(t, be, "W0", backend.BF16, W0), alloc(t, be, "W", m*n, backend.BF16)
	Delta, T := tensorOf(t, be, "Delta", backend.F32, dv), alloc(t, be, "T", d*n, backend.F32)
	res := alloc(t, be, "results", seeds*m*n, backend.BF16)
	for seed := range seeds {
		ok(t, be.CopyD2D(s, W, W0t))
		ok(t, be.SparseApply(s, W, T, Delta, P.tIdx, P.tVal, Q.tIdx, Q.tVal, backend.Tensor{}, m, n, d, r, lr, wd, uint64(seed), 3, 1))
		ok(t, be.CopyD2D(s, res.Slice(seed*m*n, m*n), W))
	}
	all := get(t, be, res)
	x, xs, _, _ := spApplyF64(W0, dv, P.dense, Q.dense, m, n, d, lr, wd)
	nearestMisses := 0
	for k := range x {
		var mean float64
		for seed := range seeds {
			mean += float64(all[seed*m*n+k]) / seeds
		}
		e := float64(2*r+4) * u32 * xs[k] // fp32 error before the rounding
		bound := 4*bf16Ulp(math.Abs(x[k])+e)/(2*math.Sqrt(seeds)) + e
		if d := math.Abs(mean - x[k]); d > bound {
			t.Fatalf("mean of W[%d] over %d seeds = %v, want %v within %.3g (biased rounding?)", k, seeds, mean, x[k], bound)
		}
		if math.Abs(float64(bf16.ToFloat32(bf16.FromFloat32(float32(x[k]))))-x[k]) > bound {
			nearestMisses++
		}
	}
	if nearestMisses == 0 {
		t.Fatal("rounding to nearest would also pass: the bound checks nothing")
	}
}

// spArgEnv holds valid operands of every sparse op (BT 4, m 5, n 6, d 3,
// r 2) for the cases to spoil one at a time.
type spArgEnv struct {
	BT, m, n, d, r             int
	A, B, S, T, Delta          backend.Tensor // F32
	X, dY, W                   backend.Tensor // BF16
	P, Q                       spDev
	f64, h64, i64              backend.Tensor // F32, BF16, I32 [64], for wrong dtypes
	badRow, badPtr, badP, dupQ backend.Tensor // index storage with bad contents
}

func newSpArgEnv(t *testing.T, be *Backend) spArgEnv {
	t.Helper()
	v := spArgEnv{BT: 4, m: 5, n: 6, d: 3, r: 2}
	rng := newRand(3)
	v.P, v.Q = newSpDev(t, be, rng, v.m, v.d, v.r), newSpDev(t, be, rng, v.n, v.d, v.r)
	v.A, v.B = alloc(t, be, "A", v.d*v.BT, backend.F32), alloc(t, be, "B", v.BT*v.d, backend.F32)
	v.S, v.T = alloc(t, be, "S", v.d*v.d, backend.F32), alloc(t, be, "T", v.d*v.n, backend.F32)
	v.Delta = alloc(t, be, "Delta", v.d*v.d, backend.F32)
	v.X, v.dY = alloc(t, be, "X", v.BT*v.m, backend.BF16), alloc(t, be, "dY", v.BT*v.n, backend.BF16)
	v.W = alloc(t, be, "W", v.m*v.n, backend.BF16)
	v.f64, v.h64, v.i64 = alloc(t, be, "f", 64, backend.F32), alloc(t, be, "h", 64, backend.BF16), alloc(t, be, "i", 64, backend.I32)
	spoil := func(name string, x []int32, k int, val int32) backend.Tensor {
		x = slices.Clone(x)
		x[k] = val
		return intsOf(t, be, name, x)
	}
	v.badRow = spoil("rowidx", v.P.rowidx, len(v.P.rowidx)-1, int32(v.m)) // a row past m
	v.badPtr = spoil("colptr", v.P.colptr, v.d, int32(len(v.P.rowidx)+1)) // more entries than rowidx holds
	v.badP = spoil("pidx", v.P.idx, 0, -1)                                // a negative column
	v.dupQ = spoil("qidx", v.Q.idx, 1, v.Q.idx[0])                        // a column twice in one row
	return v
}

// TestSparseOpsArgumentErrors: wrong dtypes, lengths and sizes are errors
// when the op is enqueued; bad index contents are errors at Synchronize;
// nothing panics, and every message names the op and the argument.
func TestSparseOpsArgumentErrors(t *testing.T) {
	cA := func(be *Backend, v spArgEnv, A, X, cp, ri, cv backend.Tensor, BT int) error {
		return be.SparseCompressA(be.DefaultStream(), A, X, cp, ri, cv, BT, v.m, v.d)
	}
	cB := func(be *Backend, v spArgEnv, B, dY, cp, ri, cv backend.Tensor) error {
		return be.SparseCompressB(be.DefaultStream(), B, dY, cp, ri, cv, v.BT, v.n, v.d)
	}
	ap := func(be *Backend, v spArgEnv, W, T, Delta, pi, pv, qi, qv backend.Tensor, d, r int) error {
		return be.SparseApply(be.DefaultStream(), W, T, Delta, pi, pv, qi, qv, backend.Tensor{}, v.m, v.n, d, r, 1e-3, 0.1, 1, 1, 1)
	}
	cases := []struct {
		name  string
		call  func(be *Backend, v spArgEnv) error
		async bool   // the enqueue succeeds and Synchronize fails
		want  string // a substring of the error
	}{
		{"compress A: A bf16", func(be *Backend, v spArgEnv) error {
			return cA(be, v, v.h64.Slice(0, 12), v.X, v.P.tColptr, v.P.tRowidx, v.P.tColval, v.BT)
		}, false, "sparse compress A: A has dtype bf16, want fp32"},
		{"compress A: X i32", func(be *Backend, v spArgEnv) error {
			return cA(be, v, v.A, v.i64.Slice(0, 20), v.P.tColptr, v.P.tRowidx, v.P.tColval, v.BT)
		}, false, "sparse compress A: X has dtype i32"},
		{"compress A: colptr fp32", func(be *Backend, v spArgEnv) error {
			return cA(be, v, v.A, v.X, v.f64.Slice(0, 4), v.P.tRowidx, v.P.tColval, v.BT)
		}, false, "sparse compress A: colptr has dtype fp32"},
		{"compress A: short A", func(be *Backend, v spArgEnv) error {
			return cA(be, v, v.A.Slice(0, 11), v.X, v.P.tColptr, v.P.tRowidx, v.P.tColval, v.BT)
		}, false, "sparse compress A: A has 11 elements, want 12"},
		{"compress A: BT = 0", func(be *Backend, v spArgEnv) error {
			return cA(be, v, v.A.Slice(0, 0), v.X.Slice(0, 0), v.P.tColptr, v.P.tRowidx, v.P.tColval, 0)
		}, false, "sparse compress A: BT=0"},
		{"compress A: row index past m", func(be *Backend, v spArgEnv) error {
			return cA(be, v, v.A, v.X, v.P.tColptr, v.badRow, v.P.tColval, v.BT)
		}, true, "sparse compress A: sparse columns: column"},
		{"compress A: colptr past rowidx", func(be *Backend, v spArgEnv) error {
			return cA(be, v, v.A, v.X, v.badPtr, v.P.tRowidx, v.P.tColval, v.BT)
		}, true, "sparse compress A: sparse columns:"},
		{"compress B: colval shorter than rowidx", func(be *Backend, v spArgEnv) error {
			return cB(be, v, v.B, v.dY, v.Q.tColptr, v.Q.tRowidx, v.Q.tColval.Slice(0, v.n*v.r-1))
		}, false, "sparse compress B: colval has 11 elements, want 12"},
		{"compress B: colval bf16", func(be *Backend, v spArgEnv) error {
			return cB(be, v, v.B, v.dY, v.Q.tColptr, v.Q.tRowidx, v.h64.Slice(0, v.n*v.r))
		}, false, "sparse compress B: colval has dtype bf16"},
		{"compress B: short dY", func(be *Backend, v spArgEnv) error {
			return cB(be, v, v.B, v.dY.Slice(0, 23), v.Q.tColptr, v.Q.tRowidx, v.Q.tColval)
		}, false, "sparse compress B: dY has 23 elements"},
		{"S: S bf16", func(be *Backend, v spArgEnv) error {
			return be.SparseS(be.DefaultStream(), v.h64.Slice(0, 9), v.A, v.B, v.BT, v.d, true)
		}, false, "sparse S: S has dtype bf16"},
		{"S: short B", func(be *Backend, v spArgEnv) error {
			return be.SparseS(be.DefaultStream(), v.S, v.A, v.B.Slice(0, 10), v.BT, v.d, false)
		}, false, "sparse S: B has 10 elements, want 12"},
		{"S: d = 0", func(be *Backend, v spArgEnv) error {
			return be.SparseS(be.DefaultStream(), v.S, v.A, v.B, v.BT, 0, false)
		}, false, "sparse S: d=0"},
		{"apply: W i32", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.i64.Slice(0, 30), v.T, v.Delta, v.P.tIdx, v.P.tVal, v.Q.tIdx, v.Q.tVal, v.d, v.r)
		}, false, "sparse apply: W has dtype i32"},
		{"apply: short T", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T.Slice(0, 17), v.Delta, v.P.tIdx, v.P.tVal, v.Q.tIdx, v.Q.tVal, v.d, v.r)
		}, false, "sparse apply: T has 17 elements, want 18"},
		{"apply: Delta bf16", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T, v.h64.Slice(0, 9), v.P.tIdx, v.P.tVal, v.Q.tIdx, v.Q.tVal, v.d, v.r)
		}, false, "sparse apply: Delta has dtype bf16"},
		{"apply: short pidx", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T, v.Delta, v.P.tIdx.Slice(0, 9), v.P.tVal, v.Q.tIdx, v.Q.tVal, v.d, v.r)
		}, false, "sparse apply: pidx has 9 elements, want 10"},
		{"apply: qidx fp32", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T, v.Delta, v.P.tIdx, v.P.tVal, v.f64.Slice(0, 12), v.Q.tVal, v.d, v.r)
		}, false, "sparse apply: qidx has dtype fp32"},
		{"apply: qval bf16", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T, v.Delta, v.P.tIdx, v.P.tVal, v.Q.tIdx, v.h64.Slice(0, 12), v.d, v.r)
		}, false, "sparse apply: qval has dtype bf16"},
		{"apply: r > d", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T, v.Delta, v.P.tIdx, v.P.tVal, v.Q.tIdx, v.Q.tVal, v.d, 4)
		}, false, "sparse apply: r=4 > d=3"},
		{"apply: negative P column", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T, v.Delta, v.badP, v.P.tVal, v.Q.tIdx, v.Q.tVal, v.d, v.r)
		}, true, "sparse apply: P: sparse rows: row 0 entry 0: column -1 outside"},
		{"apply: Q column twice", func(be *Backend, v spArgEnv) error {
			return ap(be, v, v.W, v.T, v.Delta, v.P.tIdx, v.P.tVal, v.dupQ, v.Q.tVal, v.d, v.r)
		}, true, "sparse apply: Q: sparse rows: row 0 holds column"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			be := newBE(t, Config{})
			v := newSpArgEnv(t, be)
			err := tc.call(be, v)
			if tc.async {
				if err != nil {
					t.Fatalf("enqueue: %v, want the error at Synchronize", err)
				}
				err = be.Synchronize(be.DefaultStream())
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// spHazEnv is what one hazard scenario works on: streams a and b, event e,
// the small shape of spArgEnv with random bf16 X, dY, W and fp32 Delta,
// and device tensors Wc, Tc for copies of W and T.
type spHazEnv struct {
	spArgEnv
	be     *Backend
	a, b   backend.Stream
	e      backend.Event
	Wc, Tc backend.Tensor
}

func (v spHazEnv) compressA(s backend.Stream) error {
	return v.be.SparseCompressA(s, v.A, v.X, v.P.tColptr, v.P.tRowidx, v.P.tColval, v.BT, v.m, v.d)
}

func (v spHazEnv) compressB(s backend.Stream) error {
	return v.be.SparseCompressB(s, v.B, v.dY, v.Q.tColptr, v.Q.tRowidx, v.Q.tColval, v.BT, v.n, v.d)
}

func (v spHazEnv) apply(s backend.Stream) error {
	return v.be.SparseApply(s, v.W, v.T, v.Delta, v.P.tIdx, v.P.tVal, v.Q.tIdx, v.Q.tVal, backend.Tensor{}, v.m, v.n, v.d, v.r, 1e-3, 0.1, 5, 6, 7)
}

// TestSparseOpsHazards: the sparse ops on two streams. Ordered by an event
// there is no hazard and the results are the references'; without it the
// checker reports the pair, which shows each declared access: compress
// writes A and reads X and its index storage, S reads A (and S only when
// accumulating: two hazards against an earlier fill, not one), apply reads
// Delta and writes W and T.
func TestSparseOpsHazards(t *testing.T) {
	cases := []struct {
		name  string
		run   func(t *testing.T, v spHazEnv)
		want  []hazardPair // nil: no hazard, and the results are checked
		check func(t *testing.T, v spHazEnv, ref spOut)
	}{
		{"S after compress, ordered", func(t *testing.T, v spHazEnv) {
			ok(t, v.compressA(v.a))
			ok(t, v.be.Record(v.e, v.a))
			ok(t, v.compressB(v.b))
			ok(t, v.be.Wait(v.b, v.e))
			ok(t, v.be.SparseS(v.b, v.S, v.A, v.B, v.BT, v.d, false))
		}, nil, func(t *testing.T, v spHazEnv, ref spOut) {
			S, err := backend.Download(v.be, v.b, v.S)
			ok(t, err)
			// The reference accumulated a second time; S = A B once is half of it.
			half := make([]float32, len(S))
			ok(t, SparseS(half, ref.A, ref.B, v.BT, v.d, false))
			same(t, "S", S, half)
		}},
		{"S after compress, no event", func(t *testing.T, v spHazEnv) {
			ok(t, v.compressA(v.a))
			ok(t, v.compressB(v.b))
			ok(t, v.be.SparseS(v.b, v.S, v.A, v.B, v.BT, v.d, false))
		}, []hazardPair{{"sparse S", "sparse compress A"}}, nil},
		{"S accumulating reads S", func(t *testing.T, v spHazEnv) {
			ok(t, v.be.Fill(v.a, v.S, 1))
			ok(t, v.be.SparseS(v.b, v.S, v.A, v.B, v.BT, v.d, true))
		}, []hazardPair{{"sparse S", "fill"}, {"sparse S", "fill"}}, nil},
		{"S overwriting only writes S", func(t *testing.T, v spHazEnv) {
			ok(t, v.be.Fill(v.a, v.S, 1))
			ok(t, v.be.SparseS(v.b, v.S, v.A, v.B, v.BT, v.d, false))
		}, []hazardPair{{"sparse S", "fill"}}, nil},
		{"compress reads X", func(t *testing.T, v spHazEnv) {
			ok(t, v.be.Fill(v.a, v.X, 1))
			ok(t, v.compressA(v.b))
		}, []hazardPair{{"sparse compress A", "fill"}}, nil},
		{"compress reads the column storage", func(t *testing.T, v spHazEnv) {
			ok(t, v.be.CopyD2D(v.a, v.P.tRowidx, v.badRow))
			ok(t, v.compressA(v.b))
		}, []hazardPair{{"sparse compress A", "copy d2d"}}, nil},
		{"W after apply, ordered", func(t *testing.T, v spHazEnv) {
			ok(t, v.apply(v.a))
			ok(t, v.be.Record(v.e, v.a))
			ok(t, v.be.Wait(v.b, v.e))
			ok(t, v.be.CopyD2D(v.b, v.Wc, v.W))
			ok(t, v.be.CopyD2D(v.b, v.Tc, v.T))
		}, nil, func(t *testing.T, v spHazEnv, ref spOut) {
			W, err := backend.Download(v.be, v.b, v.Wc)
			ok(t, err)
			T, err := backend.Download(v.be, v.b, v.Tc)
			ok(t, err)
			same(t, "W", W, ref.W)
			same(t, "T", T, ref.T)
		}},
		{"W after apply, no event", func(t *testing.T, v spHazEnv) {
			ok(t, v.apply(v.a))
			ok(t, v.be.CopyD2D(v.b, v.Wc, v.W))
		}, []hazardPair{{"copy d2d", "sparse apply"}}, nil},
		{"T after apply, no event", func(t *testing.T, v spHazEnv) {
			ok(t, v.apply(v.a))
			ok(t, v.be.CopyD2D(v.b, v.Tc, v.T))
		}, []hazardPair{{"copy d2d", "sparse apply"}}, nil},
		{"apply reads Delta", func(t *testing.T, v spHazEnv) {
			ok(t, v.be.Fill(v.a, v.Delta, 0))
			ok(t, v.apply(v.b))
		}, []hazardPair{{"sparse apply", "fill"}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, seed := range hazardSeeds {
				be := newBE(t, Config{HazardCheck: true, MaxDelay: 100 * time.Microsecond, Seed: seed})
				v := spHazEnv{spArgEnv: newSpArgEnv(t, be), be: be, a: newStream(t, be, "a"), b: newStream(t, be, "b"), e: newEvent(t, be, "e")}
				in := newSpInputs(spShape{BT: v.BT, m: v.m, n: v.n, d: v.d, r: v.r}, seed, true)
				in.P.idx, in.P.val, in.Q.idx, in.Q.val = v.P.idx, v.P.val, v.Q.idx, v.Q.val
				in.lr, in.wd, in.seed, in.step, in.matrix = 1e-3, 0.1, 5, 6, 7
				up := func(x backend.Tensor, vals []float32) {
					ok(t, backend.Upload(be, be.DefaultStream(), x, vals))
				}
				up(v.X, in.X)
				up(v.dY, in.dY)
				up(v.W, in.W0)
				up(v.Delta, in.Delta)
				v.Wc, v.Tc = alloc(t, be, "Wc", v.m*v.n, backend.BF16), alloc(t, be, "Tc", v.d*v.n, backend.F32)
				if tc.want != nil {
					poison(t, be) // nothing runs: the checker works at enqueue
				}
				tc.run(t, v)
				checkHazards(t, seed, be, tc.want, v.a, v.b)
				if tc.want == nil {
					tc.check(t, v, spRef(t, in))
				}
			}
		})
	}
}
