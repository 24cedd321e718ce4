// Tests of the quantized ops, GemmQ and Dequantize, against train/quant's
// host decoder (quant.Decode, the reference of both) and a float64
// product, on ragged shapes (partial blocks and groups).

package cpu

import (
	"fmt"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// quantOn quantizes a rows x cols matrix of random values with train/quant
// and puts it on be; it returns the device matrix and the host's decoded
// values.
func quantOn(t *testing.T, be *Backend, f backend.QFormat, rows, cols int, seed uint64) (backend.Quant, []float32) {
	t.Helper()
	q, err := quant.Quantize(f, rows, cols, randVals(newRand(seed), rows*cols, 1))
	if err != nil {
		t.Fatal(err)
	}
	words := func(p []byte) []int32 {
		w := make([]int32, backend.Words(len(p)))
		for i, c := range p {
			w[i/4] |= int32(uint32(c) << (8 * (i % 4)))
		}
		return w
	}
	book := quant.Book()
	W := backend.Quant{Format: f, Rows: rows, Cols: cols, Codes: intsOf(t, be, "codes", words(q.Codes)),
		Absmax: intsOf(t, be, "absmax", words(q.Absmax)), Scale: tensorOf(t, be, "scale", backend.F32, q.Scale),
		Book: tensorOf(t, be, "book", backend.F32, book)}
	dec := make([]float32, rows*cols)
	quant.Decode(f, book, q.Codes, q.Absmax, q.Scale, 0, dec)
	return W, dec
}

func TestGemmQ(t *testing.T) {
	const M, N, K = 3, 70, 33
	for _, f := range []backend.QFormat{backend.NF4, backend.Int8} {
		for _, transW := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/transW=%v", f, transW), func(t *testing.T) {
				be := newBE(t, Config{})
				s := be.DefaultStream()
				rows, cols := K, N
				if transW {
					rows, cols = N, K
				}
				W, w := quantOn(t, be, f, rows, cols, uint64(rows))
				r := newRand(5)
				a, c := randVals(r, M*K, 1), randVals(r, M*N, 1)
				ct := tensorOf(t, be, "C", backend.F32, c)
				ok(t, be.GemmQ(s, transW, M, N, K, 0.75, tensorOf(t, be, "A", backend.F32, a), W, 0.5, ct))
				want := gemm64(false, transW, M, N, K, 0.75, f64s(a), f64s(w), 0.5, f64s(c))
				// K = 33 fp32 products of O(1) values.
				near(t, "C", get(t, be, ct), want, 1e-5, 1e-5)
			})
		}
	}
}

func TestDequantize(t *testing.T) {
	const rows, cols = 9, 130
	for _, f := range []backend.QFormat{backend.NF4, backend.Int8} {
		be := newBE(t, Config{})
		s := be.DefaultStream()
		W, w := quantOn(t, be, f, rows, cols, 3)
		for _, r := range [][2]int{{0, rows * cols}, {77, 500}} {
			out := alloc(t, be, "out", r[1], backend.F32)
			ok(t, be.Dequantize(s, W, r[0], out))
			same(t, fmt.Sprintf("%v [%d,%d)", f, r[0], r[0]+r[1]), get(t, be, out), w[r[0]:r[0]+r[1]])
		}
	}
}
