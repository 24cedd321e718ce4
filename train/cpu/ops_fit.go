// The projector fit's op of the CPU backend: SparseValueGrad, the bias
// objective's gradient gathered at a projector's positions (its reference
// and summation order are in ref_fit.go, which this shares). The fit's
// other products run on the existing ops (train/lsp/devicefit.go says which).
// Work is split over rows only, so results do not depend on Threads.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// SparseValueGrad implements backend.Ops.
func (b *Backend) SparseValueGrad(s backend.Stream, out, Y, M, K, idx, val backend.Tensor, rows, d, r int, w float32, trans, accumulate bool) error {
	const op = "sparse value grad"
	return b.op(s, backend.Calls.SparseValueGrad(out, Y, M, K, idx, val, rows, d, r, w, trans, accumulate), func() error {
		ix, v := i32View(idx), f32View(val)
		if err := CheckSparseRows(ix, v, rows, d, r); err != nil {
			return fmt.Errorf("cpu: %s: %w", op, err)
		}
		var y, m []float32
		if Y.Buf != nil {
			y, m = f32View(Y), f32View(M)
		}
		o, k := f32View(out), f32View(K)
		b.parallel(rows, 8, func(lo, hi int) {
			sparseValueGrad(o, y, m, k, ix, v, rows, d, r, w, trans, accumulate, lo, hi)
		})
		return nil
	})
}
