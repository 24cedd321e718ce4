// Package bf16 converts between float32 and bfloat16 (the upper 16 bits of an
// IEEE-754 binary32), the storage dtype of weights on the device.
//
// Limits: plain Go loops, one element at a time (the hot paths live in
// kernels and in the host package); rounding is round-to-nearest-even, the
// rounding PyTorch and CUDA's __float2bfloat16 use. Stochastic rounding
// lives with the kernels and their CPU reference (train/cpu).
package bf16

import "math"

// FromFloat32 rounds f to the nearest bfloat16, ties to even. Values beyond
// the largest finite bfloat16 round to ±Inf as IEEE rounding requires; NaN
// stays NaN (a quiet NaN with the same sign), even when its payload sits only
// in the low 16 bits that truncation would drop.
func FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep sign, force the quiet bit
		return uint16(b>>16) | 0x0040
	}
	// Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to
	// even; a carry into the exponent is the correct result (up to Inf).
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// ToFloat32 widens a bfloat16 to float32; this is exact.
func ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// FromFloat32Slice rounds every element of src into dst (ties to even).
// It converts min(len(dst), len(src)) elements and returns that count.
func FromFloat32Slice(dst []uint16, src []float32) int {
	n := min(len(dst), len(src))
	for i := range n {
		dst[i] = FromFloat32(src[i])
	}
	return n
}

// ToFloat32Slice widens every element of src into dst and returns the count,
// min(len(dst), len(src)).
func ToFloat32Slice(dst []float32, src []uint16) int {
	n := min(len(dst), len(src))
	for i := range n {
		dst[i] = ToFloat32(src[i])
	}
	return n
}
