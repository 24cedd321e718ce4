// Tests of every CPU op against the float64 references of
// ref_<family>_test.go on small ragged shapes (B=2, T=5, C=12, NH=3,
// V=11). Tolerances are |got - want| <= atol + rtol*|want|, stated per
// check; they bound fp32 rounding over the few terms each output sums.
// "+=" outputs start from random values, and overwritten outputs from
// garbage, so both are checked.

package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

const tB, tT, tC, tNH, tV = 2, 5, 12, 3, 11

func add64(a []float64, b ...[]float64) []float64 {
	out := append([]float64(nil), a...)
	for _, x := range b {
		for i := range out {
			out[i] += x[i]
		}
	}
	return out
}

func TestElementwise(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(1)
	a, b := randVals(r, 23, 4), randVals(r, 23, 4)
	x, y, out := tensorOf(t, be, "a", backend.F32, a), tensorOf(t, be, "b", backend.F32, b), alloc(t, be, "out", 23, backend.F32)
	ok(t, be.Add(s, out, x, y))
	want := make([]float32, 23)
	for i := range want {
		want[i] = a[i] + b[i] // one correctly rounded add: exact
	}
	same(t, "add", get(t, be, out), want)
	ok(t, be.Accumulate(s, out, x))
	for i := range want {
		want[i] += a[i]
	}
	same(t, "accumulate", get(t, be, out), want)
	ok(t, be.Scale(s, out, -0.375))
	for i := range want {
		want[i] *= -0.375
	}
	same(t, "scale", get(t, be, out), want)
	ok(t, be.Fill(s, out.Slice(3, 4), 2.5)) // a view: neighbours untouched
	copy(want[3:7], []float32{2.5, 2.5, 2.5, 2.5})
	same(t, "fill", get(t, be, out), want)
}

func TestEncoder(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(2)
	ids := []int32{3, 0, 10, 3, 7, 3, 3, 1, 10, 0}               // repeats: dwte rows sum several positions
	wte, wpe := randVals(r, tV*tC, 1), randVals(r, (tT+2)*tC, 1) // wpe longer than T: allowed
	inp := intsOf(t, be, "inp", ids)
	out := tensorOf(t, be, "out", backend.F32, randVals(r, tB*tT*tC, 9))
	ok(t, be.EncoderForward(s, out, inp, backend.Tensor{}, tensorOf(t, be, "wte", backend.F32, wte), tensorOf(t, be, "wpe", backend.F32, wpe), tB, tT, tC))
	want := make([]float64, tB*tT*tC)
	for bt, id := range ids {
		for c := range tC {
			// One fp32 add, correctly rounded: float32(want) exactly.
			want[bt*tC+c] = float64(float32(float64(wte[int(id)*tC+c]) + float64(wpe[bt%tT*tC+c])))
		}
	}
	near(t, "encoder out", get(t, be, out), want, 0, 0)

	dwte0, dwpe0, dout := randVals(r, tV*tC, 1), randVals(r, (tT+2)*tC, 1), randVals(r, tB*tT*tC, 1)
	dwte, dwpe := tensorOf(t, be, "dwte", backend.F32, dwte0), tensorOf(t, be, "dwpe", backend.F32, dwpe0)
	ok(t, be.EncoderBackward(s, dwte, dwpe, tensorOf(t, be, "dout", backend.F32, dout), inp, backend.Tensor{}, tB, tT, tC))
	gw, gp := f64s(dwte0), f64s(dwpe0)
	for bt, id := range ids {
		for c := range tC {
			gw[int(id)*tC+c] += float64(dout[bt*tC+c])
			gp[bt%tT*tC+c] += float64(dout[bt*tC+c])
		}
	}
	// At most 5 fp32 adds of O(1) terms.
	near(t, "dwte", get(t, be, dwte), gw, 2e-6, 1e-6)
	near(t, "dwpe", get(t, be, dwpe), gp, 2e-6, 1e-6)
}

func TestLayerNorm(t *testing.T) {
	const N, C, eps = tB * tT, tC, 1e-5
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(3)
	x := randVals(r, N*C, 2)
	for i := range x {
		x[i] += 3 // a mean far from 0
	}
	w, bias := randVals(r, C, 1.5), randVals(r, C, 1)
	inp, wt := tensorOf(t, be, "inp", backend.F32, x), tensorOf(t, be, "w", backend.F32, w)
	out, mean, rstd := alloc(t, be, "out", N*C, backend.F32), alloc(t, be, "mean", N, backend.F32), alloc(t, be, "rstd", N, backend.F32)
	ok(t, be.LayerNormForward(s, out, mean, rstd, inp, wt, tensorOf(t, be, "b", backend.F32, bias), N, C, eps))
	wantOut, wantMean, wantRstd := layerNorm64(f64s(x), f64s(w), f64s(bias), N, C, eps)
	// Outputs O(few): the fp32 product and add after a float64 normalisation.
	near(t, "layernorm out", get(t, be, out), wantOut, 1e-6, 1e-6)
	near(t, "layernorm mean", get(t, be, mean), wantMean, 0, 1e-7)
	near(t, "layernorm rstd", get(t, be, rstd), wantRstd, 0, 1e-7)

	dx0, dw0, db0, dout := randVals(r, N*C, 1), randVals(r, C, 1), randVals(r, C, 1), randVals(r, N*C, 1)
	dinp, dw, db := tensorOf(t, be, "dinp", backend.F32, dx0), tensorOf(t, be, "dw", backend.F32, dw0), tensorOf(t, be, "db", backend.F32, db0)
	ok(t, be.LayerNormBackward(s, dinp, dw, db, tensorOf(t, be, "dout", backend.F32, dout), inp, wt, mean, rstd, lnScratch(t, be, N, C), N, C))
	gx, gw, gb := layerNormBackward64(f64s(dout), f64s(x), f64s(w), N, C, eps)
	// fp32 sums of 10-12 O(1) terms, and rstd ~ 1.7 amplifying dinp.
	near(t, "layernorm dinp", get(t, be, dinp), add64(f64s(dx0), gx), 1e-5, 1e-5)
	near(t, "layernorm dweight", get(t, be, dw), add64(f64s(dw0), gw), 1e-5, 1e-5)
	near(t, "layernorm dbias", get(t, be, db), add64(f64s(db0), gb), 1e-5, 1e-5)
}

func TestGemm(t *testing.T) {
	const M, N, K = 5, 7, 9
	for _, tc := range []struct {
		transA, transB bool
		alpha, beta    float32
	}{
		{false, false, 1, 0}, {false, true, 0.7, 0.3}, {true, false, -1.25, 1}, {true, true, 0.5, -2},
		{false, false, 2, 0.5}, {true, true, 1, 0},
	} {
		t.Run(fmt.Sprintf("tA=%v,tB=%v,beta=%v", tc.transA, tc.transB, tc.beta), func(t *testing.T) {
			be := newBE(t, Config{})
			s := be.DefaultStream()
			r := newRand(4)
			a, b, c := randVals(r, M*K, 1), randVals(r, K*N, 1), randVals(r, M*N, 1)
			if tc.beta == 0 {
				for i := range c {
					c[i] = float32(math.NaN()) // beta 0: C is not read
				}
			}
			ct := tensorOf(t, be, "C", backend.F32, c)
			ok(t, be.Gemm(s, tc.transA, tc.transB, M, N, K, tc.alpha, tensorOf(t, be, "A", backend.F32, a),
				tensorOf(t, be, "B", backend.F32, b), tc.beta, ct))
			want := gemm64(tc.transA, tc.transB, M, N, K, float64(tc.alpha), f64s(a), f64s(b), float64(tc.beta), f64s(c))
			// K = 9 fp32 products of O(1) values.
			near(t, "C", get(t, be, ct), want, 1e-5, 1e-5)
		})
	}
}

func TestBias(t *testing.T) {
	const N, OC = tB * tT, 7
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(5)
	o, bias := randVals(r, N*OC, 2), randVals(r, OC, 2)
	out := tensorOf(t, be, "out", backend.F32, o)
	ok(t, be.AddBias(s, out, tensorOf(t, be, "bias", backend.F32, bias), N, OC))
	want := make([]float64, N*OC)
	for i := range want {
		want[i] = float64(o[i] + bias[i%OC]) // one correctly rounded add: exact
	}
	near(t, "add bias", get(t, be, out), want, 0, 0)

	db0, dout := randVals(r, OC, 1), randVals(r, N*OC, 1)
	db := tensorOf(t, be, "dbias", backend.F32, db0)
	ok(t, be.BiasBackward(s, db, tensorOf(t, be, "dout", backend.F32, dout), N, OC))
	gb := f64s(db0)
	for i, d := range dout {
		gb[i%OC] += float64(d)
	}
	near(t, "bias backward", get(t, be, db), gb, 2e-6, 1e-6) // 10 fp32 adds of O(1) terms
}

// TestAttention checks both layouts and grouped-query attention against
// the float64 multi-head reference: a grouped problem is the multi-head
// one with each key/value head repeated for its query heads (HF's
// repeat_kv), and a key/value head's gradient is the sum over its copies.
func TestAttention(t *testing.T) {
	for _, shape := range []struct{ B, T, NH, KVH, HS int }{
		{tB, tT, tNH, tNH, tC / tNH}, {1, 7, 2, 2, 5}, {3, 1, 6, 6, 1}, // multi-head
		{2, 5, 4, 2, 3}, {1, 6, 3, 1, 4}, {2, 3, 6, 3, 2}, // grouped, and multi-query (KVH 1)
	} {
		for _, layout := range []backend.QKVLayout{backend.QKVFused, backend.QKVPlanar} {
			B, T, NH, KVH, HS := shape.B, shape.T, shape.NH, shape.KVH, shape.HS
			t.Run(fmt.Sprintf("B%dT%dNH%dKVH%dHS%d/%v", B, T, NH, KVH, HS, layout), func(t *testing.T) {
				be := newBE(t, Config{})
				s := be.DefaultStream()
				r := newRand(6)
				C, n := NH*HS, B*T*(NH+2*KVH)*HS
				q := randVals(r, n, 1.5)
				qkv := tensorOf(t, be, "qkv", backend.F32, q)
				out := tensorOf(t, be, "out", backend.F32, randVals(r, B*T*C, 9))
				lse := tensorOf(t, be, "lse", backend.F32, randVals(r, B*NH*T, 9))
				ok(t, be.AttentionForward(s, out, lse, qkv, backend.Tensor{}, B, T, NH, KVH, HS, layout))
				x := layout.Index(B*T, NH, KVH, HS)
				wantOut, wantLse := attention64(expandQKV(f64s(q), x, B*T, NH, KVH, HS), B, T, C, NH)
				// Softmax over <= 7 keys of HS <= 5 dot products, all O(1).
				near(t, "attention out", get(t, be, out), wantOut, 1e-6, 1e-5)
				near(t, "attention lse", get(t, be, lse), wantLse, 1e-6, 1e-6)

				dout := randVals(r, B*T*C, 1)
				dqkv := tensorOf(t, be, "dqkv", backend.F32, randVals(r, n, 9)) // overwritten, not accumulated
				ok(t, be.AttentionBackward(s, dqkv, tensorOf(t, be, "dout", backend.F32, dout), qkv, out, lse, backend.Tensor{},
					attnScratch(t, be, B, T, NH), B, T, NH, KVH, HS, layout))
				want := foldQKV(attentionBackward64(expandQKV(f64s(q), x, B*T, NH, KVH, HS), f64s(dout), B, T, C, NH), x, B*T, NH, KVH, HS)
				// Through the saved fp32 out and lse: a few ulps of O(1) terms.
				near(t, "attention dqkv", get(t, be, dqkv), want, 1e-5, 1e-5)
			})
		}
	}
}

// expandQKV rewrites q, k, v found by x as the fused multi-head qkv
// [BT, 3*NH*HS] of attention64, each key/value head repeated for the
// NH/KVH query heads that read it.
func expandQKV(qkv []float64, x backend.QKVIndex, BT, NH, KVH, HS int) []float64 {
	C, per := NH*HS, NH/KVH
	out := make([]float64, BT*3*C)
	for p := range BT {
		for h := range NH {
			g := h / per
			copy(out[p*3*C+h*HS:][:HS], qkv[x.QBase+p*x.QRow+h*HS:][:HS])
			copy(out[p*3*C+C+h*HS:][:HS], qkv[x.KBase+p*x.KVRow+g*HS:][:HS])
			copy(out[p*3*C+2*C+h*HS:][:HS], qkv[x.VBase+p*x.KVRow+g*HS:][:HS])
		}
	}
	return out
}

// foldQKV is expandQKV's adjoint: the gradient of the fused multi-head
// qkv back in x's layout, each key/value head summing its copies.
func foldQKV(d []float64, x backend.QKVIndex, BT, NH, KVH, HS int) []float64 {
	C, per := NH*HS, NH/KVH
	out := make([]float64, BT*(NH+2*KVH)*HS)
	for p := range BT {
		for h := range NH {
			g := h / per
			for i := range HS {
				out[x.QBase+p*x.QRow+h*HS+i] = d[p*3*C+h*HS+i]
				out[x.KBase+p*x.KVRow+g*HS+i] += d[p*3*C+C+h*HS+i]
				out[x.VBase+p*x.KVRow+g*HS+i] += d[p*3*C+2*C+h*HS+i]
			}
		}
	}
	return out
}

func TestGelu(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(7)
	x := append(randVals(r, 61, 6), 0, -10, 10, 1e-4, -3)
	dy := randVals(r, len(x), 1)
	inp, out := tensorOf(t, be, "inp", backend.F32, x), tensorOf(t, be, "out", backend.F32, randVals(r, len(x), 9))
	ok(t, be.GeluForward(s, out, inp))
	// tanh in float64, the polynomial in fp32: a few ulps; atol covers
	// 1 + tanh cancelling for x << 0.
	near(t, "gelu", get(t, be, out), gelu64(f64s(x)), 1e-6, 1e-6)

	g := geluGrad64(f64s(x))
	want := make([]float64, len(x))
	for i := range want {
		want[i] = g[i] * float64(dy[i])
	}
	dout := tensorOf(t, be, "dout", backend.F32, dy)
	dinp := tensorOf(t, be, "dinp", backend.F32, randVals(r, len(x), 9))
	ok(t, be.GeluBackward(s, dinp, inp, dout))
	near(t, "gelu backward", get(t, be, dinp), want, 1e-6, 1e-5)
	ok(t, be.GeluBackward(s, dout, inp, dout)) // dinp may alias dout
	near(t, "gelu backward in place", get(t, be, dout), want, 1e-6, 1e-5)
}

func TestCrossEntropy(t *testing.T) {
	const N, V = tB * tT, tV
	targets := []int32{1, -1, 10, 0, 3, 3, -1, 7, 2, 9} // -1: ignored rows
	for _, scale := range []float32{1.0 / 8, 1, 0} {
		t.Run(fmt.Sprintf("scale=%v", scale), func(t *testing.T) {
			be := newBE(t, Config{})
			s := be.DefaultStream()
			r := newRand(8)
			z := randVals(r, N*V, 4)
			z[5] = 30 // a large logit: the max must be subtracted
			logits := tensorOf(t, be, "logits", backend.F32, z)
			losses := tensorOf(t, be, "losses", backend.F32, randVals(r, N, 9))
			ok(t, be.CrossEntropyForwardBackward(s, losses, logits, intsOf(t, be, "targets", targets), N, V, scale))
			wantLoss, wantGrad := crossEntropy64(f64s(z), targets, N, V, float64(scale))
			// log-sum-exp in float64 from fp32 logits: fp32 output rounding.
			near(t, "losses", get(t, be, losses), wantLoss, 1e-6, 1e-6)
			if scale == 0 {
				same(t, "logits kept", get(t, be, logits), z)
				return
			}
			// fp32 products with scale: ulps of scale.
			near(t, "dlogits", get(t, be, logits), wantGrad, 1e-7*float64(scale), 1e-6)
		})
	}
}

func TestSumSquares(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(9)
	for _, n := range []int{0, 1, 1000, 3*(1<<14) + 5} { // the last spans 4 fixed chunks
		x := randVals(r, n, 2)
		var want float64
		for _, v := range x {
			want += float64(v) * float64(v)
		}
		buf := tensorOf(t, be, "out", backend.F32, []float32{-1, -1, -1})
		ok(t, be.SumSquares(s, buf.Slice(1, 1), tensorOf(t, be, "x", backend.F32, x), sumWork(t, be)))
		// float64 sums, then one fp32 rounding.
		near(t, fmt.Sprintf("sum squares of %d", n), get(t, be, buf), []float64{-1, want, -1}, 0, 1e-7)
	}
}

func TestAdamW(t *testing.T) {
	const n = 29
	hp := backend.AdamParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1}
	cases := []struct {
		name        string
		param, grad backend.DType
		master      bool
		maxNorm     float32
	}{
		{"fp32", backend.F32, backend.F32, false, 0},
		{"clip active", backend.F32, backend.F32, false, 0.5},   // ||g|| ~ 3
		{"clip inactive", backend.F32, backend.F32, false, 100}, // coefficient 1
		{"fp32 with master", backend.F32, backend.F32, true, 0.5},
		{"bf16 with master", backend.BF16, backend.BF16, true, 0.5},
		{"bf16 without master", backend.BF16, backend.F32, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			be := newBE(t, Config{})
			s := be.DefaultStream()
			r := newRand(10)
			p0 := randVals(r, n, 1)
			if tc.param == backend.BF16 {
				p0 = roundBF16(p0)
			}
			param := tensorOf(t, be, "param", tc.param, p0)
			var master backend.Tensor
			if tc.master {
				master = tensorOf(t, be, "master", backend.F32, p0)
			}
			m, v := alloc(t, be, "m", n, backend.F32), alloc(t, be, "v", n, backend.F32)
			sumSq, work := alloc(t, be, "sumSq", 1, backend.F32), sumWork(t, be)
			ref := adam64{lr: float64(hp.LR), b1: float64(hp.Beta1), b2: float64(hp.Beta2), eps: float64(hp.Eps),
				wd: float64(hp.WeightDecay), maxNorm: float64(tc.maxNorm)}
			wp, wm, wv := f64s(p0), make([]float64, n), make([]float64, n)
			for step := 1; step <= 3; step++ {
				g := randVals(r, n, 1)
				if tc.grad == backend.BF16 {
					g = roundBF16(g)
				}
				grad := tensorOf(t, be, "grad", tc.grad, g)
				ok(t, be.SumSquares(s, sumSq, grad, work))
				p := hp
				p.Step, p.MaxNorm = step, tc.maxNorm
				ok(t, be.AdamW(s, param, master, grad, m, v, sumSq, backend.Tensor{}, p))
				var ss float64
				for _, x := range g {
					ss += float64(x) * float64(x)
				}
				ref.step(wp, wm, wv, f64s(g), step, ss)
				// A bf16 param without master is rounded after every step.
				if tc.param == backend.BF16 && !tc.master {
					for i := range wp {
						wp[i] = float64(bf16.ToFloat32(bf16.FromFloat32(float32(wp[i]))))
					}
				}
				be.Free(grad)
			}
			// fp32 moments and update, three steps: a few ulps of O(1)
			// weights. A bf16 param is within one bf16 ulp (2^-8
			// relative) of the fp32 master; without a master, fp32 and
			// float64 may round an update to neighbouring bf16 values,
			// which later steps carry: two ulps.
			rtol := 1e-6
			switch {
			case tc.param == backend.BF16 && tc.master:
				rtol = 1.0 / 256
			case tc.param == backend.BF16:
				rtol = 1.0 / 128
			}
			near(t, "m", get(t, be, m), wm, 1e-7, 1e-5)
			near(t, "v", get(t, be, v), wv, 1e-9, 1e-5)
			got := get(t, be, param)
			near(t, "param", got, wp, 1e-6, rtol)
			if tc.master {
				mw := get(t, be, master)
				near(t, "master", mw, wp, 1e-6, 1e-6)
				want := mw
				if tc.param == backend.BF16 {
					want = roundBF16(mw) // the param is the master rounded to nearest even
				}
				same(t, "param from master", got, want)
			}
		})
	}
}

func TestCopyD2D(t *testing.T) {
	tie := math.Float32frombits(0x3f808000)   // halfway between two bf16: rounds down to even 1.0
	tieUp := math.Float32frombits(0x3f818000) // halfway: rounds up to even 0x3f82
	huge := math.Float32frombits(0x7f7fffff)  // max fp32: beyond bf16, rounds to +Inf
	vals := []float32{1, -2.5, tie, tieUp, huge, float32(math.Inf(-1)), 1e-40, 3.14159265}
	nan := float32(math.NaN())
	cases := []struct {
		name     string
		src, dst backend.DType
	}{
		{"fp32->fp32", backend.F32, backend.F32},
		{"fp32->bf16", backend.F32, backend.BF16},
		{"bf16->fp32", backend.BF16, backend.F32},
		{"bf16->bf16", backend.BF16, backend.BF16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			be := newBE(t, Config{})
			s := be.DefaultStream()
			src := tensorOf(t, be, "src", tc.src, append(append([]float32(nil), vals...), nan))
			dst := tensorOf(t, be, "dst", tc.dst, make([]float32, len(vals)+3))
			// Views at offsets on both sides.
			ok(t, be.CopyD2D(s, dst.Slice(2, len(vals)), src.Slice(0, len(vals))))
			ok(t, be.CopyD2D(s, dst.Slice(2+len(vals), 1), src.Slice(len(vals), 1)))
			got := get(t, be, dst)
			want := append([]float32{0, 0}, vals...)
			if tc.src == backend.BF16 || tc.dst == backend.BF16 {
				want = append([]float32{0, 0}, roundBF16(vals)...)
			}
			same(t, "copy", got[:len(got)-1], want)
			if !math.IsNaN(float64(got[len(got)-1])) {
				t.Errorf("NaN copied as %v", got[len(got)-1])
			}
			if tc.dst == backend.BF16 {
				// The stored bits are train/bf16's rounding, ties to even.
				bits := u16View(dst)[2:]
				for i, v := range vals {
					if bits[i] != bf16.FromFloat32(v) {
						t.Errorf("bf16 bits of %v: %#04x, want %#04x", v, bits[i], bf16.FromFloat32(v))
					}
				}
				if bits[2] != 0x3f80 || bits[3] != 0x3f82 || bits[4] != 0x7f80 {
					t.Errorf("ties / overflow rounded to %#04x %#04x %#04x", bits[2], bits[3], bits[4])
				}
			}
		})
	}
	be := newBE(t, Config{})
	a, b := intsOf(t, be, "a", []int32{-7, 0, 1 << 30}), alloc(t, be, "b", 3, backend.I32)
	ok(t, be.CopyD2D(be.DefaultStream(), b, a))
	mustSync(t, be, be.DefaultStream())
	if got := i32View(b); got[0] != -7 || got[1] != 0 || got[2] != 1<<30 {
		t.Errorf("i32 copy: %v", got)
	}
}
