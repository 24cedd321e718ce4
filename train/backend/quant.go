// Quantized frozen matrices (lora --base-dtype nf4|int8): the storage
// contract the GemmQ and Dequantize ops read. The host side (quantizing,
// the codebooks) is train/quant; docs/DESIGN.md, "Quantized base".

package backend

import "fmt"

// QFormat is how a quantized matrix's codes are read.
type QFormat uint8

// The formats. Both are bitsandbytes' blockwise formats with its double
// quantization of the absmax values (QLoRA).
const (
	// NF4 is 4-bit NormalFloat: two codes a byte, element 2i in the high
	// nibble and 2i+1 in the low one (bitsandbytes' packing); the value
	// is Book[QBookNF4+code] times the block's absmax.
	NF4 QFormat = iota + 1
	// Int8 is bitsandbytes' blockwise 8-bit quantization: one code a
	// byte, the value Book[code] (the signed dynamic map) times the
	// block's absmax.
	Int8
)

// The blocks: every QBlock elements (in storage order) share one absmax,
// and every QGroup absmax values share one fp32 scale of their double
// quantization.
const (
	QBlock = 64
	QGroup = 256
)

// The codebook (Quant.Book, F32 [QBookLen]): the 256 values of the signed
// dynamic map (Int8 codes and every absmax code), then the 16 NF4 levels.
const (
	QBookNF4 = 256
	QBookLen = QBookNF4 + 16
)

func (f QFormat) String() string {
	switch f {
	case NF4:
		return "nf4"
	case Int8:
		return "int8"
	}
	return fmt.Sprintf("QFormat(%d)", uint8(f))
}

// CodeBytes is the bytes of codes n elements take.
func (f QFormat) CodeBytes(n int) int {
	if f == NF4 {
		return (n + 1) / 2
	}
	return n
}

// Quant is a Rows x Cols matrix (row-major, as it is stored) quantized
// in blocks of QBlock elements. Block b's absmax is
//
//	Book[Absmax[b]] * Scale[b/QGroup] + Scale[groups]   (fp32, rounded after each op)
//
// and element i is its code's value times its block's absmax (fp32). An op
// that computes with the values rounds each to its operand's dtype first,
// as bitsandbytes dequantizes to the compute dtype before its matmul.
type Quant struct {
	Format     QFormat
	Rows, Cols int
	// Codes holds Format.CodeBytes(Len()) bytes in I32 words, read as
	// bytes in memory order (the backends have no byte dtype).
	Codes Tensor
	// Absmax holds one byte a block (QBlocks(Len())) in I32 words: each
	// block's absmax as a code of the dynamic map.
	Absmax Tensor
	// Scale (F32, QGroups(Len())+1) is each group's scale, then the
	// offset every absmax was centred by (their mean).
	Scale Tensor
	// Book is the codebook (F32 [QBookLen]), one tensor every Quant of a
	// model shares.
	Book Tensor
}

// Len is the number of elements.
func (q Quant) Len() int { return q.Rows * q.Cols }

// QBlocks is the number of absmax blocks of n elements.
func QBlocks(n int) int { return (n + QBlock - 1) / QBlock }

// QGroups is the number of scale groups of n elements.
func QGroups(n int) int { return (QBlocks(n) + QGroup - 1) / QGroup }

// Words is the I32 words that hold n bytes.
func Words(n int) int { return (n + 3) / 4 }

// QuantBytes is the device bytes of a quantized matrix of n elements, the
// shared codebook aside.
func QuantBytes(f QFormat, n int) int64 {
	return 4 * int64(Words(f.CodeBytes(n))+Words(QBlocks(n))+QGroups(n)+1)
}

// Check reports what is wrong with q's tensors for its shape: dtypes and
// lengths.
func (q Quant) Check() error {
	if q.Format != NF4 && q.Format != Int8 {
		return fmt.Errorf("quantized matrix: unknown format %v", q.Format)
	}
	if q.Rows < 0 || q.Cols < 0 {
		return fmt.Errorf("quantized matrix: shape %d x %d", q.Rows, q.Cols)
	}
	n := q.Len()
	for _, c := range []struct {
		name string
		t    Tensor
		dt   DType
		n    int
	}{
		{"codes", q.Codes, I32, Words(q.Format.CodeBytes(n))},
		{"absmax", q.Absmax, I32, Words(QBlocks(n))},
		{"scale", q.Scale, F32, QGroups(n) + 1},
		{"book", q.Book, F32, QBookLen},
	} {
		if c.t.DType != c.dt || c.t.Len() != c.n {
			return fmt.Errorf("quantized %v matrix %d x %d: %s is %v, want %v of %d elements", q.Format, q.Rows, q.Cols, c.name, c.t, c.dt, c.n)
		}
	}
	return nil
}
