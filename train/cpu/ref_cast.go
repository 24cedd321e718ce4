// CPU references for kernels/cast.cu, with the launchers' names and
// argument order:
//
//	lsp_cast_f32_to_bf16       CastF32ToBF16: round to nearest even
//	lsp_cast_bf16_to_f32       CastBF16ToF32: exact
//	lsp_stochastic_round_bf16  StochasticRoundBF16Slice
//	lsp_sum_squares            SumSquares
//
// The casts are package bf16's, which the backend's CopyD2D uses between
// fp32 and bf16 (the kernels match them bit for bit, NaN included).
//
// Stochastic rounding to bf16 (also lsp_sparse_apply's, kernels/sparse.cu)
// uses a counter-based generator whose random bits key on (seed, step,
// matrix, element), shared bit for bit with the CUDA kernels
// (kernels/rounding.cuh), so LSP weight updates are reproducible and do
// not depend on thread counts or launch shapes.
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
//
// The sum of squares (the gradient norm's) is summed in double in fixed
// chunks of 2^14 elements, each chunk in host's canonical order
// (host.SumSquaresChunks, the pre-scan kernel of host/adam.c: SIMD for
// speed, 16 lanes by index added by a fixed tree, the same bits on every
// path), then the chunks in order, and rounded once to fp32. The op sums
// the chunks on several threads; the bits do not change. The kernel sums
// in double in another fixed order, so it agrees to far below the fp32
// rounding, not bit for bit.

package cpu

import (
	"math"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// CastF32ToBF16 is the reference of lsp_cast_f32_to_bf16: out[i] = in[i]
// rounded to nearest even, for i below min(len(out), len(in)), which it
// returns.
func CastF32ToBF16(out []uint16, in []float32) int { return bf16.FromFloat32Slice(out, in) }

// CastBF16ToF32 is the reference of lsp_cast_bf16_to_f32: out[i] = in[i]
// exactly, for i below min(len(out), len(in)), which it returns.
func CastBF16ToF32(out []float32, in []uint16) int { return bf16.ToFloat32Slice(out, in) }

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

// sumSquaresChunk is the fixed chunk of the sum of squares: the chunks'
// sums are added in order, whatever the threads.
const sumSquaresChunk = 1 << 14

// SumSquares is the reference of lsp_sum_squares: out[0] = the sum of
// x[i]^2 in double, rounded once to fp32.
func SumSquares(out, x []float32) { out[0] = float32(sumSquares(x, serial)) }

// sumSquares sums x's squares in chunks, each in double on host's kernel,
// then the chunks in order; run runs the chunk loop, on one goroutine
// (serial) or split over threads (the op's parallel): the same bits.
func sumSquares(x []float32, run func(n, grain int, fn func(lo, hi int))) float64 {
	const chunk = sumSquaresChunk
	parts := make([]float64, (len(x)+chunk-1)/chunk)
	run(len(parts), 1, func(lo, hi int) {
		// The lengths always match, so host has nothing to refuse.
		_ = host.SumSquaresChunks(x[lo*chunk:min(hi*chunk, len(x))], chunk, parts[lo:hi])
	})
	var s float64
	for _, p := range parts {
		s += p
	}
	return s
}
