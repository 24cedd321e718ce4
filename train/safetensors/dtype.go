// dtype.go: the element types of the safetensors format and their sizes, and
// the IEEE half-precision (F16) to float32 widening used by File.Float32.
//
// Limits: sub-byte types (F4, F6_*) are known for validation (a tensor's
// bit count must be a whole number of bytes) but have no conversions.

package safetensors

import "math"

// DType is a safetensors element type, spelled as in the header ("F32", "BF16", ...).
type DType string

// The element types of the format.
const (
	Bool    DType = "BOOL"
	U8      DType = "U8"
	I8      DType = "I8"
	F8E5M2  DType = "F8_E5M2"
	F8E4M3  DType = "F8_E4M3"
	F8E8M0  DType = "F8_E8M0"
	F4      DType = "F4"
	F6E2M3  DType = "F6_E2M3"
	F6E3M2  DType = "F6_E3M2"
	I16     DType = "I16"
	U16     DType = "U16"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I32     DType = "I32"
	U32     DType = "U32"
	F32     DType = "F32"
	F64     DType = "F64"
	C64     DType = "C64"
	I64     DType = "I64"
	U64     DType = "U64"
	metaKey       = "__metadata__"
)

var dtypeBits = map[DType]int64{
	Bool: 8, U8: 8, I8: 8, F8E5M2: 8, F8E4M3: 8, F8E8M0: 8,
	F4: 4, F6E2M3: 6, F6E3M2: 6,
	I16: 16, U16: 16, F16: 16, BF16: 16,
	I32: 32, U32: 32, F32: 32,
	F64: 64, C64: 64, I64: 64, U64: 64,
}

// Bits returns the size of one element in bits and whether the dtype is known.
func (d DType) Bits() (int, bool) {
	b, ok := dtypeBits[d]
	return int(b), ok
}

// f16ToFloat32 widens an IEEE-754 binary16 to float32 exactly, including
// subnormals, infinities and NaN (payload kept).
func f16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0: // normal: rebias 15 -> 127
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	default: // subnormal: man * 2^-24, exact in float32
		v := float32(man) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(v))
	}
}

// F16ToFloat32 widens an IEEE-754 binary16 (raw bits) to float32 exactly.
func F16ToFloat32(h uint16) float32 { return f16ToFloat32(h) }
