// The projector fit's op of the CPU backend: SparseValueGrad, the bias
// objective's gradient gathered at a projector's positions (its reference
// and summation order are in ref_fit.go, which this shares). The fit's
// other products run on the existing ops (train/lsp/devicefit.go says which).
// Work is split over rows only, so results do not depend on Threads.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// SparseValueGrad implements backend.Ops.
func (b *Backend) SparseValueGrad(s backend.Stream, out, Y, M, K, idx, val backend.Tensor, rows, d, r int, w float32, trans, accumulate bool) error {
	const op = "sparse value grad"
	if err := b.kernelDTypes("SparseValueGrad", out, Y, M, K, idx, val); err != nil {
		return err
	}
	if err := checkPositive(op, "rows d r", rows, d, r); err != nil {
		return err
	}
	if r > d {
		return fmt.Errorf("cpu: %s: r=%d > d=%d", op, r, d)
	}
	args := []arg{f("out", out, rows*r), f("K", K, d*d), arg{"idx", idx, rows * r, true}, f("val", val, rows*r)}
	if Y.Buf != nil {
		args = append(args, f("Y", Y, rows*d), f("M", M, d*d))
	}
	if err := b.needAll(op, args...); err != nil {
		return err
	}
	f32s := []arg{f("out", out, 0), f("K", K, 0), f("val", val, 0)}
	if Y.Buf != nil {
		f32s = append(f32s, f("Y", Y, 0), f("M", M, 0))
	}
	if err := needF32(op, f32s...); err != nil {
		return err
	}
	return b.enqueue(s, hazard.SparseValueGrad(out, Y, M, K, idx, val, accumulate), func() error {
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
