//go:build cuda || cudasim

// The projector fit's op (kernels/fit.cu); the fit's other products run
// on the sparse, elementwise and Adam ops of ops.go (train/lsp/devicefit.go).

package cuda

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// SparseValueGrad implements backend.Ops (lsp_sparse_value_grad). Index
// contents are trusted (check them with cpu.CheckSparseRows).
func (b *Backend) SparseValueGrad(s backend.Stream, out, Y, M, K, idx, val backend.Tensor, rows, d, r int, w float32, trans, accumulate bool) error {
	const op = "SparseValueGrad"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkPositive(op, "rows d r", rows, d, r); err != nil {
		return err
	}
	if r > d {
		return fmt.Errorf("cuda: %s: r=%d > d=%d", op, r, d)
	}
	args := []arg{f("out", out, rows*r), f("K", K, d*d), i32("idx", idx, rows*r), f("val", val, rows*r)}
	if Y.Buf != nil {
		args = append(args, f("Y", Y, rows*d), f("M", M, d*d))
	} else {
		M = backend.Tensor{} // unused without Y
	}
	if err := b.needAll(op, args...); err != nil {
		return err
	}
	if err := dtypes(op, out, Y, M, K, idx, val); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SparseValueGrad(b.ptr(out), b.ptr(Y), b.ptr(M), b.ptr(K), b.ptr(idx), b.ptr(val), rows, d, r, w, trans, accumulate, st)
	})
}
