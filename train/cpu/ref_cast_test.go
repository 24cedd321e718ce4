// Tests of the stochastic rounding reference: the generator is SplitMix64's
// finalizer, rounding is exact on bf16 values, picks one of the two
// neighbours, is unbiased within a stated statistical bound, keeps NaN and
// Inf, and is reproducible for a fixed key yet changes with every key word.
// The sum of squares reference gives the op's bits. (The plain casts are
// tested through CopyD2D, ops_test.go, which calls them.)

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// SplitMix64 seeded with 0 outputs mix(G), mix(2G), ...; these are the
// published first outputs of the reference generator.
func TestSRMixIsSplitMix64(t *testing.T) {
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}
	for i, w := range want {
		if got := srMix(uint64(i+1) * srGamma); got != w {
			t.Fatalf("splitmix64(0) output %d = %#x, want %#x", i, got, w)
		}
	}
}

// bf16Neighbours returns the bf16 values just below and above x in
// magnitude (equal when x is a bf16 value).
func bf16Neighbours(x float32) (lo, hi uint16) {
	b := math.Float32bits(x)
	lo = uint16(b >> 16)
	if b&0xffff == 0 {
		return lo, lo
	}
	return lo, lo + 1
}

func TestStochasticRoundSpecialValues(t *testing.T) {
	f := math.Float32frombits
	tests := []struct {
		name string
		in   float32
		want []uint16 // allowed results
	}{
		{"zero", 0, []uint16{0}},
		{"neg zero", float32(math.Copysign(0, -1)), []uint16{0x8000}},
		{"one", 1, []uint16{0x3f80}},
		{"exact bf16", f(0xc0490000), []uint16{0xc049}},
		{"+inf", float32(math.Inf(1)), []uint16{0x7f80}},
		{"-inf", float32(math.Inf(-1)), []uint16{0xff80}},
		{"between", f(0x3f80c000), []uint16{0x3f80, 0x3f81}},
		{"negative between", f(0xbf80c000), []uint16{0xbf80, 0xbf81}},
		{"denormal", f(0x00018000), []uint16{0x0001, 0x0002}},
		{"binade edge", f(0x3fffffff), []uint16{0x3fff, 0x4000}},
		{"beyond max finite", math.MaxFloat32, []uint16{0x7f7f, 0x7f80}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for e := range uint64(200) {
				got := StochasticRoundBF16(tc.in, 7, 3, 1, e)
				okv := false
				for _, w := range tc.want {
					okv = okv || got == w
				}
				if !okv {
					t.Fatalf("SR(%#08x) elem %d = %#04x, want one of %#04x", math.Float32bits(tc.in), e, got, tc.want)
				}
			}
		})
	}
	for _, bits := range []uint32{0x7fc00000, 0xffc00000, 0x7f800001, 0xff80ffff} {
		got := StochasticRoundBF16(f(bits), 1, 2, 3, 4)
		if !math.IsNaN(float64(bf16.ToFloat32(got))) || got>>15 != uint16(bits>>31) {
			t.Errorf("SR(NaN %#08x) = %#04x, want a NaN of the same sign", bits, got)
		}
	}
}

// The mean of K rounded copies of x (different elements) must be within 5
// standard deviations, ulp*sqrt(p(1-p)/K) <= ulp/(2 sqrt(K)), of x; every
// result is one of x's two bf16 neighbours.
func TestStochasticRoundUnbiased(t *testing.T) {
	const K = 1 << 16
	rng := rand.New(rand.NewPCG(1, 2))
	xs := []float32{1.00390625 / 3, -7.1234567, 0.999999, 1e-40, -3.3e-39, 65504.7, 1.5 + 1.0/512}
	for range 8 {
		xs = append(xs, float32(rng.NormFloat64()*math.Exp(rng.NormFloat64()*5)))
	}
	for _, x := range xs {
		lo, hi := bf16Neighbours(x)
		ulp := math.Abs(float64(bf16.ToFloat32(hi)) - float64(bf16.ToFloat32(lo)))
		for _, key := range []struct {
			seed, step uint64
			matrix     uint32
		}{{0, 0, 0}, {42, 1000, 7}, {math.MaxUint64, 1, math.MaxUint32}} {
			var sum float64
			for e := range uint64(K) {
				got := StochasticRoundBF16(x, key.seed, key.step, key.matrix, e)
				if got != lo && got != hi {
					t.Fatalf("SR(%v) = %#04x, not a neighbour (%#04x, %#04x)", x, got, lo, hi)
				}
				sum += float64(bf16.ToFloat32(got))
			}
			mean := sum / K
			bound := 5 * ulp / (2 * math.Sqrt(K))
			if d := math.Abs(mean - float64(x)); d > bound {
				t.Errorf("SR(%v) key %+v: mean %v off by %.3g > %.3g (ulp %.3g)", x, key, mean, d, bound, ulp)
			}
		}
	}
}

// The same key and element give the same bits; changing any key word or
// the element changes about half of 16-bit draws' top bit, and the 16 bits
// are uniform (chi-square over 256 buckets of the top 8 bits).
func TestSRBitsReproducibleAndUniform(t *testing.T) {
	const N = 1 << 16
	base := SRKey(11, 22, 33)
	if base != SRKey(11, 22, 33) {
		t.Fatal("SRKey is not a function of its arguments")
	}
	variants := map[string]uint64{
		"seed": SRKey(12, 22, 33), "step": SRKey(11, 23, 33), "matrix": SRKey(11, 22, 34),
	}
	for name, k := range variants {
		if k == base {
			t.Fatalf("changing the %s leaves the key unchanged", name)
		}
		same := 0
		for e := range uint64(N) {
			if SRBits(base, e)>>15 == SRBits(k, e)>>15 {
				same++
			}
		}
		// Independent bits agree with probability 1/2: 5 sigma = 5*sqrt(N)/2.
		if d := math.Abs(float64(same) - N/2); d > 5*math.Sqrt(N)/2 {
			t.Errorf("changing the %s: top bits agree %d of %d times", name, same, N)
		}
	}
	var buckets [256]float64
	for e := range uint64(N) {
		u := SRBits(base, e)
		if u > 0xffff {
			t.Fatalf("SRBits returned %#x, more than 16 bits", u)
		}
		buckets[u>>8]++
	}
	var chi2 float64
	for _, c := range buckets {
		chi2 += (c - N/256) * (c - N/256) / (N / 256)
	}
	// 255 degrees of freedom: mean 255, sd ~22.6; 400 is beyond 6 sd.
	if chi2 > 400 {
		t.Errorf("top 8 rounding bits not uniform: chi-square %.1f over 255 dof", chi2)
	}
}

func TestStochasticRoundSlice(t *testing.T) {
	src := []float32{1.3, -2.7, 0, 5e-3, 1e30}
	dst := make([]uint16, 3)
	if n := StochasticRoundBF16Slice(dst, src, 5, 6, 7); n != 3 {
		t.Fatalf("converted %d, want 3", n)
	}
	for i := range dst {
		if w := StochasticRoundBF16(src[i], 5, 6, 7, uint64(i)); dst[i] != w {
			t.Errorf("element %d: slice %#04x, scalar %#04x", i, dst[i], w)
		}
	}
}

// TestSumSquaresReferenceIsTheOp: SumSquares gives the bits of the op on 3
// threads, from no chunk to several (the last short).
func TestSumSquaresReferenceIsTheOp(t *testing.T) {
	be := newBE(t, Config{Threads: 3})
	s := be.DefaultStream()
	r := newRand(21)
	for _, n := range []int{0, 1, 1000, 5*sumSquaresChunk + 17} {
		x := randVals(r, n, 3)
		out := alloc(t, be, "out", 1, backend.F32)
		ok(t, be.SumSquares(s, out, tensorOf(t, be, "x", backend.F32, x), sumWork(t, be)))
		want := []float32{-1}
		SumSquares(want, x)
		same(t, fmt.Sprintf("sum squares of %d", n), get(t, be, out), want)
	}
}
