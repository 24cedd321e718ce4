// Pure fp32 math behind the CPU ops: the reference each CUDA kernel is
// compared with. Shapes use llm.c's names (B, T, C, NH, HS = C/NH, V).
// Every reduction runs in a fixed order, so results do not depend on how
// the parallel loops are split. AdamW, attention, gelu, cross-entropy and
// the sum of squares run in package host's SIMD C (host.AdamWPlain,
// AttentionForward/Backward, GeluForward/Backward, CrossEntropy,
// SumSquaresChunks), which keeps these rules.

package cpu

import (
	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// attention is the shape of one attention op: NH query heads in groups of
// NH/KVH sharing a key/value head, HS each, q, k and v found by x.
type attention struct {
	B, T, NH, KVH, HS int
	x                 backend.QKVIndex
}

// host is a as package host's kernels take it.
func (a attention) host() host.AttentionShape {
	return host.AttentionShape{B: a.B, T: a.T, NH: a.NH, KVH: a.KVH, HS: a.HS,
		QBase: a.x.QBase, KBase: a.x.KBase, VBase: a.x.VBase, QRow: a.x.QRow, KVRow: a.x.KVRow}
}

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
