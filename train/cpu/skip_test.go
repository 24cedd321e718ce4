// Tests of the non-finite step skip: NonFiniteFlag on every kind of
// non-finite value and position, and AdamW and SparseApply leaving every
// output bit as it was when their skip flag is set (and updating when it
// is clear), which is what lets the engine skip a step without a host
// synchronization.

package cpu

import (
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

func TestNonFiniteFlag(t *testing.T) {
	be := newBE(t, Config{Threads: 2})
	s := be.DefaultStream()
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	finite := []float32{0, float32(math.Copysign(0, -1)), 1e-45, -3, math.MaxFloat32, -math.MaxFloat32, 2.5}
	flag := tensorOf(t, be, "flag", backend.F32, []float32{7}) // written, not accumulated
	check := func(what string, x []float32, want float32) {
		t.Helper()
		xt := tensorOf(t, be, "x", backend.F32, x)
		ok(t, be.NonFiniteFlag(s, flag, xt))
		if got := get(t, be, flag)[0]; got != want {
			t.Errorf("%s: flag %v, want %v", what, got, want)
		}
		be.Free(xt)
	}
	check("finite", finite, 0)
	check("empty", []float32{}, 0)
	for _, bad := range []float32{nan, inf, -inf} {
		for _, at := range []int{0, 3, len(finite) - 1} {
			x := append([]float32(nil), finite...)
			x[at] = bad
			check("non-finite", x, 1)
		}
	}
	check("finite after a set flag", finite, 0)

	h := alloc(t, be, "h", 4, backend.BF16)
	f2 := alloc(t, be, "f2", 2, backend.F32)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"bf16 x", be.NonFiniteFlag(s, flag, h), "x has dtype bf16"},
		{"flag of 2", be.NonFiniteFlag(s, f2, f2), "flag has 2 elements"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, tc.err, tc.want)
		}
	}
}

// TestAdamWSkip: with the flag set nothing changes, even with NaN
// gradients; with it clear the same call updates every output.
func TestAdamWSkip(t *testing.T) {
	for _, pdt := range []backend.DType{backend.F32, backend.BF16} {
		t.Run(pdt.String(), func(t *testing.T) {
			be := newBE(t, Config{Threads: 2})
			s := be.DefaultStream()
			r := newRand(3)
			const n = 37
			w0 := roundBF16(randVals(r, n, 1))
			param, master := tensorOf(t, be, "param", pdt, w0), tensorOf(t, be, "master", backend.F32, w0)
			m, v := tensorOf(t, be, "m", backend.F32, randVals(r, n, 0.1)), tensorOf(t, be, "v", backend.F32, randVals(r, n, 0.1))
			ok(t, be.Scale(s, v, 0)) // v >= 0
			g := randVals(r, n, 1)
			g[5] = float32(math.NaN())
			grad := tensorOf(t, be, "grad", backend.F32, g)
			sumSq := tensorOf(t, be, "sumSq", backend.F32, []float32{float32(math.NaN())})
			skip := tensorOf(t, be, "skip", backend.F32, []float32{1})
			p := backend.AdamParams{LR: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 4, MaxNorm: 1}
			outs := []backend.Tensor{param, master, m, v}
			before := make([][]float32, len(outs))
			for i, o := range outs {
				before[i] = get(t, be, o)
			}
			ok(t, be.AdamW(s, param, master, grad, m, v, sumSq, skip, p))
			for i, o := range outs {
				same(t, "skipped "+o.Buf.Name(), get(t, be, o), before[i])
			}
			// Clear: a finite gradient updates every output.
			ok(t, be.Fill(s, skip, 0))
			ok(t, be.Fill(s, grad, 0.5))
			ok(t, be.Fill(s, sumSq, 0.25))
			ok(t, be.AdamW(s, param, master, grad, m, v, sumSq, skip, p))
			for i, o := range outs {
				after := get(t, be, o)
				for k := range after {
					if after[k] == before[i][k] {
						t.Fatalf("%s[%d] unchanged by an update whose flag is clear", o.Buf.Name(), k)
					}
				}
			}
			for _, bad := range []backend.Tensor{alloc(t, be, "two", 2, backend.F32), alloc(t, be, "h", 1, backend.BF16)} {
				if err := be.AdamW(s, param, master, grad, m, v, sumSq, bad, p); err == nil || !strings.Contains(err.Error(), "skip") {
					t.Errorf("skip %v accepted: %v", bad, err)
				}
			}
		})
	}
}

// TestSparseApplySkip: with the flag set neither W nor T changes; with it
// clear the same call writes both.
func TestSparseApplySkip(t *testing.T) {
	for _, wdt := range []backend.DType{backend.F32, backend.BF16} {
		t.Run(wdt.String(), func(t *testing.T) {
			be := newBE(t, Config{Threads: 2})
			s := be.DefaultStream()
			const m, n, d, r = 3, 5, 2, 1
			pidx, pval := intsOf(t, be, "pidx", []int32{0, 1, 0}), tensorOf(t, be, "pval", backend.F32, []float32{1, 0.5, -1})
			qidx, qval := intsOf(t, be, "qidx", []int32{1, 0, 1, 1, 0}), tensorOf(t, be, "qval", backend.F32, []float32{2, 1, -1, 0.5, 3})
			W := tensorOf(t, be, "W", wdt, roundBF16(randVals(newRand(4), m*n, 1)))
			T := tensorOf(t, be, "T", backend.F32, randVals(newRand(5), d*n, 1))
			Delta := tensorOf(t, be, "Delta", backend.F32, []float32{0.25, -0.5, 1, 2})
			skip := tensorOf(t, be, "skip", backend.F32, []float32{1})
			w0, t0 := get(t, be, W), get(t, be, T)
			apply := func() {
				ok(t, be.SparseApply(s, W, T, Delta, pidx, pval, qidx, qval, skip, m, n, d, r, 0.5, 0.1, 1, 2, 3))
			}
			apply()
			same(t, "skipped W", get(t, be, W), w0)
			same(t, "skipped T", get(t, be, T), t0)
			ok(t, be.Fill(s, skip, 0))
			apply()
			w1, t1 := get(t, be, W), get(t, be, T)
			for k := range w1 {
				if w1[k] == w0[k] {
					t.Fatalf("W[%d] unchanged by an apply whose flag is clear", k)
				}
			}
			for k := range t1 {
				if t1[k] == t0[k] {
					t.Fatalf("T[%d] unchanged by an apply whose flag is clear", k)
				}
			}
			if err := be.SparseApply(s, W, T, Delta, pidx, pval, qidx, qval, pidx.Slice(0, 1), m, n, d, r, 0.5, 0.1, 1, 2, 3); err == nil ||
				!strings.Contains(err.Error(), "skip") {
				t.Errorf("an I32 skip accepted: %v", err)
			}
		})
	}
}
