// Pure fp32 math behind the CPU ops: the reference each CUDA kernel is
// compared with. Shapes use llm.c's names (B, T, C, NH, HS = C/NH, V).
// Every reduction runs in a fixed order, so results do not depend on how
// the parallel loops are split. AdamW, attention, gelu, cross-entropy and
// the sum of squares run in package host's SIMD C (host.AdamWPlain,
// AttentionForward/Backward, GeluForward/Backward, CrossEntropy,
// SumSquaresChunks), which keeps these rules.

package cpu

import "github.com/lsp-offload/lsp-offload/host"

// sumSquares sums in fixed chunks, each in float64 (host.SumSquaresChunks),
// then the chunks in order: the same bits for any thread count.
func (b *Backend) sumSquares(x []float32) float64 {
	const chunk = 1 << 14
	parts := make([]float64, (len(x)+chunk-1)/chunk)
	b.parallel(len(parts), 1, func(lo, hi int) {
		// Each chunk in the host pre-scan's canonical order (SIMD, the
		// same bits on every path); the lengths always match.
		_ = host.SumSquaresChunks(x[lo*chunk:min(hi*chunk, len(x))], chunk, parts[lo:hi])
	})
	var s float64
	for _, p := range parts {
		s += p
	}
	return s
}
