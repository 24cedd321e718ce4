// Package quant quantizes frozen matrices on the host as bitsandbytes
// does for QLoRA (lora --base-dtype nf4|int8): blockwise absmax scaling
// (backend.QBlock elements a block), codes read through a codebook (the 16
// NF4 levels, or the signed dynamic map of its 8-bit blockwise format),
// and the absmax values themselves quantized (double quantization: centred
// by their mean, then 8-bit dynamic codes with one fp32 scale per
// backend.QGroup of them). The device keeps the codes (backend.Quant);
// this package makes them and is the reference the ops' dequantization is
// checked against. docs/DESIGN.md, "Quantized base".
package quant

import (
	"fmt"
	"math"
	"sort"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// NF4 is the 16 levels of 4-bit NormalFloat (Dettmers et al., 2023): the
// quantiles of a standard normal scaled to [-1, 1], with an exact zero.
// The decimals are bitsandbytes' own, copied from get_4bit_type("nf4") in
// bitsandbytes/functional.py (0.50.2; the same literals as nf4_lut in its
// csrc/cpu_ops.cpp and its CUDA nf4 table), so that each rounds to the
// float32 bitsandbytes uses; TestBNBTables checks them bit for bit against
// train/quant/testdata (scripts/fixtures/bnb_quant.py). An earlier copy
// had 0.24611230969429016 for level 10, one ulp (0x3e7c04de) above
// bitsandbytes' 0x3e7c04dd.
var NF4 = [16]float32{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
	-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
	0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
	0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// The code boundaries: bound[i] is the float32 midpoint (t[i] + t[i+1]) / 2
// of neighbouring levels, as bitsandbytes computes them for torch.bucketize
// (its "default" kernels); a scaled value s gets the number of boundaries
// below it, the lower code when s is a midpoint. bitsandbytes' CUDA 8-bit
// search (dQuantize) compares against (t[i] + t[i+1]) * 0.5f, the same
// values (it breaks an exact tie either way). Its CUDA NF4 decision tree
// (dQuantizeNF4) compares against the double midpoints rounded to float32:
// 4 of its 15 thresholds are 1 ulp from these, so it codes the one float32
// value between them differently (TestNF4CUDATree).
var (
	nf4Bounds     = bounds(NF4[:])
	dynamicBounds = bounds(Dynamic[:])
)

func bounds(book []float32) []float32 {
	b := make([]float32, len(book)-1)
	for i := range b {
		b[i] = float32(book[i]+book[i+1]) / 2
	}
	return b
}

// Dynamic is bitsandbytes' signed dynamic map (create_dynamic_map with 7
// exponent bits in 8): 127 positive values spread over seven decades, as
// many negative ones, 0 and 1, in increasing order. Decade i (0..6) holds
// the float32 midpoints of torch.linspace(0.1, 1, 2^i + 1) times 10^(i-6),
// and their negatives.
//
// The values are bitsandbytes' own float32 bits (create_dynamic_map() of
// bitsandbytes 0.50.2 with torch 2.15.0 on an x86-64 CPU, recorded by
// scripts/fixtures/bnb_quant.py; TestBNBTables checks them against
// train/quant/testdata). They are not computed here: torch.linspace on
// the CPU is vectorized and rounds differently from the scalar formula
// start + step*i (end - step*(n-1-i) in the upper half), and 42 of the 256
// values computed that way in float32 were 1 or 2 ulps off.
var Dynamic = dynamicFromBits()

var dynamicBits = [256]uint32{
	0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
	0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
	0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
	0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
	0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
	0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
	0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
	0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
	0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
	0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
	0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
	0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
	0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
	0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
	0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
	0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x000000,
	0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
	0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
	0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
	0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
	0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
	0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
	0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
	0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
	0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
	0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
	0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
	0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
	0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
	0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
	0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
	0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
}

func dynamicFromBits() [256]float32 {
	var out [256]float32
	for i, b := range dynamicBits {
		out[i] = math.Float32frombits(b)
	}
	return out
}

// Book is the codebook the device reads (backend.Quant.Book): Dynamic,
// then the NF4 levels.
func Book() []float32 {
	b := make([]float32, backend.QBookLen)
	copy(b, Dynamic[:])
	copy(b[backend.QBookNF4:], NF4[:])
	return b
}

// Matrix is a quantized matrix on the host, in the layout the device
// keeps (backend.Quant): the codes' bytes, one absmax code a block, and
// the groups' scales followed by the offset.
type Matrix struct {
	Format     backend.QFormat
	Rows, Cols int
	Codes      []byte
	Absmax     []byte
	Scale      []float32
}

// Len is the number of elements.
func (q *Matrix) Len() int { return q.Rows * q.Cols }

// Quantize quantizes v, a rows x cols matrix in storage order. Values
// that are not finite are refused: they have no code.
func Quantize(f backend.QFormat, rows, cols int, v []float32) (*Matrix, error) {
	if f != backend.NF4 && f != backend.Int8 {
		return nil, fmt.Errorf("quant: unknown format %v", f)
	}
	n := rows * cols
	if rows < 0 || cols < 0 || len(v) != n {
		return nil, fmt.Errorf("quant: %d values for a %d x %d matrix", len(v), rows, cols)
	}
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("quant: element %d (row %d, column %d) is %v", i, i/max(cols, 1), i%max(cols, 1), x)
		}
	}
	q := &Matrix{Format: f, Rows: rows, Cols: cols}
	absmax := make([]float32, backend.QBlocks(n))
	if f == backend.NF4 {
		c := blockwise(v, absmax, backend.QBlock, nf4Bounds)
		if len(c)%2 == 1 {
			// The missing last element pads as 0.0 does (bitsandbytes
			// pads the scaled values with a zero before packing).
			c = append(c, code(nf4Bounds, 0))
		}
		q.Codes = make([]byte, len(c)/2)
		for i := range q.Codes {
			q.Codes[i] = c[2*i]<<4 | c[2*i+1]
		}
	} else {
		q.Codes = blockwise(v, absmax, backend.QBlock, dynamicBounds)
	}
	q.Absmax, q.Scale = doubleQuantize(absmax, backend.QGroup)
	return q, nil
}

// minAbsmax is the least absmax bitsandbytes scales by
// (absmax.clamp(min=1e-38) in its default kernels): a block of zeros is
// scaled by 1e38 and gets the code of 0.0, where 1/0 would make 0 * Inf a
// NaN.
const minAbsmax = float32(1e-38)

// blockwise quantizes v in blocks of size elements as bitsandbytes'
// blockwise kernels do: absmax[b] is the largest |x| of block b (stored as
// is), and each x gets code(bounds, x * (1/absmax)), the reciprocal and the
// product each rounded to float32 (kQuantizeBlockwise's local_abs_max;
// bitsandbytes' default torch kernel divides instead in a ragged last
// block, which can differ in the last bit; TestBNBFixture counts that).
func blockwise(v, absmax []float32, size int, bounds []float32) []byte {
	codes := make([]byte, len(v))
	for b := range absmax {
		blk := v[b*size : min(len(v), (b+1)*size)]
		a := absMax(blk)
		absmax[b] = a
		inv := 1 / max(a, minAbsmax)
		for j, x := range blk {
			codes[b*size+j] = code(bounds, float32(x*inv))
		}
	}
	return codes
}

// absMax is the largest |x| of blk, 0 when it is empty: a block's scale.
func absMax(blk []float32) float32 {
	a := float32(0)
	for _, x := range blk {
		a = max(a, float32(math.Abs(float64(x))))
	}
	return a
}

// code is the code of the scaled value s: clamped to [-1, 1], the number
// of boundaries below it (torch.bucketize(s, bounds, right=False)), so the
// nearest level with ties to the lower one.
func code(bounds []float32, s float32) byte {
	s = min(max(s, -1), 1)
	return byte(sort.Search(len(bounds), func(i int) bool { return bounds[i] >= s }))
}

// doubleQuantize quantizes the absmax values as bitsandbytes'
// quantize_4bit(compress_statistics=True) does: centred by their mean
// (the offset), then blockwise (see blockwise) in groups of group values
// with the dynamic map, each group's scale its largest |absmax - offset|.
// scale holds the groups' scales, then the offset. The mean is summed in
// float64 and rounded once, where torch sums in float32 in an order that
// depends on the CPU's vector width; the two can differ in the last bit
// (TestBNBFixture allows that much).
func doubleQuantize(absmax []float32, group int) (codes []byte, scale []float32) {
	var sum float64
	for _, a := range absmax {
		sum += float64(a)
	}
	offset := float32(0)
	if len(absmax) > 0 {
		offset = float32(sum / float64(len(absmax)))
	}
	return nest(absmax, offset, group)
}

// nest is doubleQuantize about a given offset.
func nest(absmax []float32, offset float32, group int) (codes []byte, scale []float32) {
	centred := make([]float32, len(absmax))
	for i, a := range absmax {
		centred[i] = a - offset
	}
	ng := (len(absmax) + group - 1) / group
	scale = make([]float32, ng+1)
	codes = blockwise(centred, scale[:ng], group, dynamicBounds)
	scale[ng] = offset
	return codes, scale
}

// BlockAbsmax is the absmax of block b decoded from its code and its
// group's scale: Book[code] * scale + offset, each op rounded in fp32 (the
// conversion keeps the compiler from fusing them into one FMA, which the
// Go spec allows and arm64 does).
func BlockAbsmax(book []float32, absmax []byte, scale []float32, b int) float32 {
	g := len(scale) - 1
	m := float32(book[absmax[b]] * scale[b/backend.QGroup])
	return m + scale[g]
}

// Decode writes elements off..off+len(dst) of a quantized matrix of
// format f to dst: the value of each code times its block's absmax
// (BlockAbsmax), in fp32. It is the reference of the device's
// dequantization (backend GemmQ and Dequantize).
func Decode(f backend.QFormat, book []float32, codes, absmax []byte, scale []float32, off int, dst []float32) {
	b, a := -1, float32(0)
	for j := range dst {
		i := off + j
		if i/backend.QBlock != b {
			b = i / backend.QBlock
			a = BlockAbsmax(book, absmax, scale, b)
		}
		var v float32
		if f == backend.NF4 {
			c := codes[i/2]
			if i%2 == 0 {
				c >>= 4
			}
			v = book[backend.QBookNF4+int(c&15)]
		} else {
			v = book[codes[i]]
		}
		dst[j] = v * a
	}
}

// Dequantize writes elements off..off+len(dst) of q to dst (Decode).
func (q *Matrix) Dequantize(off int, dst []float32) error {
	if off < 0 || off+len(dst) > q.Len() {
		return fmt.Errorf("quant: elements [%d, %d) of a %d x %d matrix", off, off+len(dst), q.Rows, q.Cols)
	}
	Decode(q.Format, Book(), q.Codes, q.Absmax, q.Scale, off, dst)
	return nil
}
