// Tests of the RoPE reference against a float64 rotation written with
// complex numbers (HF's rotate_half pairs as re/im), and of the backward
// as the transpose of the forward.

package cpu

import (
	"math"
	"math/cmplx"
	"testing"
)

// rope64 rotates each pair (i, i+HS/2) of every head by t*theta^(-2i/HS).
func rope64(x []float64, B, T, NH, HS int, theta float64) []float64 {
	out := make([]float64, len(x))
	h := HS / 2
	for bt := range B * T {
		t := bt % T
		for hd := range NH {
			o := (bt*NH + hd) * HS
			for i := range h {
				a := float64(t) * math.Pow(theta, -float64(2*i)/float64(HS))
				z := complex(x[o+i], x[o+i+h]) * cmplx.Exp(complex(0, a))
				out[o+i], out[o+i+h] = real(z), imag(z)
			}
		}
	}
	return out
}

func TestRoPEReference(t *testing.T) {
	for _, sh := range []struct{ B, T, NH, HS int }{{1, 1, 1, 2}, {2, 13, 3, 10}, {1, 64, 2, 64}} {
		B, T, NH, HS := sh.B, sh.T, sh.NH, sh.HS
		r := newRand(uint64(T*HS + NH))
		n := B * T * NH * HS
		x, dy := randVals(r, n, 2), randVals(r, n, 1)
		const theta = 10000
		inv := RoPEInvFreq(HS, theta)
		out := make([]float32, n)
		RoPEForward(out, x, nil, inv, B, T, NH, HS)
		// fp32 angles t*inv_freq carry a relative error of a few ulps.
		near(t, "rope", out, rope64(f64s(x), B, T, NH, HS, theta), 1e-5, 1e-5)

		in := append([]float32(nil), x...)
		RoPEForward(in, in, nil, inv, B, T, NH, HS)
		same(t, "rope in place", in, out)

		// The backward is the transpose: <RoPE(x), dy> = <x, RoPE^T(dy)>,
		// and rotating forward then backward returns the input.
		dx := make([]float32, n)
		RoPEBackward(dx, dy, nil, inv, B, T, NH, HS)
		l, rr := dot64(f64s(out), f64s(dy)), dot64(f64s(x), f64s(dx))
		if math.Abs(l-rr) > 1e-4*(1+math.Abs(l)) {
			t.Fatalf("B%d T%d NH%d HS%d: <rope x, dy> = %v, <x, rope^T dy> = %v", B, T, NH, HS, l, rr)
		}
		back := make([]float32, n)
		RoPEBackward(back, out, nil, inv, B, T, NH, HS)
		near(t, "rope round trip", back, f64s(x), 1e-5, 1e-5)
	}
}

func TestRoPEInvFreq(t *testing.T) {
	f := RoPEInvFreq(8, 10000)
	want := []float64{1, 0.1, 0.01, 0.001}
	near(t, "inv_freq", f, want, 0, 1e-7)
}
