// Pure fp32 math behind the CPU ops: the reference each CUDA kernel is
// compared with. Shapes use llm.c's names (B, T, C, NH, HS = C/NH, V).
// Every reduction runs in a fixed order, so results do not depend on how
// the parallel loops are split. AdamW, attention, gelu, cross-entropy and
// the sum of squares run in package host's SIMD C (host.AdamWPlain,
// AttentionForward/Backward, GeluForward/Backward, CrossEntropy,
// SumSquaresChunks), which keeps these rules.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

func encoderForward(out []float32, inp []int32, wte, wpe []float32, B, T, C, V int) error {
	for bt := 0; bt < B*T; bt++ {
		tok, t := int(inp[bt]), bt%T
		if tok < 0 || tok >= V {
			return fmt.Errorf("token id %d at position %d outside vocabulary of %d", tok, bt, V)
		}
		o, w := out[bt*C:(bt+1)*C], wte[tok*C:(tok+1)*C]
		if wpe == nil {
			copy(o, w)
			continue
		}
		p := wpe[t*C : (t+1)*C]
		for i := range o {
			o[i] = w[i] + p[i]
		}
	}
	return nil
}

// encoderBackward accumulates in (b, t) order for every channel, splitting
// the work over channels only.
func (b *Backend) encoderBackward(dwte, dwpe, dout []float32, inp []int32, B, T, C, V int) error {
	for bt, tok := range inp[:B*T] {
		if tok < 0 || int(tok) >= V {
			return fmt.Errorf("token id %d at position %d outside vocabulary of %d", tok, bt, V)
		}
	}
	b.parallel(C, 32, func(lo, hi int) {
		for bt := 0; bt < B*T; bt++ {
			tok, t := int(inp[bt]), bt%T
			d := dout[bt*C : (bt+1)*C]
			for i := lo; i < hi; i++ {
				dwte[tok*C+i] += d[i]
			}
			if dwpe == nil {
				continue
			}
			for i := lo; i < hi; i++ {
				dwpe[t*C+i] += d[i]
			}
		}
	})
	return nil
}

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
