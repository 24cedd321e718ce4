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
var NF4 = [16]float32{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
	-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
	0.07958029955625534, 0.16093020141124725, 0.24611230969429016, 0.33791524171829224,
	0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// Dynamic is bitsandbytes' signed dynamic map (create_dynamic_map with 7
// exponent bits in 8): 127 positive values spread over seven decades, as
// many negative ones, 0 and 1, in increasing order.
var Dynamic = dynamicMap()

// dynamicMap builds Dynamic in float32 arithmetic as torch does: decade
// i (0..6) holds the midpoints of linspace(0.1, 1, 2^i + 1) times
// 10^(i-6), and their negatives.
func dynamicMap() [256]float32 {
	var data []float32
	for i := 0; i < 7; i++ {
		n := 1<<i + 1
		b := linspace(0.1, 1, n)
		scale := float32(math.Pow(10, float64(i-6)))
		for j := 0; j+1 < n; j++ {
			m := (b[j] + b[j+1]) / 2
			data = append(data, scale*m, -(scale * m))
		}
	}
	data = append(data, 0, 1)
	sort.Slice(data, func(a, b int) bool { return data[a] < data[b] })
	var out [256]float32
	copy(out[:], data)
	return out
}

// linspace is torch.linspace in float32: the first half counted up from
// start, the second down from end.
func linspace(start, end float32, n int) []float32 {
	out := make([]float32, n)
	step := (end - start) / float32(n-1)
	half := n / 2
	for i := range out {
		if i < half {
			out[i] = start + step*float32(i)
		} else {
			out[i] = end - step*float32(n-1-i)
		}
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
	q := &Matrix{Format: f, Rows: rows, Cols: cols, Codes: make([]byte, f.CodeBytes(n))}
	nb := backend.QBlocks(n)
	absmax := make([]float32, nb)
	for b := range absmax {
		for _, x := range v[b*backend.QBlock : min(n, (b+1)*backend.QBlock)] {
			absmax[b] = max(absmax[b], float32(math.Abs(float64(x))))
		}
	}
	for i, x := range v {
		a := absmax[i/backend.QBlock]
		var c byte
		if f == backend.NF4 {
			c = nearest(NF4[:], scaled(x, a))
			if i%2 == 0 {
				q.Codes[i/2] = c << 4
			} else {
				q.Codes[i/2] |= c
			}
		} else {
			q.Codes[i] = nearest(Dynamic[:], scaled(x, a))
		}
	}
	q.Absmax, q.Scale = doubleQuantize(absmax)
	return q, nil
}

// scaled is x / a clamped to [-1, 1], 0 for a block of zeros.
func scaled(x, a float32) float32 {
	if a == 0 {
		return 0
	}
	return min(max(x/a, -1), 1)
}

// nearest is the index of the value of book (increasing) closest to x,
// the lower one on a tie.
func nearest(book []float32, x float32) byte {
	best, bi := float32(math.Inf(1)), 0
	for i, c := range book {
		if d := float32(math.Abs(float64(x - c))); d < best {
			best, bi = d, i
		}
	}
	return byte(bi)
}

// doubleQuantize quantizes the absmax values: centred by their mean (the
// offset, summed in float64), then each group of backend.QGroup scaled by
// its largest magnitude and coded with the dynamic map.
func doubleQuantize(absmax []float32) (codes []byte, scale []float32) {
	var sum float64
	for _, a := range absmax {
		sum += float64(a)
	}
	offset := float32(0)
	if len(absmax) > 0 {
		offset = float32(sum / float64(len(absmax)))
	}
	ng := (len(absmax) + backend.QGroup - 1) / backend.QGroup
	codes, scale = make([]byte, len(absmax)), make([]float32, ng+1)
	scale[ng] = offset
	for g := 0; g < ng; g++ {
		grp := absmax[g*backend.QGroup : min(len(absmax), (g+1)*backend.QGroup)]
		for _, a := range grp {
			scale[g] = max(scale[g], float32(math.Abs(float64(a-offset))))
		}
		for j, a := range grp {
			codes[g*backend.QGroup+j] = nearest(Dynamic[:], scaled(a-offset, scale[g]))
		}
	}
	return codes, scale
}

// BlockAbsmax is the absmax of block b decoded from its code and its
// group's scale: Book[code] * scale + offset, each op rounded in fp32.
func BlockAbsmax(book []float32, absmax []byte, scale []float32, b int) float32 {
	g := len(scale) - 1
	m := book[absmax[b]] * scale[b/backend.QGroup]
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
