// CPU reference for stochastic rounding to bf16 (kernels/cast.cu,
// kernels/sparse.cu apply): the counter-based generator whose random bits
// key on (seed, step, matrix, element), shared bit for bit with the CUDA
// kernels (kernels/rounding.cuh), so LSP weight updates are reproducible
// and do not depend on thread counts or launch shapes.
//
// Generator: the 64-bit finalizer of SplitMix64 (Stafford's "Mix13"), a
// bijection with full avalanche, chained over the key words:
//
//	k = mix(seed + G); k = mix(k ^ (step + G)); k = mix(k ^ (matrix + G))
//	h = mix(k ^ mix(elem + G))            (G = 0x9e3779b97f4a7c15)
//
// and the rounding uses the top 16 bits of h. For a fixed key distinct
// elements get distinct h; the inner mix of elem keeps two keys from giving
// shifted copies of one stream.
//
// Rounding: the 16 random bits u are added to the low half of the binary32
// pattern and the low half is dropped, so |x| rounds up to the next bf16
// magnitude with probability (low 16 bits)/65536: E[result] = x exactly.
// NaN becomes a quiet NaN of the same sign (as bf16.FromFloat32); ±Inf stay;
// finite values above the largest finite bf16 may round to Inf with the
// probability their distance to it implies.

package cpu

import (
	"math"

	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// srGamma is the SplitMix64 increment (2^64 / golden ratio, odd).
const srGamma = 0x9e3779b97f4a7c15

// srMix is the SplitMix64 finalizer (Mix13).
func srMix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// SRKey derives the generator key of one (seed, step, matrix); kernels
// compute it once per launch and SRBits once per element.
func SRKey(seed, step uint64, matrix uint32) uint64 {
	k := srMix(seed + srGamma)
	k = srMix(k ^ (step + srGamma))
	return srMix(k ^ (uint64(matrix) + srGamma))
}

// SRBits returns the 16 rounding bits of element elem under key.
func SRBits(key, elem uint64) uint32 {
	return uint32(srMix(key^srMix(elem+srGamma)) >> 48)
}

// RoundBF16Bits rounds x to bf16 by adding the 16 random bits u (< 65536)
// to its low half and truncating; see the file comment.
func RoundBF16Bits(x float32, u uint32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 {
		return bf16.FromFloat32(x) // NaN: quiet, sign kept
	}
	return uint16((b + u&0xffff) >> 16)
}

// StochasticRoundBF16 rounds x to bf16 with the rounding bits of element
// elem of matrix at step under seed.
func StochasticRoundBF16(x float32, seed, step uint64, matrix uint32, elem uint64) uint16 {
	return RoundBF16Bits(x, SRBits(SRKey(seed, step, matrix), elem))
}

// StochasticRoundBF16Slice is the reference of lsp_stochastic_round_bf16:
// dst[i] = StochasticRoundBF16(src[i], seed, step, matrix, i) for i below
// min(len(dst), len(src)), which it returns.
func StochasticRoundBF16Slice(dst []uint16, src []float32, seed, step uint64, matrix uint32) int {
	n := min(len(dst), len(src))
	key := SRKey(seed, step, matrix)
	for i := range n {
		dst[i] = RoundBF16Bits(src[i], SRBits(key, uint64(i)))
	}
	return n
}
