// Tests that results never depend on the thread count: the reductions of
// the backward ops, SumSquares and Gemm give the same bits with 1, 2 and 3
// threads, on shapes large enough that the parallel loops really split
// (the split sizes are in the comments). parallel_test.go checks that the
// split itself runs every index exactly once.

package cpu

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// TestSumSquaresFloat64Invariance checks the float64 sum before its fp32
// rounding, which would hide a thread-dependent summation order: the op's
// split over 1 to 4 threads gives the reference's bits (SumSquares, one
// goroutine).
func TestSumSquaresFloat64Invariance(t *testing.T) {
	x := randVals(newRand(13), 5*(1<<14)+17, 3)
	want := sumSquares(x, serial)
	for threads := 1; threads <= 4; threads++ {
		if got := sumSquares(x, (&Backend{threads: threads}).parallel); math.Float64bits(got) != math.Float64bits(want) {
			t.Errorf("%d threads: %v, want %v as on one goroutine", threads, got, want)
		}
	}
}

func TestThreadCountInvariance(t *testing.T) {
	type outs func(t *testing.T, be *Backend) []backend.Tensor
	s := func(be *Backend) backend.Stream { return be.DefaultStream() }
	rnd := func(t *testing.T, be *Backend, name string, n int, seed uint64) backend.Tensor {
		return tensorOf(t, be, name, backend.F32, randVals(newRand(seed), n, 1))
	}
	cases := []struct {
		name string
		run  outs
	}{
		// Rows split N=60 by 16 (3 chunks), channels C=200 by 64 (3 chunks).
		{"layernorm backward", func(t *testing.T, be *Backend) []backend.Tensor {
			const N, C = 60, 200
			dinp, dw, db := rnd(t, be, "dinp", N*C, 1), rnd(t, be, "dw", C, 2), rnd(t, be, "db", C, 3)
			ok(t, be.LayerNormBackward(s(be), dinp, dw, db, rnd(t, be, "dout", N*C, 5), rnd(t, be, "inp", N*C, 6),
				rnd(t, be, "w", C, 7), rnd(t, be, "mean", N, 8), rnd(t, be, "rstd", N, 4), lnScratch(t, be, N, C), N, C))
			return []backend.Tensor{dinp, dw, db}
		}},
		// Channels C=100 split by 32 (3 chunks); 4 token ids repeat.
		{"encoder backward", func(t *testing.T, be *Backend) []backend.Tensor {
			const B, T, C, V = 3, 20, 100, 4
			ids := make([]int32, B*T)
			for i := range ids {
				ids[i] = int32(i*7) % V
			}
			dwte, dwpe := rnd(t, be, "dwte", V*C, 1), rnd(t, be, "dwpe", T*C, 2)
			ok(t, be.EncoderBackward(s(be), dwte, dwpe, rnd(t, be, "dout", B*T*C, 3), intsOf(t, be, "inp", ids), backend.Tensor{}, B, T, C))
			return []backend.Tensor{dwte, dwpe}
		}},
		// OC=200 split by 64 (3 chunks), each summing N=70 rows.
		{"bias backward", func(t *testing.T, be *Backend) []backend.Tensor {
			const N, OC = 70, 200
			db := rnd(t, be, "db", OC, 1)
			ok(t, be.BiasBackward(s(be), db, rnd(t, be, "dout", N*OC, 2), N, OC))
			return []backend.Tensor{db}
		}},
		// B*NH = 6 heads split 3 ways.
		{"attention backward", func(t *testing.T, be *Backend) []backend.Tensor {
			const B, T, C, NH = 2, 9, 24, 3
			qkv := rnd(t, be, "qkv", B*T*3*C, 1)
			out, lse := alloc(t, be, "out", B*T*C, backend.F32), alloc(t, be, "lse", B*NH*T, backend.F32)
			dqkv := alloc(t, be, "dqkv", B*T*3*C, backend.F32)
			ok(t, be.AttentionForward(s(be), out, lse, qkv, backend.Tensor{}, B, T, NH, NH, C/NH, backend.QKVFused))
			ok(t, be.AttentionBackward(s(be), dqkv, rnd(t, be, "dout", B*T*C, 2), qkv, out, lse, backend.Tensor{}, attnScratch(t, be, B, T, NH), B, T, NH, NH, C/NH, backend.QKVFused))
			return []backend.Tensor{out, lse, dqkv}
		}},
		// 50000 elements: 4 chunks of 2^14, spread over the threads.
		{"sum squares", func(t *testing.T, be *Backend) []backend.Tensor {
			out := alloc(t, be, "out", 1, backend.F32)
			ok(t, be.SumSquares(s(be), out, rnd(t, be, "x", 50000, 1), sumWork(t, be)))
			return []backend.Tensor{out}
		}},
		// 2*150*143*161 = 6.9 Mflop: 3 threads of Sgemm at 2 Mflop each.
		{"gemm", func(t *testing.T, be *Backend) []backend.Tensor {
			const M, N, K = 150, 143, 161
			prev := host.SetThreads(be.Threads())
			defer host.SetThreads(prev)
			c := rnd(t, be, "C", M*N, 3)
			ok(t, be.Gemm(s(be), false, true, M, N, K, 1, rnd(t, be, "A", M*K, 1), rnd(t, be, "B", N*K, 2), 0.5, c))
			mustSync(t, be, s(be))
			return []backend.Tensor{c}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ref [][]float32
			for threads := 1; threads <= 3; threads++ {
				be := newBE(t, Config{Threads: threads})
				var got [][]float32
				for _, x := range tc.run(t, be) {
					got = append(got, get(t, be, x))
				}
				if threads == 1 {
					ref = got
					continue
				}
				for i := range got {
					same(t, tc.name, got[i], ref[i])
				}
			}
		})
	}
}
