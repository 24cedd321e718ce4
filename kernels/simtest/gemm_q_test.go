//go:build lsp_sim || cuda

// Tests of kernels/gemm.cu's lsp_gemm_q (the GEMM whose B operand is a
// quantized matrix, dequantized to bf16 inside its operand loads) under
// the simulator against the CPU backend's GemmQ on the same inputs (W
// made by train/quant.Quantize from random values, quant_test.go's
// quantMatrix and quantBuffers). Shapes: M in {1, 7, 130}, N in {1, 33,
// 129}, K in {3, 64, 100, 257} (every combination: partial tiles, chunks
// that straddle rows, partial blocks and groups, and three scale groups
// at 257 x 129), plus shapes whose rows are multiples of 8 (every chunk
// on the fast path); both formats, W stored [K][N] and [N][K] (transW), C
// fp32 with beta 0 (NaN-filled C) and bf16 with beta 1, the codes buffer
// in each placement of quantBuffers (one byte off: every chunk per
// element). Tolerance: gemm_test.go's (gemmTolerance), the sum's order
// being the only difference.
//
// TestGemmQOperand checks the dequantized operand itself bit for bit: A
// the identity (M = K), alpha 1, beta 0 and fp32 C give C = op(W) as the
// tensor cores saw it (each sum one exact product and zeros), which must
// be train/quant.Decode rounded to bf16 (nearest even).

package simtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

type gemmQCase struct {
	format      backend.QFormat
	transW      bool
	M, N, K     int
	alpha, beta float32
	cBF16       bool
}

func (c gemmQCase) String() string {
	s := fmt.Sprintf("%v_transW=%v_%dx%dx%d_a%g_b%g", c.format, c.transW, c.M, c.N, c.K, c.alpha, c.beta)
	if c.cBF16 {
		return s + "_bf16"
	}
	return s + "_f32"
}

// wShape is W's stored shape.
func (c gemmQCase) wShape() (rows, cols int) {
	if c.transW {
		return c.N, c.K
	}
	return c.K, c.N
}

// runGemmQKernel runs lsp_gemm_q with A (bf16 values), W and C's initial
// values c0, and returns C widened to fp32.
func runGemmQKernel(t *testing.T, c gemmQCase, a []float32, q *quant.Matrix, c0 []float32, seed uint64) []float32 {
	t.Helper()
	A := gemmAlloc(t, len(a), 2, seed)
	A.SetBF16(a)
	b := newQuantBuffers(t, q, seed)
	var C *Buffer
	if c.cBF16 {
		C = gemmAlloc(t, len(c0), 2, seed+2)
		C.SetBF16(c0)
	} else {
		C = gemmAlloc(t, len(c0), 4, seed+2)
		copy(C.Float32(), c0)
	}
	SetSeed(seed)
	if err := kernels.GemmQ(c.transW, c.M, c.N, c.K, c.alpha, A.Dev(), int(c.format), b.codes, b.absmax.Dev(), b.scale.Dev(),
		b.book.Dev(), c.beta, C.Dev(), dtype(c.cBF16), 0); err != nil {
		t.Fatalf("%v: %v", c, err)
	}
	if c.cBF16 {
		return C.BF16()
	}
	return append([]float32(nil), C.Float32()...)
}

// words packs bytes into the I32 words of a backend tensor (memory order,
// little-endian), zero-padded.
func words(b []byte) []int32 {
	w := make([]int32, backend.Words(len(b)))
	for i, x := range b {
		w[i/4] |= int32(uint32(x) << (8 * (i % 4)))
	}
	return w
}

// cpuGemmQ is the reference: the CPU backend's GemmQ on a bf16 A, W and an
// fp32 C.
func cpuGemmQ(t *testing.T, c gemmQCase, a []float32, q *quant.Matrix, c0 []float32) []float32 {
	t.Helper()
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	tensor := func(name string, dt backend.DType, n int) backend.Tensor {
		x, err := be.Alloc(name, n, dt)
		if err != nil {
			t.Fatalf("cpu alloc %s: %v", name, err)
		}
		return x
	}
	upload := func(x backend.Tensor, vals []float32) {
		if err := backend.Upload(be, s, x, vals); err != nil {
			t.Fatal(err)
		}
	}
	uploadInts := func(x backend.Tensor, vals []int32) {
		if err := backend.UploadInt32(be, s, x, vals); err != nil {
			t.Fatal(err)
		}
	}
	A := tensor("A", backend.BF16, len(a))
	upload(A, a)
	C := tensor("C", backend.F32, len(c0))
	upload(C, c0)
	W := backend.Quant{Format: q.Format, Rows: q.Rows, Cols: q.Cols,
		Codes:  tensor("codes", backend.I32, backend.Words(len(q.Codes))),
		Absmax: tensor("absmax", backend.I32, backend.Words(len(q.Absmax))),
		Scale:  tensor("scale", backend.F32, len(q.Scale)),
		Book:   tensor("book", backend.F32, backend.QBookLen)}
	uploadInts(W.Codes, words(q.Codes))
	uploadInts(W.Absmax, words(q.Absmax))
	upload(W.Scale, q.Scale)
	upload(W.Book, quant.Book())
	if err := be.GemmQ(s, c.transW, c.M, c.N, c.K, c.alpha, A, W, c.beta, C); err != nil {
		t.Fatalf("cpu gemm q: %v", err)
	}
	out, err := backend.Download(be, s, C)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// gemmQInputs are A (bf16 values), W and C's initial values (bf16 values
// for a bf16 C; NaN when beta is 0: C must not be read).
func gemmQInputs(t *testing.T, c gemmQCase, seed uint64) (a []float32, q *quant.Matrix, c0 []float32) {
	t.Helper()
	a = RoundBF16(Rand(seed*7+1, c.M*c.K, 1))
	rows, cols := c.wShape()
	q = quantMatrix(t, c.format, rows, cols, seed)
	c0 = Rand(seed*7+3, c.M*c.N, 1)
	if c.cBF16 {
		c0 = RoundBF16(c0)
	}
	if c.beta == 0 {
		for i := range c0 {
			c0[i] = float32(math.NaN())
		}
	}
	return a, q, c0
}

func checkGemmQ(t *testing.T, c gemmQCase) {
	t.Helper()
	atol, rtol := gemmTolerance(gemmCase{M: c.M, N: c.N, K: c.K, cBF16: c.cBF16})
	for _, seed := range Seeds {
		a, q, c0 := gemmQInputs(t, c, seed)
		got := runGemmQKernel(t, c, a, q, c0, seed)
		want := cpuGemmQ(t, c, a, q, c0)
		if !Compare(t, fmt.Sprintf("%v seed %d codes mode %d", c, seed, seed%3), got, want, atol, rtol) {
			return
		}
	}
}

func runGemmQCases(t *testing.T, cases []gemmQCase) {
	for _, c := range cases {
		t.Run(c.String(), func(t *testing.T) { checkGemmQ(t, c) })
	}
}

// TestGemmQRagged: every combination of the ragged sizes, both formats,
// both layouts of W, fp32 C with beta 0 and bf16 C with beta 1.
func TestGemmQRagged(t *testing.T) {
	var cases []gemmQCase
	for _, M := range []int{1, 7, 130} {
		for _, N := range []int{1, 33, 129} {
			for _, K := range []int{3, 64, 100, 257} {
				for _, f := range quantFormats {
					for _, tw := range []bool{false, true} {
						cases = append(cases,
							gemmQCase{format: f, transW: tw, M: M, N: N, K: K, alpha: 1, beta: 0},
							gemmQCase{format: f, transW: tw, M: M, N: N, K: K, alpha: -0.75, beta: 1, cBF16: true})
					}
				}
			}
		}
	}
	runGemmQCases(t, cases)
}

// TestGemmQAligned: W's rows a multiple of 8 long, so every whole chunk is
// read as code words and decoded after the math (the fast path), over
// several K slices and N tiles; with fp32 and bf16 C, beta 0 and 0.5.
func TestGemmQAligned(t *testing.T) {
	var cases []gemmQCase
	for _, f := range quantFormats {
		cases = append(cases,
			gemmQCase{format: f, M: 70, N: 264, K: 96, alpha: 1, beta: 0},
			gemmQCase{format: f, transW: true, M: 70, N: 150, K: 264, alpha: 1, beta: 0},
			gemmQCase{format: f, M: 129, N: 136, K: 200, alpha: 0.5, beta: 0.5, cBF16: true},
			gemmQCase{format: f, transW: true, M: 129, N: 136, K: 200, alpha: 0.5, beta: 0.5, cBF16: true})
	}
	runGemmQCases(t, cases)
}

// TestGemmQOperand: C = I op(W) is the dequantized operand, which must be
// Decode's values rounded to bf16, bit for bit; ragged and aligned rows.
func TestGemmQOperand(t *testing.T) {
	for _, f := range quantFormats {
		for _, tw := range []bool{false, true} {
			for _, sz := range [][2]int{{100, 33}, {64, 129}, {257, 40}, {136, 72}} {
				c := gemmQCase{format: f, transW: tw, M: sz[0], N: sz[1], K: sz[0], alpha: 1, beta: 0}
				t.Run(c.String(), func(t *testing.T) {
					for _, seed := range Seeds {
						a := make([]float32, c.K*c.K)
						for k := 0; k < c.K; k++ {
							a[k*c.K+k] = 1
						}
						rows, cols := c.wShape()
						q := quantMatrix(t, f, rows, cols, seed)
						c0 := make([]float32, c.M*c.N)
						got := runGemmQKernel(t, c, a, q, c0, seed)
						w := decodeRef(q, 0, q.Len())
						want := make([]float32, c.M*c.N)
						for m := 0; m < c.M; m++ {
							for n := 0; n < c.N; n++ {
								x := w[m*c.N+n] // W [K][N], m indexes k
								if tw {
									x = w[n*c.K+m] // W [N][K]
								}
								want[m*c.N+n] = bf16.ToFloat32(bf16.FromFloat32(x))
							}
						}
						if checkF32Bits(t, fmt.Sprintf("%v seed %d codes mode %d", c, seed, seed%3), got, want); t.Failed() {
							return
						}
					}
				})
			}
		}
	}
}

// TestGemmQArgs: argument checks, the empty launches and K = 0.
func TestGemmQArgs(t *testing.T) {
	q := quantMatrix(t, backend.Int8, 8, 8, 1)
	b := newQuantBuffers(t, q, 0)
	A := Alloc(t, 2*64)
	C := Alloc(t, 4*64)
	type args struct {
		format, M, N, K int
		A, codes, C     kernels.Ptr
		cDT             kernels.DType
	}
	gemm := func(a args) error {
		return kernels.GemmQ(false, a.M, a.N, a.K, 1, a.A, a.format, a.codes, b.absmax.Dev(), b.scale.Dev(), b.book.Dev(), 0,
			a.C, a.cDT, 0)
	}
	ok := args{format: 2, M: 8, N: 8, K: 8, A: A.Dev(), codes: b.codes, C: C.Dev()}
	if err := gemm(ok); err != nil {
		t.Fatalf("good arguments: %v", err)
	}
	for i, mod := range []func(a *args){
		func(a *args) { a.format = 0 },
		func(a *args) { a.format = 3 },
		func(a *args) { a.M = -1 },
		func(a *args) { a.K = -1 },
		func(a *args) { a.C = 0 },
		func(a *args) { a.A = 0 },
		func(a *args) { a.codes = 0 },
		func(a *args) { a.cDT = kernels.DType(2) },
		func(a *args) { a.M, a.K = 128*65535+1, 0 },
	} {
		a := ok
		mod(&a)
		if err := gemm(a); err == nil {
			t.Errorf("bad arguments %d (%+v): no error", i, a)
		}
	}
	// M or N of 0 launches nothing; K of 0 gives beta C (here 0: zeros).
	for i := range C.Float32() {
		C.Float32()[i] = float32(math.NaN())
	}
	if err := gemm(args{format: 1, M: 0, N: 8, K: 8, C: C.Dev()}); err != nil {
		t.Errorf("M = 0: %v", err)
	}
	if err := gemm(args{format: 1, M: 4, N: 8, K: 0, C: C.Dev()}); err != nil {
		t.Fatalf("K = 0: %v", err)
	}
	for i, v := range C.Float32()[:32] {
		if v != 0 {
			t.Fatalf("K = 0, beta 0: C[%d] = %v, want 0", i, v)
		}
	}
}
