// sparse.go: the fp32 cores of the LSP sparse projection ops
// (docs/DESIGN.md, "LSP as implemented") in C (sparse.c) on the SIMD path
// chosen by ActiveSIMD: the gather of compress and of T = Delta Q^T,
// S = A B, and the W update of apply. They are the CPU backend's arithmetic and the bit-exact reference
// of the CUDA kernels, so every path gives the same bits as plain Go loops
// (sparse_test.go checks it): each output is summed in fp32 from +0 in a
// fixed order, products rounded before they are added (never an FMA), and
// SIMD lanes only hold independent outputs.
//
// Limits: one call runs on the calling goroutine; callers split the work
// over independent outputs (tokens, rows), which never changes results.
// Index contents are checked on every call (O(entries)), so bad indices are
// errors, never out-of-range accesses.

package host

/*
#include "sparse.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrSparseArgs is wrapped by every argument error of the sparse cores.
var ErrSparseArgs = errors.New("sparse: bad arguments")

// SparseGather computes, for tokens t in [lo, hi) and columns a in [0, d),
//
//	out[a*sa + t*st] = sum over k in [colptr[a], colptr[a+1]), ascending,
//	                   of colval[k] * x[t*rows + rowidx[k]]
//
// in fp32 from +0, each product rounded before the add: compress A
// (A [d, BT] = P^T X^T: x = X [BT, m], rows = m, sa = BT, st = 1) and
// compress B (B [BT, d] = dY Q: x = dY, rows = n, sa = 1, st = d) with the
// projector in column storage. Row indices must lie in [0, rows); their
// order within a column is free (it is the summation order). out must not
// overlap x.
func SparseGather(out, x []float32, colptr, rowidx []int32, colval []float32, rows, d, sa, st, lo, hi int) error {
	if len(colptr) < d+1 || d < 1 {
		return fmt.Errorf("%w: gather: d=%d, colptr has %d entries", ErrSparseArgs, d, len(colptr))
	}
	return sparseGather(ActiveSIMD(), out, x, colptr, 0, rowidx, colval, rows, d, sa, st, lo, hi)
}

// SparseApplyT computes rows a in [lo, hi) of T [d, n] = Delta Q^T with Q in
// row storage (qidx, qval: n rows of r entries):
//
//	T[a, j] = sum over s < r, ascending, of Delta[a*d + qidx[j*r+s]] * qval[j*r+s]
//
// in fp32 from +0, each product rounded before the add. qidx entries must
// lie in [0, d). T must not overlap Delta.
func SparseApplyT(T, Delta []float32, qidx []int32, qval []float32, n, d, r, lo, hi int) error {
	if r < 1 {
		return fmt.Errorf("%w: apply T: r=%d, want >= 1", ErrSparseArgs, r)
	}
	return sparseGather(ActiveSIMD(), T, Delta, nil, r, qidx, qval, d, n, 1, n, lo, hi)
}

// sparseGather is SparseGather on path; colptr == nil means column a's
// entries are [a*r, (a+1)*r).
func sparseGather(path SIMD, out, x []float32, colptr []int32, r int, rowidx []int32, colval []float32,
	rows, d, sa, st, lo, hi int) error {
	if rows < 1 || d < 1 || sa < 0 || st < 0 || lo < 0 || hi < lo {
		return fmt.Errorf("%w: gather: rows=%d d=%d sa=%d st=%d tokens [%d,%d)", ErrSparseArgs, rows, d, sa, st, lo, hi)
	}
	nnz := d * r
	if colptr != nil {
		if colptr[0] < 0 {
			return fmt.Errorf("%w: gather: colptr[0]=%d", ErrSparseArgs, colptr[0])
		}
		for a := range d {
			if colptr[a+1] < colptr[a] {
				return fmt.Errorf("%w: gather: colptr decreases at column %d", ErrSparseArgs, a)
			}
		}
		nnz = int(colptr[d])
	}
	if len(rowidx) < nnz || len(colval) < nnz {
		return fmt.Errorf("%w: gather: %d entries, indices have %d and values %d", ErrSparseArgs, nnz, len(rowidx), len(colval))
	}
	first := 0
	if colptr != nil {
		first = int(colptr[0])
	}
	for k, i := range rowidx[first:nnz] {
		if i < 0 || int(i) >= rows {
			return fmt.Errorf("%w: gather: entry %d: row %d outside [0,%d)", ErrSparseArgs, first+k, i, rows)
		}
	}
	if lo == hi {
		return nil
	}
	if len(x) < hi*rows {
		return fmt.Errorf("%w: gather: x has %d elements, want %d", ErrSparseArgs, len(x), hi*rows)
	}
	if last := (d-1)*sa + (hi-1)*st; len(out) <= last {
		return fmt.Errorf("%w: gather: out has %d elements, want %d", ErrSparseArgs, len(out), last+1)
	}
	var cptr *C.int32_t
	if colptr != nil {
		cptr = (*C.int32_t)(unsafe.Pointer(&colptr[0]))
	}
	var scratch *C.float
	if n := int(C.lsp_host_sparse_gather_scratch(C.int(path), C.ptrdiff_t(rows), C.ptrdiff_t(d))); n > 0 {
		b := sparseBufs.get(n)
		defer sparseBufs.put(b)
		scratch = sliceArg(b.f)
	}
	C.lsp_host_sparse_gather(C.int(path), sliceArg(out), sliceArg(x), C.ptrdiff_t(rows), cptr, C.ptrdiff_t(r),
		int32Arg(rowidx), sliceArg(colval), C.ptrdiff_t(d), C.ptrdiff_t(sa), C.ptrdiff_t(st),
		C.ptrdiff_t(lo), C.ptrdiff_t(hi), scratch)
	return nil
}

// SparseS computes rows a in [lo, hi) of S [d, d] = A B (A [d, BT],
// B [BT, d]): each entry summed over t ascending in fp32 from +0, products
// rounded before the add, then added to S (acc + S) when accumulate, else
// written over it. S must not overlap A or B.
func SparseS(S, A, B []float32, BT, d int, accumulate bool, lo, hi int) error {
	return sparseS(ActiveSIMD(), S, A, B, BT, d, accumulate, lo, hi)
}

func sparseS(path SIMD, S, A, B []float32, BT, d int, accumulate bool, lo, hi int) error {
	if hi > d {
		return fmt.Errorf("%w: S: BT=%d d=%d rows [%d,%d)", ErrSparseArgs, BT, d, lo, hi)
	}
	return denseRows(path, S, A, B, BT, d, accumulate, lo, hi)
}

// DenseRows is SparseS's core at any shape: rows i in [lo, hi) of
// S [*, N] = A B (A [*, K], B [K, N], row-major), each entry summed over k
// ascending in fp32 from +0, products rounded before the add; the CPU
// backend's DenseGemm and DenseApply (train/cpu/ref_dense.go), whose
// plain Go loops give the same bits. S must not overlap A or B.
func DenseRows(S, A, B []float32, K, N int, accumulate bool, lo, hi int) error {
	return denseRows(ActiveSIMD(), S, A, B, K, N, accumulate, lo, hi)
}

func denseRows(path SIMD, S, A, B []float32, K, N int, accumulate bool, lo, hi int) error {
	if K < 1 || N < 1 || lo < 0 || hi < lo {
		return fmt.Errorf("%w: S: K=%d N=%d rows [%d,%d)", ErrSparseArgs, K, N, lo, hi)
	}
	if len(S) < hi*N || len(A) < hi*K || len(B) < K*N {
		return fmt.Errorf("%w: S: S, A, B have %d, %d, %d elements, want %d, %d, %d",
			ErrSparseArgs, len(S), len(A), len(B), hi*N, hi*K, K*N)
	}
	if lo == hi {
		return nil
	}
	C.lsp_host_sparse_s(C.int(path), sliceArg(S), sliceArg(A), sliceArg(B), C.ptrdiff_t(K), C.ptrdiff_t(N),
		cBool(accumulate), C.ptrdiff_t(lo), C.ptrdiff_t(hi))
	return nil
}

// SparseApplyW updates rows i in [lo, hi) of the fp32 w [*, n] in place:
//
//	w[i, j] = decay*w[i, j] + sum over s < r, ascending, of pval[i*r+s] * T[pidx[i*r+s]*n + j]
//
// with the sum in fp32 from +0 and every product rounded (decay*w too)
// before its add: the update of apply with P in row storage and T [d, n].
// pidx entries of those rows must be rows of T. w must not overlap T.
func SparseApplyW(w, T []float32, pidx []int32, pval []float32, n, r int, decay float32, lo, hi int) error {
	return sparseApplyW(ActiveSIMD(), w, T, pidx, pval, n, r, decay, lo, hi)
}

func sparseApplyW(path SIMD, w, T []float32, pidx []int32, pval []float32, n, r int, decay float32, lo, hi int) error {
	if n < 1 || r < 1 || lo < 0 || hi < lo {
		return fmt.Errorf("%w: apply W: n=%d r=%d rows [%d,%d)", ErrSparseArgs, n, r, lo, hi)
	}
	if len(w) < hi*n || len(pidx) < hi*r || len(pval) < hi*r {
		return fmt.Errorf("%w: apply W: w, pidx, pval have %d, %d, %d elements, want %d, %d, %d",
			ErrSparseArgs, len(w), len(pidx), len(pval), hi*n, hi*r, hi*r)
	}
	trows := len(T) / n
	for k, i := range pidx[lo*r : hi*r] {
		if i < 0 || int(i) >= trows {
			return fmt.Errorf("%w: apply W: entry %d: row %d outside T's %d rows", ErrSparseArgs, lo*r+k, i, trows)
		}
	}
	if lo == hi {
		return nil
	}
	C.lsp_host_sparse_apply_w(C.int(path), sliceArg(w), sliceArg(T), int32Arg(pidx), sliceArg(pval),
		C.ptrdiff_t(n), C.ptrdiff_t(r), C.float(decay), C.ptrdiff_t(lo), C.ptrdiff_t(hi))
	return nil
}

// sparseBufs holds the gather's scratch tiles (a pool apart from Sgemm's,
// whose buffers are much larger).
var sparseBufs scratchPool

func int32Arg(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}
