package quant

// The quantizer against bitsandbytes: testdata/bnb_quant.json.gz, written
// by scripts/fixtures/bnb_quant.py (bitsandbytes and torch versions in
// testdata/bnb_quant.json). "exact" there is bitsandbytes' default torch
// kernels (the nearest code, as its CUDA kernels pick it), the semantics
// this package follows; "cpu" is its CPU C kernel for 8-bit blockwise
// quantization, which looks codes up in a 65536-point table and so now and
// then picks a neighbour of the nearest code (cpuLUT emulates it).

import (
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

type bnbNested struct {
	Absmax []byte   `json:"absmax"`
	Scale  []uint32 `json:"scale"`
	Offset uint32   `json:"offset"`
}

type bnbFormat struct {
	Codes        []byte    `json:"codes"`
	CodesCPUDiff [][2]int  `json:"codes_cpu_diff"` // int8 only
	AbsmaxF32    []byte    `json:"absmax_f32"`
	Exact        bnbNested `json:"exact"`
	CPU          bnbNested `json:"cpu"`
	DeqF32       []byte    `json:"deq_f32"`
	DeqBF16      []byte    `json:"deq_bf16"`
	Nested64     *struct {
		Exact bnbNested `json:"exact"`
		CPU   bnbNested `json:"cpu"`
	} `json:"nested64"` // int8 only
}

type bnbMatrix struct {
	Name  string    `json:"name"`
	Rows  int       `json:"rows"`
	Cols  int       `json:"cols"`
	Input []byte    `json:"input"`
	NF4   bnbFormat `json:"nf4"`
	Int8  bnbFormat `json:"int8"`
}

type bnbFixture struct {
	Dynamic       []uint32    `json:"dynamic"`
	NF4           []uint32    `json:"nf4"`
	NF4Bounds     []uint32    `json:"nf4_bounds"`
	DynamicBounds []uint32    `json:"dynamic_bounds"`
	Matrices      []bnbMatrix `json:"matrices"`
}

func loadBNB(t *testing.T) *bnbFixture {
	t.Helper()
	f, err := os.Open("testdata/bnb_quant.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var fx bnbFixture
	if err := json.NewDecoder(z).Decode(&fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Matrices) == 0 {
		t.Fatal("fixture has no matrices")
	}
	return &fx
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func u16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

func fromBits(u []uint32) []float32 {
	out := make([]float32, len(u))
	for i, x := range u {
		out[i] = math.Float32frombits(x)
	}
	return out
}

// sameBits reports the first index where a and b differ bit for bit, or -1.
func sameBits(a, b []float32) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

func TestBNBTables(t *testing.T) {
	fx := loadBNB(t)
	for _, c := range []struct {
		name      string
		got, want []float32
	}{
		{"Dynamic", Dynamic[:], fromBits(fx.Dynamic)},
		{"NF4", NF4[:], fromBits(fx.NF4)},
		{"NF4 boundaries", nf4Bounds, fromBits(fx.NF4Bounds)},
		{"Dynamic boundaries", dynamicBounds, fromBits(fx.DynamicBounds)},
	} {
		if i := sameBits(c.got, c.want); i >= 0 {
			t.Errorf("%s differs from bitsandbytes' at %d: %v (%#x), want %v (%#x)", c.name, i,
				c.got[i], math.Float32bits(c.got[i]), c.want[i], math.Float32bits(c.want[i]))
		}
	}
}

// TestNF4CUDATree compares bitsandbytes' CUDA NF4 quantizer
// (dQuantizeNF4 in csrc/kernels.cu, commit 95f9af3 of
// bitsandbytes-foundation/bitsandbytes: a decision tree of `x > t` with
// these float literals, the double midpoints of the levels) with the
// float32 midpoints torch.bucketize compares against in its default kernel
// and this package. 11 of the 15 are the same float32; boundaries 0, 8, 12
// and 14 are 1 ulp apart, so for exactly one float32 scaled value at each
// of those the CUDA kernel picks the other neighbour. The test pins that.
func TestNF4CUDATree(t *testing.T) {
	cuda := []float32{
		-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
		-0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
		0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
		0.5016634166240692, 0.6427869200706482, 0.8614784181118011,
	}
	var differ []int
	for i, c := range cuda {
		if c == nf4Bounds[i] {
			continue
		}
		differ = append(differ, i)
		if d := int64(math.Float32bits(c)) - int64(math.Float32bits(nf4Bounds[i])); d != 1 && d != -1 {
			t.Errorf("boundary %d: CUDA %v (%#x), here %v (%#x): %d ulps", i, c, math.Float32bits(c), nf4Bounds[i], math.Float32bits(nf4Bounds[i]), d)
		}
		// The larger of the two is the one value coded differently (x > t
		// against the number of boundaries below x).
		lo, hi := min(c, nf4Bounds[i]), max(c, nf4Bounds[i])
		cudaCode := func(x float32) byte {
			n := 0
			for _, t := range cuda {
				if x > t {
					n++
				}
			}
			return byte(n)
		}
		for _, x := range []float32{math.Nextafter32(lo, -2), lo, hi, math.Nextafter32(hi, 2)} {
			agree := cudaCode(x) == code(nf4Bounds, x)
			if between := x == hi; agree == between {
				t.Errorf("boundary %d, x = %v: CUDA code %d, here %d", i, x, cudaCode(x), code(nf4Bounds, x))
			}
		}
	}
	if fmt.Sprint(differ) != "[0 8 12 14]" {
		t.Errorf("boundaries %v differ from CUDA's, want [0 8 12 14]", differ)
	}
}

// cpuLUT emulates bitsandbytes' CPU 8-bit quantizer (csrc/cpu_ops.cpp,
// build_quantize_lut and quantize_cpu_impl): a table of the code at 65536
// grid points of [-1, 1], indexed by the scaled value rounded to the grid
// (the rounding one FMA, as GCC contracts it under -mfma); a block of
// zeros gets code 0.
func cpuLUT(book []float32) func(v, absmax []float32, size int) []byte {
	const n = 65536
	mid := bounds(book)
	lut := make([]byte, n)
	c := 0
	for i := range lut {
		val := -1 + float32(2*float32(i))/(n-1)
		for c < len(mid) && mid[c] < val {
			c++
		}
		lut[i] = byte(c)
	}
	return func(v, absmax []float32, size int) []byte {
		codes := make([]byte, len(v))
		for b := range absmax {
			blk := v[b*size : min(len(v), (b+1)*size)]
			a := absMax(blk)
			absmax[b] = a
			if a == 0 {
				continue
			}
			inv := 1 / a
			for j, x := range blk {
				s := min(max(float32(x*inv), -1), 1)
				t := float32(s+1) * 0.5
				codes[b*size+j] = lut[uint16(float32(float64(t)*(n-1)+0.5))]
			}
		}
		return codes
	}
}

// checkNested compares a nesting about bitsandbytes' own offset with its
// codes and scales, bit for bit, for both of its kernels.
func checkNested(t *testing.T, what string, absmax []float32, group int, exact, cpu bnbNested) {
	t.Helper()
	off := math.Float32frombits(exact.Offset)
	codes, scale := nest(absmax, off, group)
	if string(codes) != string(exact.Absmax) {
		t.Errorf("%s: %d of %d absmax codes differ from bitsandbytes'", what, countDiff(codes, exact.Absmax), len(codes))
	}
	if i := sameBits(scale[:len(scale)-1], fromBits(exact.Scale)); i >= 0 {
		t.Errorf("%s: group %d scale %v, bitsandbytes %v", what, i, scale[i], fromBits(exact.Scale)[i])
	}
	if math.Float32bits(scale[len(scale)-1]) != exact.Offset {
		t.Errorf("%s: offset %v, want %v", what, scale[len(scale)-1], off)
	}
	// Its CPU kernel, about its (public API's) offset.
	coff := math.Float32frombits(cpu.Offset)
	centred := make([]float32, len(absmax))
	for i, a := range absmax {
		centred[i] = a - coff
	}
	cscale := make([]float32, (len(absmax)+group-1)/group)
	ccodes := cpuLUT(Dynamic[:])(centred, cscale, group)
	if string(ccodes) != string(cpu.Absmax) {
		t.Errorf("%s: the CPU kernel's emulation differs from bitsandbytes' CPU kernel in %d of %d absmax codes", what, countDiff(ccodes, cpu.Absmax), len(ccodes))
	}
	if i := sameBits(cscale, fromBits(cpu.Scale)); i >= 0 {
		t.Errorf("%s: CPU kernel's group %d scale %v, bitsandbytes %v", what, i, cscale[i], fromBits(cpu.Scale)[i])
	}
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n + max(len(a), len(b)) - min(len(a), len(b))
}

// TestBNBFixture quantizes each fixture matrix and compares with
// bitsandbytes. The block absmax values, the codes, the nested absmax
// codes and scales (about bitsandbytes' offset) and the dequantized values
// must match bit for bit. The offset (the mean of the absmax values) is
// summed in float64 here and in float32 by torch in an order that depends
// on the CPU's vector width, so it may differ by 1 ulp; Quantize's own
// absmax codes may then differ where a centred value sits at a code
// boundary: at most 1 in 256 is allowed (none in the committed fixture),
// and each decoded absmax within 1 ulp of the offset plus a code step.
func TestBNBFixture(t *testing.T) {
	fx := loadBNB(t)
	book := Book()
	for _, m := range fx.Matrices {
		v := f32s(m.Input)
		n := m.Rows * m.Cols
		if len(v) != n {
			t.Fatalf("%s: %d inputs for %d x %d", m.Name, len(v), m.Rows, m.Cols)
		}
		for _, c := range []struct {
			f   backend.QFormat
			bnb bnbFormat
		}{{backend.NF4, m.NF4}, {backend.Int8, m.Int8}} {
			name := m.Name + "/" + c.f.String()
			t.Run(name, func(t *testing.T) {
				bnb := c.bnb
				q, err := Quantize(c.f, m.Rows, m.Cols, v)
				if err != nil {
					t.Fatal(err)
				}
				// The block absmax values.
				bm := f32s(bnb.AbsmaxF32)
				absmax := make([]float32, backend.QBlocks(n))
				bounds := dynamicBounds
				if c.f == backend.NF4 {
					bounds = nf4Bounds
				}
				blockwise(v, absmax, backend.QBlock, bounds)
				if i := sameBits(absmax, bm); i >= 0 {
					t.Fatalf("block %d absmax %v, bitsandbytes %v", i, absmax[i], bm[i])
				}
				// The codes.
				if d := countDiff(q.Codes, bnb.Codes); d != 0 {
					for i := range q.Codes {
						if q.Codes[i] != bnb.Codes[i] {
							t.Errorf("code byte %d (block %d): %#02x, bitsandbytes %#02x", i, i*len(v)/len(q.Codes)/backend.QBlock, q.Codes[i], bnb.Codes[i])
							break
						}
					}
					t.Errorf("%d of %d code bytes differ from bitsandbytes'", d, len(q.Codes))
				}
				// The nesting about bitsandbytes' offset: its algorithm.
				checkNested(t, "groups of 256", bm, backend.QGroup, bnb.Exact, bnb.CPU)
				if bnb.Nested64 != nil {
					checkNested(t, "nested=True (groups of 64)", bm, backend.QBlock, bnb.Nested64.Exact, bnb.Nested64.CPU)
				}
				// Quantize's own nesting: its offset within 1 ulp of torch's mean.
				off := q.Scale[len(q.Scale)-1]
				boff := math.Float32frombits(bnb.Exact.Offset)
				if ulps := int64(math.Float32bits(off)) - int64(bnb.Exact.Offset); ulps < -1 || ulps > 1 {
					t.Errorf("offset %v, bitsandbytes %v: %d ulps apart", off, boff, ulps)
				} else if ulps != 0 {
					t.Logf("offset %v, bitsandbytes %v: %d ulp apart", off, boff, ulps)
				}
				if d := countDiff(q.Absmax, bnb.Exact.Absmax); d > len(q.Absmax)/256 {
					t.Errorf("%d of %d absmax codes differ from bitsandbytes'", d, len(q.Absmax))
				} else if d > 0 {
					t.Logf("%d of %d absmax codes differ from bitsandbytes' (offset %d ulp apart)", d, len(q.Absmax), int64(math.Float32bits(off))-int64(bnb.Exact.Offset))
				}
				bscale := append(fromBits(bnb.Exact.Scale), boff)
				if len(q.Scale) != len(bscale) {
					t.Fatalf("%d scales, bitsandbytes %d", len(q.Scale), len(bscale))
				}
				for g := range q.Scale {
					if d := math.Abs(float64(q.Scale[g] - bscale[g])); d > 2*ulp(bscale[g]) {
						t.Errorf("scale %d: %v, bitsandbytes %v", g, q.Scale[g], bscale[g])
					}
				}
				// Decoding bitsandbytes' own codes gives its dequantized
				// values bit for bit, and at every offset.
				want := f32s(bnb.DeqF32)
				got := make([]float32, n)
				Decode(c.f, book, bnb.Codes, bnb.Exact.Absmax, bscale, 0, got)
				if i := sameBits(got, want); i >= 0 {
					t.Errorf("Decode of bitsandbytes' codes: element %d is %v, bitsandbytes %v", i, got[i], want[i])
				}
				if bnb.DeqBF16 != nil {
					wb := u16s(bnb.DeqBF16)
					for i := range got {
						if h := bf16.FromFloat32(got[i]); h != wb[i] {
							t.Errorf("bf16 of element %d: %#04x, bitsandbytes %#04x", i, h, wb[i])
							break
						}
					}
				}
				// Dequantize (Quantize's own codes) equals bitsandbytes'
				// values when the offsets agree; else the decoded absmax
				// â = m + offset may differ by the offset's ulp and its
				// two roundings (an ulp of â), times a level of at most
				// 1, plus the products' roundings: within ulp(offset) +
				// ulp(â) + ulp(value). (â can be far smaller than the
				// offset, where m nearly cancels it: m64x64's block 1.)
				deq := make([]float32, n)
				if err := q.Dequantize(0, deq); err != nil {
					t.Fatal(err)
				}
				if math.Float32bits(off) == bnb.Exact.Offset && countDiff(q.Absmax, bnb.Exact.Absmax) == 0 {
					if i := sameBits(deq, want); i >= 0 {
						t.Errorf("Dequantize: element %d is %v, bitsandbytes %v", i, deq[i], want[i])
					}
				} else {
					differ, worst := 0, 0.0
					for i := range deq {
						a := float64(BlockAbsmax(book, bnb.Exact.Absmax, bscale, i/backend.QBlock))
						d := math.Abs(float64(deq[i] - want[i]))
						if d > ulp(boff)+ulp(float32(a))+ulp(want[i]) {
							t.Errorf("Dequantize: element %d is %v, bitsandbytes %v", i, deq[i], want[i])
							break
						}
						if d != 0 {
							differ++
							worst = max(worst, d)
						}
					}
					t.Logf("Dequantize: %d of %d values differ from bitsandbytes', by at most %g (the offset's ulp is %g)", differ, n, worst, ulp(boff))
				}
				// The 8-bit CPU kernel: bitsandbytes' "exact" codes with its
				// recorded differences equal the emulation of its LUT.
				if c.f == backend.Int8 {
					cpu := append([]byte(nil), bnb.Codes...)
					for _, d := range bnb.CodesCPUDiff {
						cpu[d[0]] = byte(d[1])
					}
					emu := cpuLUT(Dynamic[:])(v, make([]float32, backend.QBlocks(n)), backend.QBlock)
					if d := countDiff(emu, cpu); d != 0 {
						t.Errorf("the CPU kernel's emulation differs from bitsandbytes' CPU kernel in %d of %d codes", d, n)
					}
					t.Logf("bitsandbytes' CPU kernel picks another code than the nearest for %d of %d elements", len(bnb.CodesCPUDiff), n)
				}
			})
		}
	}
}

// ulp is the gap from |x| to the next float32 up.
func ulp(x float32) float64 {
	a := float32(math.Abs(float64(x)))
	return float64(math.Nextafter32(a, float32(math.Inf(1))) - a)
}
