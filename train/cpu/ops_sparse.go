// The LSP sparse projection ops of the CPU backend (docs/DESIGN.md, "LSP as
// implemented"): compress A = P^T X^T and B = dY Q, S = A B summed over
// micro-batches, and apply W <- (1 - lr wd) W + P Delta Q^T written by
// stochastic rounding.
//
// They run the fp32 cores of package host (C, SIMD across independent
// outputs only), which the exported references of ref_sparse.go share:
// bf16 inputs are widened exactly at load, so bf16 results are the
// references' bits (what the kernel tests compare with), and fp32 inputs
// take the same summation orders. bf16 inputs and W cost a widened fp32
// copy per call. Work is split over independent outputs only (tokens of
// A and B, rows of S, T and W), so results do not depend on Threads.
//
// Index contents are checked on the stream, where they are read (an earlier
// op may write them): a bad index is an error at Synchronize, never an
// out-of-range access. Shapes: BT tokens, m inputs, n outputs, d the
// projected size, r non-zeros per projector row.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// SparseCompressA implements backend.Ops: A [d,BT] = P^T X^T.
func (b *Backend) SparseCompressA(s backend.Stream, A, X, colptr, rowidx, colval backend.Tensor, BT, m, d int) error {
	return b.sparseCompress(s, backend.Calls.SparseCompressA(A, X, colptr, rowidx, colval, BT, m, d), "sparse compress A",
		A, X, colptr, rowidx, colval, BT, m, d, BT, 1)
}

// SparseCompressB implements backend.Ops: B [BT,d] = dY Q.
func (b *Backend) SparseCompressB(s backend.Stream, B, dY, colptr, rowidx, colval backend.Tensor, BT, n, d int) error {
	return b.sparseCompress(s, backend.Calls.SparseCompressB(B, dY, colptr, rowidx, colval, BT, n, d), "sparse compress B",
		B, dY, colptr, rowidx, colval, BT, n, d, 1, d)
}

// sparseCompress is the body of both compress ops: out[a*sa + t*st] is
// column a of the projector gathered from row t of x [BT, rows].
func (b *Backend) sparseCompress(s backend.Stream, call *backend.Call, op string, out, x, colptr, rowidx, colval backend.Tensor,
	BT, rows, d, sa, st int) error {
	return b.op(s, call, func() error {
		cp, ri, cv := i32View(colptr), i32View(rowidx), f32View(colval)
		if err := CheckSparseColumns(cp, ri, cv, rows, d); err != nil {
			return fmt.Errorf("cpu: %s: %w", op, err)
		}
		o, xs := f32View(out), load(x)
		return b.parallelErr(op, BT, 4, func(lo, hi int) error {
			return host.SparseGather(o, xs, cp, ri, cv, rows, d, sa, st, lo, hi)
		})
	})
}

// SparseS implements backend.Ops: S [d,d] = A B, or S += A B.
func (b *Backend) SparseS(s backend.Stream, S, A, B backend.Tensor, BT, d int, accumulate bool) error {
	const op = "sparse S"
	return b.op(s, backend.Calls.SparseS(S, A, B, BT, d, accumulate), func() error {
		so, a, bb := f32View(S), f32View(A), f32View(B)
		return b.parallelErr(op, d, 1, func(lo, hi int) error { return host.SparseS(so, a, bb, BT, d, accumulate, lo, hi) })
	})
}

// SparseApply implements backend.Ops: W <- (1 - lr*wd) W + P Delta Q^T,
// through T = Delta Q^T; a bf16 W is stored by stochastic rounding. A set
// skip flag leaves W and T as they are.
func (b *Backend) SparseApply(s backend.Stream, W, T, Delta, pidx, pval, qidx, qval, skip backend.Tensor, m, n, d, r int,
	lr, wd float32, seed, step uint64, matrix uint32) error {
	const op = "sparse apply"
	return b.op(s, backend.Calls.SparseApply(W, T, Delta, pidx, pval, qidx, qval, skip, m, n, d, r, lr, wd, seed, step, matrix), func() error {
		if skipped(skip) {
			return nil
		}
		pi, pv, qi, qv := i32View(pidx), f32View(pval), i32View(qidx), f32View(qval)
		if err := CheckSparseRows(pi, pv, m, d, r); err != nil {
			return fmt.Errorf("cpu: %s: P: %w", op, err)
		}
		if err := CheckSparseRows(qi, qv, n, d, r); err != nil {
			return fmt.Errorf("cpu: %s: Q: %w", op, err)
		}
		tt, dd := f32View(T), f32View(Delta)
		if err := b.parallelErr(op, d, 1, func(lo, hi int) error { return host.SparseApplyT(tt, dd, qi, qv, n, d, r, lo, hi) }); err != nil {
			return err
		}
		w, decay := load(W), sparseDecay(lr, wd) // an fp32 W is updated in place, exactly
		key := SRKey(seed, step, matrix)
		return b.parallelErr(op, m, 4, func(lo, hi int) error {
			if err := host.SparseApplyW(w, tt, pi, pv, n, r, decay, lo, hi); err != nil {
				return err
			}
			if W.DType == backend.BF16 {
				sparseRoundW(u16View(W), w, key, lo*n, hi*n)
			}
			return nil
		})
	})
}
