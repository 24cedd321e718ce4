package host

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The CPU backend's former Go loops, which the C kernels follow with their
// own exp (and, for cross-entropy, another order of the double row sum).
const geluCRef = 0.7978845608028654

func geluForwardRef(out, inp []float32) {
	for i, x := range inp {
		u := geluCRef * (x + 0.044715*x*x*x)
		out[i] = x / (1 + float32(math.Exp(float64(-2*u))))
	}
}

func geluBackwardRef(dinp, inp, dout []float32) {
	for i, x := range inp {
		u := geluCRef * (x + 0.044715*x*x*x)
		sig := 1 / (1 + float32(math.Exp(float64(-2*u))))
		th := 2*sig - 1
		d := sig + 0.5*x*(1-th*th)*geluCRef*(1+3*0.044715*x*x)
		dinp[i] = d * dout[i]
	}
}

func crossEntropyRef(losses, logits []float32, targets []int32, V int, scale float32) {
	for r := range losses {
		z := logits[r*V : (r+1)*V]
		t := targets[r]
		if t < 0 {
			losses[r] = 0
			if scale != 0 {
				clear(z)
			}
			continue
		}
		mx := z[0]
		for _, v := range z {
			mx = max(mx, v)
		}
		var sum float64
		for _, v := range z {
			sum += math.Exp(float64(v - mx))
		}
		lse := float64(mx) + math.Log(sum)
		losses[r] = float32(lse - float64(z[t]))
		if scale == 0 {
			continue
		}
		for i, v := range z {
			z[i] = scale * float32(math.Exp(float64(v)-lse))
		}
		z[t] -= scale
	}
}

// ulps is how many fp32 steps apart a and b are (0 for two NaNs).
func ulps(a, b float32) int64 {
	if a != a && b != b {
		return 0
	}
	if a == b {
		return 0
	}
	ia, ib := int64(math.Float32bits(a)), int64(math.Float32bits(b))
	if ia < 0x80000000 != (ib < 0x80000000) {
		return 1 << 40 // opposite signs
	}
	if ia > ib {
		return ia - ib
	}
	return ib - ia
}

// eachPath runs f on every SIMD path, scalar first, and checks that every
// path gives the bits of the first.
func eachPath(t *testing.T, name string, f func() []float32) {
	t.Helper()
	var first []float32
	eachSIMD(t, func(p SIMD) {
		got := f()
		if first == nil {
			first = got
			return
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
				t.Fatalf("%s: %v path: element %d = %v, scalar %v", name, p, i, got[i], first[i])
			}
		}
	})
}

func TestGeluMatchesGoLoops(t *testing.T) {
	if goFusesFloat() {
		t.Skip("this GOARCH fuses multiply-add in Go")
	}
	r := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 4097)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 3)
	}
	copy(x, []float32{0, -0.0, 1e-30, -1e-30, 20, -20, 60, -60, 1e6, -1e6, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())})
	dout := make([]float32, len(x))
	for i := range dout {
		dout[i] = float32(r.NormFloat64())
	}
	want, wantD := make([]float32, len(x)), make([]float32, len(x))
	geluForwardRef(want, x)
	geluBackwardRef(wantD, x, dout)
	check := func(what string, got, want []float32) {
		for i := range got {
			if ulps(got[i], want[i]) > 1 {
				t.Fatalf("%s(%v) = %v, want %v (Go loop)", what, x[i], got[i], want[i])
			}
		}
	}
	eachPath(t, "gelu forward", func() []float32 {
		out := make([]float32, len(x))
		if err := GeluForward(out, x); err != nil {
			t.Fatal(err)
		}
		check("gelu", out, want)
		return out
	})
	eachPath(t, "gelu backward", func() []float32 {
		d := append([]float32(nil), dout...)
		if err := GeluBackward(d, x, d); err != nil { // in place
			t.Fatal(err)
		}
		check("gelu'", d, wantD)
		return d
	})
	if err := GeluForward(make([]float32, 2), x); err == nil {
		t.Error("short out: no error")
	}
}

func TestCrossEntropyMatchesGoLoops(t *testing.T) {
	const N, V = 7, 5003
	r := rand.New(rand.NewPCG(8, 9))
	z0 := make([]float32, N*V)
	for i := range z0 {
		z0[i] = float32(r.NormFloat64() * 4)
	}
	z0[3*V+17] = 90 // exp(v - max) underflows for every other logit of the row
	targets := []int32{1, -1, 5002, 0, 3, 17, 4000}
	for _, scale := range []float32{1.0 / 8, 0} {
		wl, wz := make([]float32, N), append([]float32(nil), z0...)
		crossEntropyRef(wl, wz, targets, V, scale)
		eachPath(t, fmt.Sprintf("cross entropy scale %v", scale), func() []float32 {
			l, z := make([]float32, N), append([]float32(nil), z0...)
			for _, span := range [][2]int{{0, 3}, {3, N}} { // split rows as threads would
				if err := CrossEntropy(l, z, targets, V, scale, span[0], span[1]); err != nil {
					t.Fatal(err)
				}
			}
			for i := range l {
				if ulps(l[i], wl[i]) > 1 {
					t.Fatalf("scale %v: loss %d = %v, want %v (Go loop)", scale, i, l[i], wl[i])
				}
			}
			for i := range z {
				if math.Abs(float64(z[i]-wz[i])) > 2e-7*math.Abs(float64(scale)) {
					t.Fatalf("scale %v: dlogit %d = %v, want %v (Go loop)", scale, i, z[i], wz[i])
				}
			}
			return append(l, z...)
		})
	}
	if err := CrossEntropy(make([]float32, 1), make([]float32, 3), []int32{3}, 3, 1, 0, 1); err == nil {
		t.Error("target outside the vocabulary: no error")
	}
}
