// Tests of the dense projection ops: DenseGemm and DenseApply against
// float64 maths on ragged shapes in every transpose, with fp32 and bf16
// operands; bit identity with the ref_dense references and across thread
// counts; the skip flag; a bf16 W's stochastic rounding unbiased over
// seeds; and the argument errors.

package cpu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// denseF64 is alpha*op(A)op(B) in float64 (and the sum of the terms'
// magnitudes, which bounds the fp32 rounding error).
func denseF64(transA, transB bool, M, N, K int, alpha float64, A, B []float32) (v, mag []float64) {
	v, mag = make([]float64, M*N), make([]float64, M*N)
	for i := range M {
		for j := range N {
			for k := range K {
				a, b := opAB(transA, transB, M, N, K, A, B, i, j, k)
				p := float64(a) * float64(b)
				v[i*N+j] += alpha * p
				mag[i*N+j] += math.Abs(alpha * p)
			}
		}
	}
	return v, mag
}

var denseShapes = [][3]int{{1, 1, 1}, {5, 7, 3}, {33, 17, 65}, {64, 48, 16}}

func TestDenseGemmMatchesF64(t *testing.T) {
	rng := newRand(7)
	for _, threads := range []int{1, 3} {
		be := newBE(t, Config{Threads: threads})
		for _, sh := range denseShapes {
			M, N, K := sh[0], sh[1], sh[2]
			for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				for _, dt := range []backend.DType{backend.F32, backend.BF16} {
					a, b := randVals(rng, M*K, 1), randVals(rng, K*N, 1)
					if dt == backend.BF16 {
						a, b = roundBF16(a), roundBF16(b)
					}
					c0 := randVals(rng, M*N, 1)
					A, B, C := tensorOf(t, be, "A", dt, a), tensorOf(t, be, "B", backend.F32, b), tensorOf(t, be, "C", backend.F32, c0)
					ok(t, be.DenseGemm(be.DefaultStream(), tr[0], tr[1], M, N, K, 0.5, A, B, 2, C))
					got := get(t, be, C)
					want, mag := denseF64(tr[0], tr[1], M, N, K, 0.5, a, b)
					for i := range want {
						want[i] += 2 * float64(c0[i])
						if d := math.Abs(float64(got[i]) - want[i]); d > 1e-6*(mag[i]+2*math.Abs(float64(c0[i])))*float64(K+2) {
							t.Fatalf("threads %d %v %v %v: C[%d] = %v, want %v", threads, sh, tr, dt, i, got[i], want[i])
						}
					}
					// The reference, bit for bit, and beta 0 ignoring a NaN C.
					ref := append([]float32(nil), c0...)
					ok(t, DenseGemm(tr[0], tr[1], M, N, K, 0.5, a, b, 2, ref))
					same(t, "DenseGemm against the reference", got, ref)
					nan := make([]float32, M*N)
					for i := range nan {
						nan[i] = float32(math.NaN())
					}
					C2 := tensorOf(t, be, "C2", backend.F32, nan)
					ok(t, be.DenseGemm(be.DefaultStream(), tr[0], tr[1], M, N, K, 0.5, A, B, 0, C2))
					for i, v := range get(t, be, C2) {
						if math.IsNaN(float64(v)) {
							t.Fatalf("beta 0 read C: C2[%d] is NaN", i)
						}
					}
				}
			}
		}
	}
}

func TestDenseApply(t *testing.T) {
	rng := newRand(11)
	be1, be3 := newBE(t, Config{Threads: 1}), newBE(t, Config{Threads: 3})
	for _, sh := range denseShapes {
		M, N, K := sh[0], sh[1], sh[2]
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}} {
			a, b, w0 := randVals(rng, M*K, 1), randVals(rng, K*N, 1), roundBF16(randVals(rng, M*N, 1))
			const alpha, decay = 0.25, 0.99
			want, _ := denseF64(tr[0], tr[1], M, N, K, alpha, a, b)
			var outs [][]float32
			for _, be := range []*Backend{be1, be3} {
				A, B := tensorOf(t, be, "A", backend.F32, a), tensorOf(t, be, "B", backend.F32, b)
				W32, W16 := tensorOf(t, be, "W32", backend.F32, w0), tensorOf(t, be, "W16", backend.BF16, w0)
				ok(t, be.DenseApply(be.DefaultStream(), tr[0], tr[1], M, N, K, alpha, A, B, decay, W32, backend.Tensor{}, 1, 2, 3))
				ok(t, be.DenseApply(be.DefaultStream(), tr[0], tr[1], M, N, K, alpha, A, B, decay, W16, backend.Tensor{}, 1, 2, 3))
				g32, g16 := get(t, be, W32), get(t, be, W16)
				for i := range want {
					w := want[i] + decay*float64(w0[i])
					if math.Abs(float64(g32[i])-w) > 1e-5*(math.Abs(w)+1)*float64(K) {
						t.Fatalf("%v %v: fp32 W[%d] = %v, want %v", sh, tr, i, g32[i], w)
					}
					// Stochastic rounding lands on one of the two bf16
					// neighbours of the fp32 result.
					lo, hi := bf16Neighbours(g32[i])
					if b := uint16(math.Float32bits(g16[i]) >> 16); b != lo && b != hi {
						t.Fatalf("%v %v: bf16 W[%d] = %v, not a neighbour of %v", sh, tr, i, g16[i], g32[i])
					}
				}
				outs = append(outs, g16)
				// The reference on a bf16 W, bit for bit.
				ref := make([]uint16, M*N)
				bf16.FromFloat32Slice(ref, w0)
				ok(t, DenseApply(tr[0], tr[1], M, N, K, alpha, a, b, decay, ref, 1, 2, 3))
				rf := make([]float32, M*N)
				bf16.ToFloat32Slice(rf, ref)
				same(t, "DenseApply against the reference", g16, rf)
			}
			same(t, "DenseApply on 1 and 3 threads", outs[0], outs[1])
		}
	}
}

func TestDenseApplySkipAndUnbiased(t *testing.T) {
	be := newBE(t, Config{})
	const M, N, K = 4, 5, 3
	a, b := make([]float32, M*K), make([]float32, K*N)
	for i := range a {
		a[i] = 1
	}
	for i := range b {
		b[i] = 1.0 / 3 / 256 // each element gains 1/256: a third of a bf16 ulp at 1
	}
	A, B := tensorOf(t, be, "A", backend.F32, a), tensorOf(t, be, "B", backend.F32, b)
	skip := tensorOf(t, be, "skip", backend.F32, []float32{1})
	ones := make([]float32, M*N)
	for i := range ones {
		ones[i] = 1
	}
	W := tensorOf(t, be, "W", backend.BF16, ones)
	ok(t, be.DenseApply(be.DefaultStream(), false, false, M, N, K, 1, A, B, 1, W, skip, 1, 1, 0))
	same(t, "W after a skipped apply", get(t, be, W), ones)
	// Over many seeds the mean of the rounded result is the exact one.
	sum := 0.0
	const seeds = 400
	for seed := range uint64(seeds) {
		W := tensorOf(t, be, "W", backend.BF16, ones)
		ok(t, be.DenseApply(be.DefaultStream(), false, false, M, N, K, 1, A, B, 1, W, backend.Tensor{}, seed, 1, 0))
		for _, v := range get(t, be, W) {
			sum += float64(v)
		}
		be.Free(W)
	}
	mean, want := sum/seeds/(M*N), 1+float64(float32(K*float32(1.0/3/256)))
	if math.Abs(mean-want) > 2e-4 {
		t.Errorf("mean of the stochastically rounded W = %v, want %v", mean, want)
	}
}

func TestDenseArgErrors(t *testing.T) {
	be := newBE(t, Config{})
	A, B := alloc(t, be, "A", 6, backend.F32), alloc(t, be, "B", 6, backend.F32)
	C16 := alloc(t, be, "C16", 4, backend.BF16)
	for _, c := range []struct {
		err  error
		want string
	}{
		{be.DenseGemm(be.DefaultStream(), false, false, 2, 2, 3, 1, A, B, 0, C16), "C has dtype bf16"},
		{be.DenseGemm(be.DefaultStream(), false, false, 2, 2, 0, 1, A, B, 0, C16), "K=0"},
		{be.DenseApply(be.DefaultStream(), false, false, 2, 2, 3, 1, A, alloc(t, be, "B16", 6, backend.BF16), 1, C16, backend.Tensor{}, 0, 0, 0), "B has dtype bf16"},
		{be.DenseApply(be.DefaultStream(), false, false, 2, 2, 3, 1, A, B, 1, alloc(t, be, "W", 6, backend.BF16), backend.Tensor{}, 0, 0, 0), "W has 6 elements, want 4"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("error %v, want one containing %q", c.err, c.want)
		}
	}
}

// The SIMD core that denseRows runs (host.DenseRows) gives the plain Go
// loops' bits on ragged shapes, zeros, negative zeros, subnormals and
// infinities included, for row ranges that start anywhere: the kernel
// (kernels/dense.cu) is held to the same loops.
func TestDenseRowsMatchGoLoops(t *testing.T) {
	rng := rand.New(rand.NewPCG(40, 41))
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -3e-39, float32(math.Inf(1)), 65504, -1e30}
	fill := func(x []float32) {
		for i := range x {
			x[i] = float32(rng.NormFloat64())
			if rng.IntN(17) == 0 {
				x[i] = special[rng.IntN(len(special))]
			}
		}
	}
	for _, c := range []struct{ M, N, K, lo, hi int }{
		{1, 1, 1, 0, 1}, {7, 5, 3, 0, 7}, {13, 17, 64, 2, 13}, {6, 16, 1, 0, 6}, {65, 33, 100, 5, 61},
		{130, 129, 7, 0, 130}, {3, 300, 45, 1, 2}, {40, 8, 512, 0, 40},
	} {
		a, b := make([]float32, c.M*c.K), make([]float32, c.K*c.N)
		fill(a)
		fill(b)
		got, want := make([]float32, (c.hi-c.lo)*c.N), make([]float32, (c.hi-c.lo)*c.N)
		fill(got) // overwritten, never read
		if err := denseRows(got, a, b, c.N, c.K, c.lo, c.hi); err != nil {
			t.Fatal(err)
		}
		denseRowsGo(want, a, b, c.N, c.K, c.lo, c.hi)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(want[i] != want[i] && got[i] != got[i]) {
				t.Fatalf("%+v: element %d is %v (%#x), the Go loops give %v (%#x)", c, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
}
