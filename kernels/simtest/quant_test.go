//go:build lsp_sim || cuda

// Tests of kernels/quant.cu (lsp_dequantize) under the simulator against
// train/quant.Decode, the one definition of a quantized matrix's values:
// both formats, matrices made by train/quant.Quantize from random values
// (so absmax codes and group scales are realistic), lengths that are not
// multiples of 8, 64 or 256 blocks (partial chunks, blocks and groups, and
// more than one group), ranges at offsets and of lengths aligned to
// nothing, fp32 output bit for bit and bf16 output bit for bit against
// Decode rounded to nearest even. The codes buffer sits 256-byte aligned,
// against a guard page (any alignment its length gives) or one byte past
// an aligned start (the per-element path for every chunk).
//
// The helpers here (quantCase, quantBuffers) serve gemm_q_test.go too.

package simtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

var quantFormats = []backend.QFormat{backend.NF4, backend.Int8}

// quantMatrix quantizes a rows x cols matrix of random values whose scale
// varies along the storage order (every block gets its own absmax, the
// groups their own scales), with a block of zeros when there are several.
func quantMatrix(t *testing.T, f backend.QFormat, rows, cols int, seed uint64) *quant.Matrix {
	t.Helper()
	n := rows * cols
	v := Rand(seed*11+5, n, 1)
	for i := range v {
		v[i] *= float32(0.05 + 2*math.Abs(math.Sin(float64(i/backend.QBlock)*0.7+float64(seed))))
	}
	if n >= 3*backend.QBlock {
		for i := backend.QBlock; i < 2*backend.QBlock; i++ {
			v[i] = 0
		}
	}
	q, err := quant.Quantize(f, rows, cols, v)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// quantBuffers is a quantized matrix in device buffers: codes placed by
// mode (0: 256-byte aligned, 1: against a guard page, 2: one byte past an
// aligned start), absmax, scale and book.
type quantBuffers struct {
	codes               kernels.Ptr
	absmax, scale, book *Buffer
	codesBuf            *Buffer
}

func newQuantBuffers(t *testing.T, q *quant.Matrix, mode uint64) quantBuffers {
	t.Helper()
	var b quantBuffers
	switch mode % 3 {
	case 0:
		b.codesBuf = AllocAligned(t, len(q.Codes), 256)
		copy(b.codesBuf.Bytes(), q.Codes)
		b.codes = b.codesBuf.Dev()
	case 1:
		b.codesBuf = Alloc(t, len(q.Codes))
		copy(b.codesBuf.Bytes(), q.Codes)
		b.codes = b.codesBuf.Dev()
	default:
		b.codesBuf = Alloc(t, len(q.Codes)+1+256-(len(q.Codes)+1)%256)
		bs := b.codesBuf.Bytes()
		copy(bs[1:], q.Codes)
		b.codes = b.codesBuf.Dev().Add(1)
	}
	b.absmax = Alloc(t, len(q.Absmax))
	copy(b.absmax.Bytes(), q.Absmax)
	b.scale = FromFloat32(t, q.Scale)
	b.book = FromFloat32(t, quant.Book())
	return b
}

// decodeRef is elements off..off+n of q (train/quant.Decode).
func decodeRef(q *quant.Matrix, off, n int) []float32 {
	out := make([]float32, n)
	quant.Decode(q.Format, quant.Book(), q.Codes, q.Absmax, q.Scale, off, out)
	return out
}

// runDequantize runs lsp_dequantize for elements off..off+n of q into a
// fresh output (NaN-filled, with a guard page after it) and returns it as
// fp32.
func runDequantize(t *testing.T, q *quant.Matrix, b quantBuffers, off, n int, outBF16 bool, seed uint64) []float32 {
	t.Helper()
	var out *Buffer
	if outBF16 {
		out = Alloc(t, 2*n)
		for i := range out.Uint16() {
			out.Uint16()[i] = 0x7fc1
		}
	} else {
		out = Alloc(t, 4*n)
		for i := range out.Float32() {
			out.Float32()[i] = float32(math.NaN())
		}
	}
	SetSeed(seed)
	if err := kernels.Dequantize(int(q.Format), b.codes, b.absmax.Dev(), b.scale.Dev(), b.book.Dev(), int64(q.Len()),
		int64(off), int64(n), out.Dev(), dtype(outBF16), 0); err != nil {
		t.Fatalf("dequantize %v [%d, %d) of %d: %v", q.Format, off, off+n, q.Len(), err)
	}
	if outBF16 {
		return out.BF16()
	}
	return append([]float32(nil), out.Float32()...)
}

// TestQuantDequantize: whole matrices and ranges aligned to nothing, both
// formats, both output dtypes, every codes placement.
func TestQuantDequantize(t *testing.T) {
	shapes := []struct{ rows, cols int }{{1, 1}, {1, 7}, {3, 64}, {7, 100}, {13, 257}, {257, 67}, {130, 129}}
	for _, f := range quantFormats {
		for si, sh := range shapes {
			n := sh.rows * sh.cols
			ranges := [][2]int{{0, n}, {n - 1, 1}, {n / 3, n - n/3}, {min(5, n), max(0, n-min(5, n)-3)}, {n / 2, 0}}
			if n > 200 {
				ranges = append(ranges, [2]int{63, 130}, [2]int{13, 8}, [2]int{n - 77, 77})
			}
			for _, seed := range Seeds {
				q := quantMatrix(t, f, sh.rows, sh.cols, seed+uint64(si))
				b := newQuantBuffers(t, q, seed)
				for _, r := range ranges {
					off, cnt := r[0], r[1]
					want := decodeRef(q, off, cnt)
					for _, obf := range []bool{false, true} {
						name := fmt.Sprintf("%v %dx%d [%d,%d) bf16=%v seed %d codes mode %d", f, sh.rows, sh.cols, off, off+cnt, obf, seed, seed%3)
						got := runDequantize(t, q, b, off, cnt, obf, seed)
						w := want
						if obf {
							w = make([]float32, cnt)
							for i, x := range want {
								w[i] = bf16.ToFloat32(bf16.FromFloat32(x))
							}
						}
						if checkF32Bits(t, name, got, w); t.Failed() {
							return
						}
					}
				}
			}
		}
	}
}

// TestQuantDequantizeArgs: argument checks and the empty launch.
func TestQuantDequantizeArgs(t *testing.T) {
	q := quantMatrix(t, backend.NF4, 4, 16, 1)
	b := newQuantBuffers(t, q, 0)
	out := Alloc(t, 4*64)
	deq := func(format int, len_, off, n int64, codes kernels.Ptr, o kernels.Ptr, dt kernels.DType) error {
		return kernels.Dequantize(format, codes, b.absmax.Dev(), b.scale.Dev(), b.book.Dev(), len_, off, n, o, dt, 0)
	}
	bad := []struct {
		format      int
		len, off, n int64
		codes, out  kernels.Ptr
		dt          kernels.DType
	}{
		{0, 64, 0, 64, b.codes, out.Dev(), kernels.F32},
		{3, 64, 0, 64, b.codes, out.Dev(), kernels.F32},
		{1, -1, 0, 0, b.codes, out.Dev(), kernels.F32},
		{1, 64, -1, 1, b.codes, out.Dev(), kernels.F32},
		{1, 64, 0, -1, b.codes, out.Dev(), kernels.F32},
		{1, 64, 60, 5, b.codes, out.Dev(), kernels.F32},
		{1, 64, 65, 0, b.codes, out.Dev(), kernels.F32},
		{1, 64, 0, 64, 0, out.Dev(), kernels.F32},
		{1, 64, 0, 64, b.codes, 0, kernels.F32},
		{1, 64, 0, 64, b.codes, out.Dev(), kernels.DType(2)},
	}
	for i, a := range bad {
		if err := deq(a.format, a.len, a.off, a.n, a.codes, a.out, a.dt); err == nil {
			t.Errorf("bad arguments %d (%+v): no error", i, a)
		}
	}
	// n == 0 launches nothing and needs no pointers.
	if err := deq(1, 64, 64, 0, 0, 0, kernels.F32); err != nil {
		t.Errorf("empty range: %v", err)
	}
}
