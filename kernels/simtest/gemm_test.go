//go:build lsp_sim || cuda

// Tests of kernels/gemm.cu (lsp_gemm_bf16) under the simulator against the
// CPU backend: train/cpu's Gemm on bf16 A and B tensors, followed by its
// AddBias and GeluForward for the epilogues, on the same inputs. Shapes:
// a realistic one (256 x 192 x 128, several blocks) and ragged ones that
// are not multiples of any tile (1x1x1, 17x33x65, 100x37x31, 65x129x47,
// 150x140x70, ...), every layout, strided and broadcast batches, beta 0
// with a NaN-filled C and beta != 0, fp32 and bf16 output, bias and GELU,
// each for every seed of Seeds. Buffers rotate per seed between a
// 256-byte-aligned start, a guard page right after the end and one right
// before the start, so both the 16-byte and the 2-byte load paths run and
// any access outside a buffer crashes.
//
// Tolerances, |got - want| <= atol + rtol |want|:
//   - fp32 output: atol = 2^-21 K, rtol 1e-5. Both sides sum the same exact
//     bf16 products in fp32, in different orders; the products are O(1/3)
//     and partial sums O(sqrt(K)), so the difference is a few ulps of
//     numbers below sqrt(K); 2^-21 K bounds it with a wide margin for
//     K >= 1 (and is still far below the O(0.1) error of a missed or stale
//     tile). rtol covers the epilogue (bias add, GELU's exp).
//   - bf16 output: the same atol, rtol 2^-8: the kernel rounds once to
//     nearest even (relative error <= 2^-9, taken twice as margin) and the
//     reference keeps fp32 (its C tensor is fp32, so it does not round).

package simtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

type gemmCase struct {
	tA, tB  bool
	M, N, K int
	batch   int
	// Extra elements between consecutive batches of A, B and C; -1 gives
	// stride 0 (the operand is shared by every batch).
	padA, padB, padC int
	alpha, beta      float32
	cBF16            bool
	bias, gelu       bool
}

func (c gemmCase) String() string {
	lay := map[bool]string{false: "N", true: "T"}
	s := fmt.Sprintf("%s%s_%dx%dx%d", lay[c.tA], lay[c.tB], c.M, c.N, c.K)
	if c.batch > 1 {
		s += fmt.Sprintf("_batch%d_pad%d,%d,%d", c.batch, c.padA, c.padB, c.padC)
	}
	s += fmt.Sprintf("_a%g_b%g", c.alpha, c.beta)
	if c.cBF16 {
		s += "_bf16"
	} else {
		s += "_f32"
	}
	if c.bias {
		s += "_bias"
	}
	if c.gelu {
		s += "_gelu"
	}
	return s
}

func (c gemmCase) batches() int { return max(c.batch, 1) }

// layout returns an operand's stride and the length of the buffer that
// holds every batch.
func (c gemmCase) layout(size, pad int) (stride, n int) {
	if pad < 0 || c.batches() == 1 {
		if pad < 0 {
			return 0, size
		}
		return size + pad, size
	}
	stride = size + pad
	return stride, stride*(c.batches()-1) + size
}

// gemmInputs are the values both sides see (already bf16 where the
// kernel reads bf16).
type gemmInputs struct {
	a, b, c0, bias         []float32
	sA, sB, sC, nA, nB, nC int
}

func newGemmInputs(c gemmCase, seed uint64) gemmInputs {
	var in gemmInputs
	in.sA, in.nA = c.layout(c.M*c.K, c.padA)
	in.sB, in.nB = c.layout(c.K*c.N, c.padB)
	in.sC, in.nC = c.layout(c.M*c.N, c.padC)
	in.a = RoundBF16(Rand(seed*7+1, in.nA, 1))
	in.b = RoundBF16(Rand(seed*7+2, in.nB, 1))
	in.c0 = Rand(seed*7+3, in.nC, 1)
	if c.cBF16 {
		in.c0 = RoundBF16(in.c0)
	}
	if c.beta == 0 {
		for i := range in.c0 {
			in.c0[i] = float32(math.NaN()) // beta 0: C must not be read
		}
	}
	if c.bias {
		in.bias = RoundBF16(Rand(seed*7+4, c.N, 0.5))
	}
	return in
}

// gemmAlloc allocates n elements of elem bytes with the guard placement
// picked by mode.
func gemmAlloc(t *testing.T, n, elem int, mode uint64) *Buffer {
	t.Helper()
	switch mode % 3 {
	case 0:
		return AllocAligned(t, n*elem, 256)
	case 1:
		return Alloc(t, n*elem)
	default:
		return AllocBefore(t, n*elem)
	}
}

// runGemmKernel runs lsp_gemm_bf16 on in and returns C (every batch, gaps
// included) widened to fp32.
func runGemmKernel(t *testing.T, c gemmCase, in gemmInputs, seed uint64) []float32 {
	t.Helper()
	A := gemmAlloc(t, in.nA, 2, seed)
	A.SetBF16(in.a)
	B := gemmAlloc(t, in.nB, 2, seed+1)
	B.SetBF16(in.b)
	var Cb *Buffer
	if c.cBF16 {
		Cb = gemmAlloc(t, in.nC, 2, seed+2)
		Cb.SetBF16(in.c0)
	} else {
		Cb = gemmAlloc(t, in.nC, 4, seed+2)
		copy(Cb.Float32(), in.c0)
	}
	var bias *Buffer
	if c.bias {
		bias = gemmAlloc(t, c.N, 2, seed)
		bias.SetBF16(in.bias)
	}
	SetSeed(seed)
	err := kernels.GemmBF16(c.tA, c.tB, c.M, c.N, c.K, c.alpha, A.Dev(), int64(in.sA), B.Dev(), int64(in.sB), c.beta,
		Cb.Dev(), dtype(c.cBF16), int64(in.sC), c.batches(), bias.Dev(), c.gelu, 0)
	if err != nil {
		t.Fatalf("%v: %v", c, err)
	}
	if c.cBF16 {
		return Cb.BF16()
	}
	return append([]float32(nil), Cb.Float32()...)
}

// cpuGemm computes the reference with the CPU backend: per batch Gemm on
// bf16 A and B and an fp32 C, then AddBias and GeluForward in place.
func cpuGemm(t *testing.T, c gemmCase, in gemmInputs) []float32 {
	t.Helper()
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	tensor := func(name string, dt backend.DType, vals []float32) backend.Tensor {
		x, err := be.Alloc(name, len(vals), dt)
		if err != nil {
			t.Fatalf("cpu alloc %s: %v", name, err)
		}
		if err := backend.Upload(be, s, x, vals); err != nil {
			t.Fatalf("cpu upload %s: %v", name, err)
		}
		return x
	}
	A := tensor("A", backend.BF16, in.a)
	B := tensor("B", backend.BF16, in.b)
	C := tensor("C", backend.F32, in.c0)
	var bias backend.Tensor
	if c.bias {
		bias = tensor("bias", backend.BF16, in.bias)
	}
	for bi := 0; bi < c.batches(); bi++ {
		Cb := C.Slice(bi*in.sC, c.M*c.N)
		if err := be.Gemm(s, c.tA, c.tB, c.M, c.N, c.K, c.alpha, A.Slice(bi*in.sA, c.M*c.K),
			B.Slice(bi*in.sB, c.K*c.N), c.beta, Cb); err != nil {
			t.Fatalf("cpu gemm: %v", err)
		}
		if c.bias {
			if err := be.AddBias(s, Cb, bias, c.M, c.N); err != nil {
				t.Fatalf("cpu add bias: %v", err)
			}
		}
		if c.gelu {
			if err := be.GeluForward(s, Cb, Cb); err != nil {
				t.Fatalf("cpu gelu: %v", err)
			}
		}
	}
	out, err := backend.Download(be, s, C)
	if err != nil {
		t.Fatalf("cpu gemm: %v", err)
	}
	return out
}

// gemmTolerance returns atol and rtol for c (see the file comment).
func gemmTolerance(c gemmCase) (atol, rtol float64) {
	atol = math.Ldexp(float64(max(c.K, 1)), -21)
	if c.cBF16 {
		return atol, 1.0 / 256
	}
	return atol, 1e-5
}

// checkGemm runs c for every seed and compares with the CPU backend.
func checkGemm(t *testing.T, c gemmCase) {
	t.Helper()
	atol, rtol := gemmTolerance(c)
	for _, seed := range Seeds {
		in := newGemmInputs(c, seed)
		got := runGemmKernel(t, c, in, seed)
		want := cpuGemm(t, c, in)
		if !Compare(t, fmt.Sprintf("%v seed %d", c, seed), got, want, atol, rtol) {
			return
		}
	}
}

func runGemmCases(t *testing.T, cases []gemmCase) {
	for _, c := range cases {
		t.Run(c.String(), func(t *testing.T) { checkGemm(t, c) })
	}
}

var gemmLayouts = []struct{ tA, tB bool }{{false, false}, {false, true}, {true, false}, {true, true}}

// TestGemmRealistic: a shape that fills several 128 x 128 tiles and four
// K slices, every layout, plain and with the full epilogue.
func TestGemmRealistic(t *testing.T) {
	var cases []gemmCase
	for _, l := range gemmLayouts {
		cases = append(cases,
			gemmCase{tA: l.tA, tB: l.tB, M: 256, N: 192, K: 128, alpha: 1, beta: 0},
			gemmCase{tA: l.tA, tB: l.tB, M: 256, N: 192, K: 128, alpha: 0.5, beta: 1, cBF16: true, bias: true, gelu: true})
	}
	runGemmCases(t, cases)
}

// TestGemmRagged: sizes that are multiples of nothing, fp32 output with
// beta 0 (NaN C) and bf16 output with beta 1, for NN, NT and TN (the
// layouts training uses).
func TestGemmRagged(t *testing.T) {
	shapes := []struct{ M, N, K int }{{1, 1, 1}, {17, 33, 65}, {100, 37, 31}, {65, 129, 47}, {150, 140, 70}}
	var cases []gemmCase
	for _, s := range shapes {
		for _, l := range gemmLayouts[:3] {
			cases = append(cases,
				gemmCase{tA: l.tA, tB: l.tB, M: s.M, N: s.N, K: s.K, alpha: 1, beta: 0},
				gemmCase{tA: l.tA, tB: l.tB, M: s.M, N: s.N, K: s.K, alpha: -0.75, beta: 1, cBF16: true})
		}
	}
	runGemmCases(t, cases)
}

// TestGemmEpilogue: bias, GELU and both, into fp32 and bf16, with and
// without beta, on a ragged shape spanning two tiles along N.
func TestGemmEpilogue(t *testing.T) {
	var cases []gemmCase
	for _, e := range []struct{ bias, gelu bool }{{true, false}, {false, true}, {true, true}} {
		for _, bf := range []bool{false, true} {
			cases = append(cases,
				gemmCase{tB: true, M: 70, N: 150, K: 40, alpha: 1.5, beta: 0, cBF16: bf, bias: e.bias, gelu: e.gelu},
				gemmCase{M: 70, N: 150, K: 40, alpha: 1, beta: 0.5, cBF16: bf, bias: e.bias, gelu: e.gelu})
		}
	}
	runGemmCases(t, cases)
}

// TestGemmBatched: batch 3 with gaps between batches (aligned and not),
// with B shared by every batch (stride 0), and with A shared.
func TestGemmBatched(t *testing.T) {
	cases := []gemmCase{
		{M: 64, N: 64, K: 64, batch: 3, alpha: 1, beta: 0},
		{tB: true, M: 33, N: 45, K: 70, batch: 3, padA: 3, padB: 5, padC: 7, alpha: 1, beta: 1},
		{tA: true, M: 40, N: 24, K: 56, batch: 3, padA: 8, padB: 16, padC: 8, alpha: 2, beta: 0, cBF16: true},
		{M: 20, N: 130, K: 50, batch: 3, padA: 1, padB: -1, padC: 2, alpha: 1, beta: 1, cBF16: true, bias: true, gelu: true},
		{tA: true, tB: true, M: 50, N: 18, K: 33, batch: 3, padA: -1, padB: 4, padC: 0, alpha: -1, beta: 0.25},
	}
	runGemmCases(t, cases)
}

// TestGemmArgs: argument checks, the empty launches and K = 0 (C = beta C
// through the epilogue).
func TestGemmArgs(t *testing.T) {
	A, B := Alloc(t, 2*64), Alloc(t, 2*64)
	Cb := Alloc(t, 4*64)
	for i := range Cb.Float32() {
		Cb.Float32()[i] = float32(i)
	}
	// The arguments of lsp_gemm_bf16 that these cases vary.
	type args struct {
		M, N, K, batch   int
		strideA, strideC int64
		A, B, C          *Buffer
	}
	gemm := func(a args) error {
		return kernels.GemmBF16(false, false, a.M, a.N, a.K, 1, a.A.Dev(), a.strideA, a.B.Dev(), 0, 0, a.C.Dev(),
			kernels.F32, a.strideC, a.batch, 0, false, 0)
	}
	bad := []args{
		{M: -1, N: 4, K: 4, A: A, B: B, C: Cb, batch: 1},
		{M: 4, N: 4, K: -1, A: A, B: B, C: Cb, batch: 1},
		{M: 4, N: 4, K: 4, A: A, B: B, C: Cb, batch: -1},
		{M: 4, N: 4, K: 4, A: A, B: B, C: Cb, batch: 1, strideA: -2},
		{M: 4, N: 4, K: 4, A: A, B: B, C: nil, batch: 1},
		{M: 4, N: 4, K: 4, A: nil, B: B, C: Cb, batch: 1},
		{M: 4, N: 4, K: 4, A: A, B: B, C: Cb, batch: 2, strideC: 15}, // batches of C overlap
		{M: 128*65535 + 1, N: 1, K: 0, A: A, B: B, C: Cb, batch: 1},  // grid y too large
		{M: 1 << 31, N: 1, K: 1, A: A, B: B, C: Cb, batch: 1},        // not a C int: refused by the Go face
	}
	for i, a := range bad {
		if err := gemm(a); err == nil {
			t.Errorf("bad arguments %d (%+v): no error", i, a)
		}
	}
	// A C dtype flag that names no dtype is refused, not read as bf16.
	if err := kernels.GemmBF16(false, false, 4, 4, 4, 1, A.Dev(), 0, B.Dev(), 0, 0, Cb.Dev(), 2, 0, 1, 0, false, 0); !containsInvalidValue(err) {
		t.Errorf("C dtype flag 2: %v, want cudaErrorInvalidValue", err)
	}
	for _, a := range []args{
		{M: 0, N: 4, K: 4, A: A, B: B, C: Cb, batch: 1},
		{M: 4, N: 0, K: 4, A: A, B: B, C: Cb, batch: 1},
		{M: 4, N: 4, K: 4, A: A, B: B, C: Cb, batch: 0},
	} {
		if err := gemm(a); err != nil {
			t.Errorf("empty launch %+v: %v", a, err)
		}
	}
	for i, v := range Cb.Float32() {
		if v != float32(i) {
			t.Fatalf("an empty launch wrote C[%d] = %g", i, v)
		}
	}
	// K = 0: no product, the epilogue still runs.
	checkGemm(t, gemmCase{tA: true, M: 9, N: 21, K: 0, alpha: 1, beta: 0.5, bias: true, gelu: true})
}
