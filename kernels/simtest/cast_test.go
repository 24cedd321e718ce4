//go:build lsp_sim || cuda

// Tests of kernels/cast.cu under the simulator, for every seed of Seeds:
//   - fp32 -> bf16 (round to nearest even) against the CPU backend's
//     CopyD2D, bit for bit, on random values of many magnitudes plus ties,
//     denormals, Inf, NaNs of both signs and overflow; bf16 -> fp32 on all
//     65536 bf16 patterns, bit for bit;
//   - stochastic rounding against train/cpu StochasticRoundBF16Slice, bit
//     for bit (same counter-based bits), reproducible for fixed arguments,
//     and unbiased: the mean of 2^15 roundings of one value lies within 5
//     standard errors (ulp / (2 sqrt(2^15))) of it;
//   - sum of squares against the CPU backend's SumSquares on fp32 and bf16
//     tensors of 0, 1, 37, 5000 and 2^21 + 77 elements (the last runs the
//     full 1024 blocks of the first pass with a grid-stride loop). Both sum
//     exact float64 squares, in different orders, and round once to fp32:
//     |got - want| <= 2.4e-7 |want| (two fp32 ulps; float64 reordering
//     errs ~1e-16 relative, so only a near-tie can flip the last bit).

package simtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// castInputs are n random fp32 values over many binades plus the special
// cases of rounding.
func castInputs(seed uint64, n int) []float32 {
	f := math.Float32frombits
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, f(0x3f808000), f(0x3f818000), f(0x3fff8000),
		f(0x00008000), f(0x00018000), f(0x007fffff), f(0x00000001), f(0x80010000), math.MaxFloat32,
		-math.MaxFloat32, f(0x7f7f8000), float32(math.Inf(1)), float32(math.Inf(-1)), f(0x7fc00000),
		f(0xffc00000), f(0x7f800001), f(0xff80ffff), 1.0 / 3, -65504.7}
	rng := rand.New(rand.NewPCG(seed, 31))
	out := slices.Clone(special)
	for len(out) < n {
		out = append(out, float32(rng.NormFloat64()*math.Exp(rng.NormFloat64()*8)))
	}
	return out[:max(n, len(special))]
}

// bitsOf returns the bf16 patterns of widened bf16 values (exact).
func bitsOf(xs []float32) []uint16 {
	out := make([]uint16, len(xs))
	for i, x := range xs {
		out[i] = uint16(math.Float32bits(x) >> 16)
	}
	return out
}

func TestCastConvert(t *testing.T) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	copyD2D := func(src backend.Tensor, dt backend.DType) []float32 {
		t.Helper()
		dst, err := be.Alloc("dst", src.Len(), dt)
		if err != nil {
			t.Fatal(err)
		}
		defer be.Free(dst)
		if err := be.CopyD2D(s, dst, src); err != nil {
			t.Fatal(err)
		}
		out, err := backend.Download(be, s, dst)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, seed := range Seeds {
		SetSeed(seed)
		x := castInputs(seed, 1000+int(seed)*37)
		src, err := be.Alloc("src", len(x), backend.F32)
		if err != nil {
			t.Fatal(err)
		}
		if err := backend.Upload(be, s, src, x); err != nil {
			t.Fatal(err)
		}
		want := bitsOf(copyD2D(src, backend.BF16))
		be.Free(src)
		out := Alloc(t, 2*len(x))
		if err := kernels.CastF32ToBF16(out.Dev(), FromFloat32(t, x).Dev(), int64(len(x)), 0); err != nil {
			t.Fatal(err)
		}
		CompareBits(t, fmt.Sprintf("seed %d fp32->bf16", seed), out.Uint16(), want)
	}

	// Every bf16 pattern widens exactly.
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	src, err := be.Alloc("src", len(all), backend.BF16)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.Upload(be, s, src, BF16Values(all)); err != nil {
		t.Fatal(err)
	}
	want := copyD2D(src, backend.F32)
	out := AllocBefore(t, 4*len(all))
	if err := kernels.CastBF16ToF32(out.Dev(), FromUint16(t, all).Dev(), int64(len(all)), 0); err != nil {
		t.Fatal(err)
	}
	for i, g := range out.Float32() {
		if math.Float32bits(g) != uint32(i)<<16 || (!math.IsNaN(float64(g)) && g != want[i]) {
			t.Fatalf("bf16 %#04x -> %#08x, want %#08x (CPU %v)", i, math.Float32bits(g), uint32(i)<<16, want[i])
		}
	}
}

func TestCastStochasticRound(t *testing.T) {
	for _, seed := range Seeds {
		SetSeed(seed)
		x := castInputs(seed, 1037)
		in := FromFloat32(t, x)
		out := Alloc(t, 2*len(x))
		step, matrix := 1000+seed, uint32(seed*3)
		if err := kernels.StochasticRoundBF16(out.Dev(), in.Dev(), int64(len(x)), seed, step, matrix, 0); err != nil {
			t.Fatal(err)
		}
		want := make([]uint16, len(x))
		cpu.StochasticRoundBF16Slice(want, x, seed, step, matrix)
		name := fmt.Sprintf("seed %d", seed)
		CompareBits(t, name+" SR", out.Uint16(), want)
		first := slices.Clone(out.Uint16())
		if err := kernels.StochasticRoundBF16(out.Dev(), in.Dev(), int64(len(x)), seed, step, matrix, 0); err != nil {
			t.Fatal(err)
		}
		CompareBits(t, name+" SR rerun", out.Uint16(), first)
	}

	// Unbiased: 2^15 copies of x, each rounded with its own element's bits.
	const K = 1 << 15
	for _, x := range []float32{1.0 / 3, -2.718281828, 1e-3 + 1e-7, 3.3e-39} {
		lo := uint16(math.Float32bits(x) >> 16)
		ulp := math.Abs(float64(bf16.ToFloat32(lo+1)) - float64(bf16.ToFloat32(lo)))
		xs := make([]float32, K)
		for i := range xs {
			xs[i] = x
		}
		out := Alloc(t, 2*K)
		if err := kernels.StochasticRoundBF16(out.Dev(), FromFloat32(t, xs).Dev(), K, 9, 10, 11, 0); err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, h := range out.Uint16() {
			if h != lo && h != lo+1 {
				t.Fatalf("SR(%v) gave %#04x, not a neighbour of %#04x", x, h, lo)
			}
			sum += float64(bf16.ToFloat32(h))
		}
		if d := math.Abs(sum/K - float64(x)); d > 5*ulp/(2*math.Sqrt(K)) {
			t.Errorf("SR(%v): mean %v off by %.3g > %.3g", x, sum/K, d, 5*ulp/(2*math.Sqrt(K)))
		}
	}
}

func TestCastSumSquares(t *testing.T) {
	if backend.SumSquaresWork != kernels.SumSquaresWork {
		t.Fatalf("backend.SumSquaresWork is %d, LSP_SUM_SQUARES_WORK %d", backend.SumSquaresWork, kernels.SumSquaresWork)
	}
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	sizes := []int{1, 37, 5000, 1<<21 + 77}
	for _, seed := range Seeds {
		SetSeed(seed)
		for _, n := range sizes {
			for _, bf := range []bool{false, true} {
				if n > 1<<20 && (bf || seed != Seeds[0]) {
					continue // the large size once: it only adds the grid-stride loop
				}
				x := Rand(seed*5+uint64(n), n, 2)
				dt := backend.F32
				dev := FromFloat32(t, x)
				if bf {
					x = RoundBF16(x)
					dt = backend.BF16
					dev = FromBF16(t, x)
				}
				xt, err := be.Alloc("x", n, dt)
				if err != nil {
					t.Fatal(err)
				}
				out, err := be.Alloc("out", 1, backend.F32)
				if err != nil {
					t.Fatal(err)
				}
				if err := backend.Upload(be, s, xt, x); err != nil {
					t.Fatal(err)
				}
				cpuWork, err := be.Alloc("work", backend.SumSquaresWork, backend.F64)
				if err != nil {
					t.Fatal(err)
				}
				if err := be.SumSquares(s, out, xt, cpuWork); err != nil {
					t.Fatal(err)
				}
				want, err := backend.Download(be, s, out)
				if err != nil {
					t.Fatal(err)
				}
				be.Free(xt)
				be.Free(out)
				be.Free(cpuWork)
				got, work := Alloc(t, 4), Alloc(t, 8*backend.SumSquaresWork) // the Go size callers allocate
				if err := kernels.SumSquares(got.Dev(), dev.Dev(), dtype(bf), int64(n), work.Dev(), 0); err != nil {
					t.Fatal(err)
				}
				Compare(t, fmt.Sprintf("seed %d n %d bf16 %v", seed, n, bf), got.Float32(), want, 0, 2.4e-7)
			}
		}
	}
	// The sum of nothing is 0.
	got, work := Alloc(t, 4), Alloc(t, 8*backend.SumSquaresWork)
	if err := kernels.SumSquares(got.Dev(), Alloc(t, 0).Dev(), kernels.F32, 0, work.Dev(), 0); err != nil {
		t.Fatal(err)
	}
	if got.Float32()[0] != 0 {
		t.Errorf("sum of squares of nothing = %v, want 0", got.Float32()[0])
	}
}

// The launchers reject negative sizes and missing buffers.
func TestCastArgs(t *testing.T) {
	f := Alloc(t, 64).Dev()
	tests := []struct {
		name string
		err  error
	}{
		{"f32->bf16 negative n", kernels.CastF32ToBF16(f, f, -1, 0)},
		{"bf16->f32 nil in", kernels.CastBF16ToF32(f, 0, 4, 0)},
		{"SR nil out", kernels.StochasticRoundBF16(0, f, 4, 0, 0, 0, 0)},
		{"sum squares nil work", kernels.SumSquares(f, f, kernels.F32, 4, 0, 0)},
		{"sum squares negative n", kernels.SumSquares(f, f, kernels.F32, -1, f, 0)},
		{"sum squares dtype flag 2", kernels.SumSquares(f, f, 2, 4, f, 0)},
	}
	for _, tc := range tests {
		if !containsInvalidValue(tc.err) {
			t.Errorf("%s: %v, want cudaErrorInvalidValue", tc.name, tc.err)
		}
	}
}
