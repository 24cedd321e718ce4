package host

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// adamWPlainRef is the CPU backend's Go loop, which AdamWPlain replaces:
// on amd64 Go never fuses a multiply and an add, so this is the unfused
// order element by element.
func adamWPlainRef(c AdamWPlainCoef, w, g, m, v []float32) {
	for i := range w {
		gi := g[i] * c.GradScale
		m[i] = c.Beta1*m[i] + c.OneMinusBeta1*gi
		v[i] = c.Beta2*v[i] + c.OneMinusBeta2*gi*gi
		denom := float32(math.Sqrt(float64(v[i])))/c.SqrtBC2 + c.Eps
		w[i] = w[i]*c.Decay - c.Step*m[i]/denom
	}
}

func TestAdamWPlainMatchesGoLoop(t *testing.T) {
	if goFusesFloat() {
		t.Skip("this GOARCH fuses multiply-add in Go: the reference loop is not the unfused order")
	}
	prev := ActiveSIMD()
	defer SetSIMD(prev)
	b1, b2, lr, wd := float32(0.9), float32(0.95), float32(1e-2), float32(0.1)
	c := AdamWPlainCoef{Beta1: b1, OneMinusBeta1: 1 - b1, Beta2: b2, OneMinusBeta2: 1 - b2, Eps: 1e-8,
		SqrtBC2: float32(math.Sqrt(1 - math.Pow(float64(b2), 3))), Step: float32(float64(lr) / (1 - math.Pow(float64(b1), 3))),
		Decay: 1 - lr*wd, GradScale: 0.37}
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 15, 16, 17, 1000, 4099} {
		for _, gradBF16 := range []bool{false, true} {
			for _, out := range []bool{false, true} {
				w0, m0, v0, g := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
				for i := range w0 {
					w0[i], m0[i], g[i] = float32(r.NormFloat64()), float32(r.NormFloat64()*0.01), float32(r.NormFloat64())
					v0[i] = float32(r.Float64() * 1e-3)
				}
				g[n/2] = float32(math.NaN()) // a NaN goes through, quiet, to the bf16 copy too
				grad := AdamGrad{F32: g}
				if gradBF16 {
					g16 := make([]uint16, n)
					bf16.FromFloat32Slice(g16, g)
					bf16.ToFloat32Slice(g, g16)
					grad = AdamGrad{BF16: g16}
				}
				ww, wm, wv := append([]float32(nil), w0...), append([]float32(nil), m0...), append([]float32(nil), v0...)
				adamWPlainRef(c, ww, g, wm, wv)
				for _, path := range SupportedSIMD() {
					if _, err := SetSIMD(path); err != nil {
						t.Fatal(err)
					}
					w, m, v := append([]float32(nil), w0...), append([]float32(nil), m0...), append([]float32(nil), v0...)
					var o16 []uint16
					if out {
						o16 = make([]uint16, n)
					}
					if err := AdamWPlain(c, w, m, v, grad, o16); err != nil {
						t.Fatal(err)
					}
					for i := range w {
						same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
						if !same(w[i], ww[i]) || !same(m[i], wm[i]) || !same(v[i], wv[i]) {
							t.Fatalf("n %d bf16 grad %v path %v: element %d: w, m, v = %v %v %v, want %v %v %v",
								n, gradBF16, path, i, w[i], m[i], v[i], ww[i], wm[i], wv[i])
						}
						if out && o16[i] != bf16.FromFloat32(ww[i]) {
							t.Fatalf("n %d path %v: bf16 copy %d = %#x, want %#x", n, path, i, o16[i], bf16.FromFloat32(ww[i]))
						}
					}
				}
			}
		}
	}
	if err := AdamWPlain(c, make([]float32, 3), make([]float32, 3), make([]float32, 2), AdamGrad{F32: make([]float32, 3)}, nil); err == nil {
		t.Error("mismatched lengths: no error")
	}
}

// goFusesFloat reports whether Go may fuse x*y+z on this architecture (it
// does on arm64, ppc64, s390x, riscv64; never on amd64 or 386).
func goFusesFloat() bool {
	return runtime.GOARCH != "amd64" && runtime.GOARCH != "386"
}

func TestSumSquaresChunks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 9))
	x := make([]float32, 3*1000+17)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	var first []float64
	eachSIMD(t, func(path SIMD) {
		out := make([]float64, 4)
		if err := SumSquaresChunks(x, 1000, out); err != nil {
			t.Fatal(err)
		}
		for k := range out {
			var want float64
			for _, v := range x[k*1000 : min((k+1)*1000, len(x))] {
				want += float64(v) * float64(v)
			}
			if math.Abs(out[k]-want) > 1e-13*want {
				t.Fatalf("%v: chunk %d = %v, want %v", path, k, out[k], want)
			}
		}
		if first == nil {
			first = out
		} else if !slices.Equal(out, first) {
			t.Fatalf("%v: %v, scalar %v: paths differ", path, out, first)
		}
	})
	if err := SumSquaresChunks(x, 1000, make([]float64, 3)); err == nil {
		t.Error("too few outputs: no error")
	}
}
