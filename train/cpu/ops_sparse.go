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
	"strings"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// needF32 checks that the named tensors are fp32 (after needAll has
// checked that they are valid float tensors).
func needF32(op string, args ...arg) error {
	for _, a := range args {
		if a.t.DType != backend.F32 {
			return fmt.Errorf("cpu: %s: %s has dtype %v, want fp32", op, a.name, a.t.DType)
		}
	}
	return nil
}

// checkPositive rejects sizes below 1; names lists them, space separated.
func checkPositive(op, names string, vals ...int) error {
	for i, name := range strings.Fields(names) {
		if vals[i] < 1 {
			return fmt.Errorf("cpu: %s: %s=%d, want >= 1", op, name, vals[i])
		}
	}
	return nil
}

// SparseCompressA implements backend.Ops: A [d,BT] = P^T X^T.
func (b *Backend) SparseCompressA(s backend.Stream, A, X, colptr, rowidx, colval backend.Tensor, BT, m, d int) error {
	if err := b.kernelDTypes("SparseCompressA", A, X, colptr, rowidx, colval); err != nil {
		return err
	}
	return b.sparseCompress(s, hazard.SparseCompressA, "sparse compress A", "A", "X", "BT m d", A, X, colptr, rowidx, colval, BT, m, d, BT, 1)
}

// SparseCompressB implements backend.Ops: B [BT,d] = dY Q.
func (b *Backend) SparseCompressB(s backend.Stream, B, dY, colptr, rowidx, colval backend.Tensor, BT, n, d int) error {
	if err := b.kernelDTypes("SparseCompressB", B, dY, colptr, rowidx, colval); err != nil {
		return err
	}
	return b.sparseCompress(s, hazard.SparseCompressB, "sparse compress B", "B", "dY", "BT n d", B, dY, colptr, rowidx, colval, BT, n, d, 1, d)
}

// sparseCompress is the body of both compress ops: out[a*sa + t*st] is
// column a of the projector gathered from row t of x [BT, rows].
func (b *Backend) sparseCompress(s backend.Stream, decl func(out, x, colptr, rowidx, colval backend.Tensor) hazard.Access, op, outName, xName, dims string, out, x, colptr, rowidx, colval backend.Tensor,
	BT, rows, d, sa, st int) error {
	if err := checkPositive(op, dims, BT, rows, d); err != nil {
		return err
	}
	nnz := rowidx.Len()
	if err := b.needAll(op, f(outName, out, d*BT), f(xName, x, BT*rows), arg{"colptr", colptr, d + 1, true},
		arg{"rowidx", rowidx, nnz, true}, f("colval", colval, nnz)); err != nil {
		return err
	}
	if err := needF32(op, f(outName, out, 0), f("colval", colval, 0)); err != nil {
		return err
	}
	return b.enqueue(s, decl(out, x, colptr, rowidx, colval), func() error {
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
	if err := checkPositive(op, "BT d", BT, d); err != nil {
		return err
	}
	args := []arg{f("S", S, d*d), f("A", A, d*BT), f("B", B, BT*d)}
	if err := b.needAll(op, args...); err != nil {
		return err
	}
	if err := needF32(op, args...); err != nil {
		return err
	}
	if err := b.kernelDTypes("SparseS", S, A, B); err != nil {
		return err
	}
	return b.enqueue(s, hazard.SparseS(S, A, B, accumulate), func() error {
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
	if err := checkPositive(op, "m n d r", m, n, d, r); err != nil {
		return err
	}
	if r > d {
		return fmt.Errorf("cpu: %s: r=%d > d=%d", op, r, d)
	}
	if err := b.needAll(op, f("W", W, m*n), f("T", T, d*n), f("Delta", Delta, d*d),
		arg{"pidx", pidx, m * r, true}, f("pval", pval, m*r), arg{"qidx", qidx, n * r, true}, f("qval", qval, n*r)); err != nil {
		return err
	}
	if err := needF32(op, f("T", T, 0), f("Delta", Delta, 0), f("pval", pval, 0), f("qval", qval, 0)); err != nil {
		return err
	}
	if err := b.needSkip(op, skip); err != nil {
		return err
	}
	return b.enqueue(s, hazard.SparseApply(W, T, Delta, pidx, pval, qidx, qval, skip), func() error {
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
