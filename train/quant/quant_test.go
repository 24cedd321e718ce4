package quant

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

var formats = []backend.QFormat{backend.NF4, backend.Int8}

// weights is a rows x cols matrix of normal values (std 0.02) with a few
// outliers, seeded.
func weights(seed uint64, rows, cols int) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(r.NormFloat64() * 0.02)
		if r.IntN(200) == 0 {
			v[i] *= 20
		}
	}
	return v
}

func TestBook(t *testing.T) {
	b := Book()
	if len(b) != backend.QBookLen || backend.QBookLen != 256+16 || backend.QBookNF4 != 256 {
		t.Fatalf("book of %d values (QBookLen %d, QBookNF4 %d), want 256 + 16", len(b), backend.QBookLen, backend.QBookNF4)
	}
	if i := sameBits(b[:256], Dynamic[:]); i >= 0 {
		t.Errorf("book[%d] = %v, Dynamic %v", i, b[i], Dynamic[i])
	}
	if i := sameBits(b[backend.QBookNF4:], NF4[:]); i >= 0 {
		t.Errorf("book[256+%d] = %v, NF4 %v", i, b[256+i], NF4[i])
	}
	for name, tab := range map[string][]float32{"Dynamic": Dynamic[:], "NF4": NF4[:]} {
		for i := 1; i < len(tab); i++ {
			if !(tab[i-1] < tab[i]) {
				t.Errorf("%s is not increasing at %d: %v, %v", name, i, tab[i-1], tab[i])
			}
		}
		if tab[len(tab)-1] != 1 {
			t.Errorf("%s ends at %v, want 1", name, tab[len(tab)-1])
		}
	}
	if Dynamic[127] != 0 || NF4[7] != 0 || NF4[0] != -1 {
		t.Errorf("Dynamic[127] = %v, NF4[7] = %v, NF4[0] = %v; want 0, 0, -1", Dynamic[127], NF4[7], NF4[0])
	}
	// Book is a copy: writing to it leaves the tables alone.
	b[0], b[256] = 5, 5
	if Dynamic[0] == 5 || NF4[0] == 5 {
		t.Error("Book aliases the tables")
	}
}

func TestNibbleOrder(t *testing.T) {
	// Element 2i in the high nibble; an odd length pads with the code of 0.
	q, err := Quantize(backend.NF4, 1, 3, []float32{1, -1, 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Codes) != 2 || q.Codes[0] != 0xf0 || q.Codes[1] != 0xc7 {
		t.Errorf("codes % x, want f0 c7", q.Codes)
	}
	q, err = Quantize(backend.Int8, 1, 3, []float32{1, -1, 0.5})
	if err != nil {
		t.Fatal(err)
	}
	// 0.5 between its two nearest levels: the nearer one.
	near := 0
	for i, c := range Dynamic {
		if math.Abs(float64(c)-0.5) < math.Abs(float64(Dynamic[near])-0.5) {
			near = i
		}
	}
	if want := []byte{255, 0, byte(near)}; string(q.Codes) != string(want) {
		t.Errorf("codes %v, want %v", q.Codes, want)
	}
}

// TestDecodeSplits decodes every [off, off+n) of matrices with a ragged
// last block (and an odd NF4 length) and compares with decoding it whole.
func TestDecodeSplits(t *testing.T) {
	for _, f := range formats {
		for _, shape := range [][2]int{{3, 45}, {2, 64}} {
			rows, cols := shape[0], shape[1]
			n := rows * cols
			q, err := Quantize(f, rows, cols, weights(1, rows, cols))
			if err != nil {
				t.Fatal(err)
			}
			whole := make([]float32, n)
			if err := q.Dequantize(0, whole); err != nil {
				t.Fatal(err)
			}
			for off := 0; off <= n; off++ {
				for m := 0; off+m <= n; m++ {
					part := make([]float32, m)
					if err := q.Dequantize(off, part); err != nil {
						t.Fatal(err)
					}
					if i := sameBits(part, whole[off:off+m]); i >= 0 {
						t.Fatalf("%v %dx%d: elements [%d, %d): element %d is %v, whole %v", f, rows, cols, off, off+m, off+i, part[i], whole[off+i])
					}
				}
			}
			for _, r := range [][2]int{{-1, 1}, {n, 1}, {0, n + 1}, {n - 1, 2}} {
				if err := q.Dequantize(r[0], make([]float32, r[1])); err == nil {
					t.Errorf("%v: Dequantize(%d, %d values) of %d elements: no error", f, r[0], r[1], n)
				}
			}
		}
	}
}

func TestZeroBlock(t *testing.T) {
	for _, f := range formats {
		v := weights(2, 4, 64)
		clear(v[64:128]) // block 1
		q, err := Quantize(f, 4, 64, v)
		if err != nil {
			t.Fatal(err)
		}
		deq := make([]float32, len(v))
		if err := q.Dequantize(0, deq); err != nil {
			t.Fatal(err)
		}
		for i := 64; i < 128; i++ {
			if deq[i] != 0 || math.Signbit(float64(deq[i])) {
				t.Fatalf("%v: element %d of a zero block decodes to %v", f, i, deq[i])
			}
		}
		zero := code(nf4Bounds, 0)<<4 | code(nf4Bounds, 0)
		if f == backend.Int8 {
			zero = code(dynamicBounds, 0)
		}
		lo, hi := 64, 128
		if f == backend.NF4 {
			lo, hi = 32, 64
		}
		for i := lo; i < hi; i++ {
			if q.Codes[i] != zero {
				t.Fatalf("%v: code byte %d of a zero block is %#x, want %#x", f, i, q.Codes[i], zero)
			}
		}
		// All zeros: offset and scale 0, every value 0.
		q, err = Quantize(f, 2, 100, make([]float32, 200))
		if err != nil {
			t.Fatal(err)
		}
		if q.Scale[0] != 0 || q.Scale[1] != 0 {
			t.Errorf("%v: zero matrix has scales %v", f, q.Scale)
		}
		deq = make([]float32, 200)
		if err := q.Dequantize(0, deq); err != nil {
			t.Fatal(err)
		}
		for i, x := range deq {
			if x != 0 {
				t.Fatalf("%v: element %d of a zero matrix decodes to %v", f, i, x)
			}
		}
	}
}

func TestNonFinite(t *testing.T) {
	for _, f := range formats {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			v := weights(3, 3, 7)
			v[12] = bad
			_, err := Quantize(f, 3, 7, v)
			if err == nil || !strings.Contains(err.Error(), "element 12 (row 1, column 5)") {
				t.Errorf("%v with %v at element 12: error %v, want one naming element 12 (row 1, column 5)", f, bad, err)
			}
		}
	}
}

func TestRefused(t *testing.T) {
	for _, f := range []backend.QFormat{0, 3, 255} {
		if _, err := Quantize(f, 1, 2, []float32{1, 2}); err == nil || !strings.Contains(err.Error(), "unknown format") {
			t.Errorf("format %v: error %v, want unknown format", f, err)
		}
	}
	for _, f := range formats {
		for _, c := range []struct{ rows, cols, n int }{{2, 3, 5}, {2, 3, 7}, {-1, 2, 0}, {2, -1, 0}, {-2, -3, 6}} {
			if _, err := Quantize(f, c.rows, c.cols, make([]float32, c.n)); err == nil {
				t.Errorf("%v: %d values for %d x %d: no error", f, c.n, c.rows, c.cols)
			}
		}
		q, err := Quantize(f, 0, 5, nil)
		if err != nil || q.Len() != 0 || len(q.Codes) != 0 || len(q.Absmax) != 0 || len(q.Scale) != 1 {
			t.Errorf("%v: empty matrix: %+v, %v", f, q, err)
		}
	}
}

// maxHalfGap is half the largest gap between neighbouring levels.
func maxHalfGap(tab []float32) float64 {
	g := 0.0
	for i := 1; i < len(tab); i++ {
		g = max(g, float64(tab[i])-float64(tab[i-1]))
	}
	return g / 2
}

// TestRoundTrip checks the error bound of quantizing and decoding. With a
// the block's absmax and â its decoded (double-quantized) value, x = s*a
// with |s| <= 1 and the code's level L within half a gap of s, so
// |x - L*â| <= a*halfgap + |a - â|; and |a - â| is at most the group's
// scale times the dynamic map's half gap. A few float32 roundings (the
// reciprocal, the products, the offset) add a relative 1e-6.
func TestRoundTrip(t *testing.T) {
	for _, f := range formats {
		tab := NF4[:]
		if f == backend.Int8 {
			tab = Dynamic[:]
		}
		hg, hgDyn := maxHalfGap(tab), maxHalfGap(Dynamic[:])
		for _, shape := range [][2]int{{64, 64}, {33, 65}, {130, 300}} {
			rows, cols := shape[0], shape[1]
			v := weights(uint64(rows*cols), rows, cols)
			q, err := Quantize(f, rows, cols, v)
			if err != nil {
				t.Fatal(err)
			}
			deq := make([]float32, len(v))
			if err := q.Dequantize(0, deq); err != nil {
				t.Fatal(err)
			}
			book := Book()
			worst := 0.0
			for b := 0; b < backend.QBlocks(len(v)); b++ {
				blk := v[b*backend.QBlock : min(len(v), (b+1)*backend.QBlock)]
				a := 0.0
				for _, x := range blk {
					a = max(a, math.Abs(float64(x)))
				}
				ah := float64(BlockAbsmax(book, q.Absmax, q.Scale, b))
				scale := float64(q.Scale[b/backend.QGroup])
				if e := math.Abs(a - ah); e > scale*hgDyn+1e-6*a {
					t.Fatalf("%v %dx%d block %d: absmax %v decodes to %v, error %g over the bound %g", f, rows, cols, b, a, ah, e, scale*hgDyn)
				}
				bound := a*hg + math.Abs(a-ah) + 1e-6*a
				for j, x := range blk {
					i := b*backend.QBlock + j
					e := math.Abs(float64(x) - float64(deq[i]))
					if e > bound {
						t.Fatalf("%v %dx%d element %d: %v decodes to %v, error %g over the bound %g", f, rows, cols, i, x, deq[i], e, bound)
					}
					worst = max(worst, e/bound)
				}
			}
			t.Logf("%v %dx%d: worst error %.3f of the bound", f, rows, cols, worst)
		}
	}
}

// TestTies: a scaled value on a boundary gets the lower code, the next
// float32 up the upper one (torch.bucketize, right=False).
func TestTies(t *testing.T) {
	for name, b := range map[string][]float32{"NF4": nf4Bounds, "Dynamic": dynamicBounds} {
		for i, x := range b {
			if c := code(b, x); int(c) != i {
				t.Errorf("%s boundary %d (%v): code %d, want %d", name, i, x, c, i)
			}
			if c := code(b, math.Nextafter32(x, 2)); int(c) != i+1 {
				t.Errorf("%s just above boundary %d: code %d, want %d", name, i, c, i+1)
			}
		}
	}
}

// TestReciprocal: values are scaled by x * (1/absmax), each rounded to
// float32, as bitsandbytes' kernels do, not by x / absmax; the two differ
// in the last bit now and then, and so does the code when that bit
// straddles a boundary. The test finds such values and checks Quantize's
// codes.
func TestReciprocal(t *testing.T) {
	for _, f := range formats {
		b := nf4Bounds
		if f == backend.Int8 {
			b = dynamicBounds
		}
		found := 0
		for _, a := range []float32{0.3, 0.07, 1.7, 0.011} {
			inv := 1 / a
			for _, bd := range b {
				x0 := bd * a
				for k := -64; k <= 64; k++ {
					x := x0
					for range max(k, -k) {
						if k > 0 {
							x = math.Nextafter32(x, 10)
						} else {
							x = math.Nextafter32(x, -10)
						}
					}
					want := code(b, float32(x*inv))
					if want == code(b, x/a) || math.Abs(float64(x)) > float64(a) {
						continue
					}
					found++
					q, err := Quantize(f, 1, 2, []float32{a, x})
					if err != nil {
						t.Fatal(err)
					}
					got := q.Codes[len(q.Codes)-1]
					if f == backend.NF4 {
						got &= 15
					}
					if got != want {
						t.Errorf("%v: absmax %v, x %v: code %d, want %d (x/absmax gives %d)", f, a, x, got, want, code(b, x/a))
					}
				}
			}
		}
		if found == 0 {
			t.Errorf("%v: no value found where x * (1/a) and x / a code differently", f)
		}
		t.Logf("%v: %d values where x * (1/a) and x / a code differently", f, found)
	}
}
