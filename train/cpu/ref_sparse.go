// CPU references for the LSP sparse projection kernels (kernels/sparse.cu,
// docs/DESIGN.md, "LSP as implemented"), with the launchers' names and argument
// order.
//
// Projectors P (m x d) and Q (n x d) are (d,r)-sparse: every row has exactly
// r non-zeros at distinct columns. They are stored twice, never densified:
//
//   - by row: idx[rows*r] int32 and val[rows*r] fp32, row i's entries at
//     [i*r, (i+1)*r), in any column order (apply uses it);
//   - by column: colptr[d+1], rowidx[nnz], colval[nnz] (nnz = rows*r),
//     column a's entries at [colptr[a], colptr[a+1]) with rowidx strictly
//     ascending (compress uses it; the kernel walks rows in chunks).
//
// Shapes: BT tokens, m inputs, n outputs, d the projected size. In these
// exported references X [BT, m], dY [BT, n] and W [m, n] are bf16 (the
// launchers and the backend ops also take them as fp32, through the same
// cores below); A [d, BT], B [BT, d], S [d, d], Delta [d, d] and T [d, n]
// are fp32.
//
// Arithmetic is fp32 in the kernels' fixed orders, each product rounded
// before it is added (float32(a*b)), so Go never fuses it into an FMA: the
// simulator, which compiles without FMA contraction, matches bit for bit.
// The apply kernel also avoids contraction on the device (__fmul_rn,
// __fadd_rn), so apply matches there too; compress and S may be contracted
// by nvcc and agree to rounding.
//
// The fp32 cores (gather, S, T and the W update) are C, package host's
// (host/sparse.c: host.SparseGather, SparseS, SparseApplyT, SparseApplyW),
// for speed: SIMD across independent outputs only, no FMA, so every SIMD
// path gives the bits of the plain fp32 loops written out in sparse.h, and
// any split of the outputs over threads gives them too. They are shared
// with the backend's ops (ops_sparse.go), which split the outputs: bf16
// inputs are widened exactly before them, so the ops give these
// references' bits, and fp32 inputs go through the same summation orders.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// SparseColumns builds the column storage of a (d,r)-sparse projector of
// rows rows from its row storage, rows ascending within each column. It
// validates the row storage (indices in [0,d), distinct within a row).
func SparseColumns(idx []int32, val []float32, rows, d, r int) (colptr, rowidx []int32, colval []float32, err error) {
	if err := CheckSparseRows(idx, val, rows, d, r); err != nil {
		return nil, nil, nil, err
	}
	colptr = make([]int32, d+1)
	for _, a := range idx[:rows*r] {
		colptr[a+1]++
	}
	for a := range d {
		colptr[a+1] += colptr[a]
	}
	next := append([]int32(nil), colptr[:d]...)
	rowidx = make([]int32, rows*r)
	colval = make([]float32, rows*r)
	for i := range rows {
		for s := range r {
			a := idx[i*r+s]
			rowidx[next[a]] = int32(i)
			colval[next[a]] = val[i*r+s]
			next[a]++
		}
	}
	return colptr, rowidx, colval, nil
}

// CheckSparseRows validates the row storage of a (d,r)-sparse projector of
// rows rows: lengths, 1 <= r <= d, indices in [0,d) and distinct per row.
func CheckSparseRows(idx []int32, val []float32, rows, d, r int) error {
	if rows < 1 || d < 1 || r < 1 || r > d {
		return fmt.Errorf("sparse rows: rows=%d d=%d r=%d (want rows, d >= 1, 1 <= r <= d)", rows, d, r)
	}
	if len(idx) < rows*r || len(val) < rows*r {
		return fmt.Errorf("sparse rows: idx has %d and val %d entries, want %d", len(idx), len(val), rows*r)
	}
	for i := range rows {
		row := idx[i*r : (i+1)*r]
		for s, a := range row {
			if a < 0 || int(a) >= d {
				return fmt.Errorf("sparse rows: row %d entry %d: column %d outside [0,%d)", i, s, a, d)
			}
			for _, b := range row[:s] {
				if a == b {
					return fmt.Errorf("sparse rows: row %d holds column %d twice", i, a)
				}
			}
		}
	}
	return nil
}

// CheckSparseColumns validates the column storage of a projector of rows
// rows and d columns: colptr[0] = 0, non-decreasing, colptr[d] entries in
// rowidx and colval, and row indices in [0,rows) strictly ascending within
// each column (what the compress kernel relies on).
func CheckSparseColumns(colptr, rowidx []int32, colval []float32, rows, d int) error {
	if rows < 1 || d < 1 {
		return fmt.Errorf("sparse columns: rows=%d d=%d (want >= 1)", rows, d)
	}
	if len(colptr) < d+1 || colptr[0] != 0 {
		return fmt.Errorf("sparse columns: colptr needs %d entries starting at 0", d+1)
	}
	nnz := int(colptr[d])
	if len(rowidx) < nnz || len(colval) < nnz {
		return fmt.Errorf("sparse columns: %d entries, rowidx has %d and colval %d", nnz, len(rowidx), len(colval))
	}
	for a := range d {
		lo, hi := colptr[a], colptr[a+1]
		if hi < lo {
			return fmt.Errorf("sparse columns: colptr decreases at column %d", a)
		}
		for k := lo; k < hi; k++ {
			i := rowidx[k]
			if i < 0 || int(i) >= rows {
				return fmt.Errorf("sparse columns: column %d: row %d outside [0,%d)", a, i, rows)
			}
			if k > lo && rowidx[k-1] >= i {
				return fmt.Errorf("sparse columns: column %d: rows not strictly ascending at entry %d", a, k)
			}
		}
	}
	return nil
}

// widen returns the first n bf16 values of x as fp32 (exact).
func widen(x []uint16, n int) []float32 {
	out := make([]float32, n)
	bf16.ToFloat32Slice(out, x[:n])
	return out
}

func checkCompress(op, x string, out []float32, xs []uint16, colptr, rowidx []int32, colval []float32, BT, rows, d int) error {
	if BT < 1 {
		return fmt.Errorf("%s: BT=%d, want >= 1", op, BT)
	}
	if err := CheckSparseColumns(colptr, rowidx, colval, rows, d); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if len(xs) < BT*rows {
		return fmt.Errorf("%s: %s has %d elements, want %d", op, x, len(xs), BT*rows)
	}
	if len(out) < BT*d {
		return fmt.Errorf("%s: output has %d elements, want %d", op, len(out), BT*d)
	}
	return nil
}

// SparseCompressA is the reference of lsp_sparse_compress_a: A = P^T X^T,
// A[a, t] = sum over the rows i of column a of P of P[i,a] * X[t, i], with
// A [d, BT] fp32, X [BT, m] bf16 and P in column storage.
func SparseCompressA(A []float32, X []uint16, colptr, rowidx []int32, colval []float32, BT, m, d int) error {
	if err := checkCompress("sparse compress A", "X", A, X, colptr, rowidx, colval, BT, m, d); err != nil {
		return err
	}
	if err := host.SparseGather(A, widen(X, BT*m), colptr, rowidx, colval, m, d, BT, 1, 0, BT); err != nil {
		return fmt.Errorf("sparse compress A: %w", err)
	}
	return nil
}

// SparseCompressB is the reference of lsp_sparse_compress_b: B = dY Q,
// B[t, a] = sum over the rows j of column a of Q of dY[t, j] * Q[j,a], with
// B [BT, d] fp32, dY [BT, n] bf16 and Q in column storage.
func SparseCompressB(B []float32, dY []uint16, colptr, rowidx []int32, colval []float32, BT, n, d int) error {
	if err := checkCompress("sparse compress B", "dY", B, dY, colptr, rowidx, colval, BT, n, d); err != nil {
		return err
	}
	if err := host.SparseGather(B, widen(dY, BT*n), colptr, rowidx, colval, n, d, 1, d, 0, BT); err != nil {
		return fmt.Errorf("sparse compress B: %w", err)
	}
	return nil
}

// SparseS is the reference of lsp_sparse_s: S [d, d] = A B over the BT
// tokens (A [d, BT], B [BT, d]), summed over t ascending in fp32 from 0 and
// then added to S (accumulate, so micro-batches sum) or written over it.
func SparseS(S, A, B []float32, BT, d int, accumulate bool) error {
	if BT < 1 || d < 1 {
		return fmt.Errorf("sparse S: BT=%d d=%d, want >= 1", BT, d)
	}
	if len(S) < d*d || len(A) < d*BT || len(B) < BT*d {
		return fmt.Errorf("sparse S: S, A, B have %d, %d, %d elements, want %d, %d, %d", len(S), len(A), len(B), d*d, d*BT, BT*d)
	}
	if err := host.SparseS(S, A, B, BT, d, accumulate, 0, d); err != nil {
		return fmt.Errorf("sparse S: %w", err)
	}
	return nil
}

// SparseApply is the reference of lsp_sparse_apply: W <- (1 - lr*wd) W +
// P Delta Q^T, W [m, n] bf16 written by stochastic rounding (element i*n+j
// of matrix at step under seed, see SRKey), Delta [d, d] fp32, P and Q in
// row storage. T [d, n] is the workspace the kernel fills with Delta Q^T
// (T[a, j] = sum over row j's entries s of Delta[a, qidx] * qval, in entry
// order); then W[i, j] = SR(decay*W[i,j] + sum over row i's entries of
// pval * T[pidx, j]) with decay = 1 - lr*wd, all in fp32.
func SparseApply(W []uint16, T, Delta []float32, pidx []int32, pval []float32, qidx []int32, qval []float32,
	m, n, d, r int, lr, wd float32, seed, step uint64, matrix uint32) error {
	if err := CheckSparseRows(pidx, pval, m, d, r); err != nil {
		return fmt.Errorf("sparse apply: P: %w", err)
	}
	if err := CheckSparseRows(qidx, qval, n, d, r); err != nil {
		return fmt.Errorf("sparse apply: Q: %w", err)
	}
	if len(W) < m*n || len(T) < d*n || len(Delta) < d*d {
		return fmt.Errorf("sparse apply: W, T, Delta have %d, %d, %d elements, want %d, %d, %d", len(W), len(T), len(Delta), m*n, d*n, d*d)
	}
	if err := host.SparseApplyT(T, Delta, qidx, qval, n, d, r, 0, d); err != nil {
		return fmt.Errorf("sparse apply: %w", err)
	}
	w := widen(W, m*n)
	if err := host.SparseApplyW(w, T, pidx, pval, n, r, sparseDecay(lr, wd), 0, m); err != nil {
		return fmt.Errorf("sparse apply: %w", err)
	}
	sparseRoundW(W, w, SRKey(seed, step, matrix), 0, m*n)
	return nil
}

// sparseDecay is the fp32 decay factor 1 - lr*wd of the apply kernel.
func sparseDecay(lr, wd float32) float32 { return 1 - float32(lr*wd) }

// sparseRoundW stores elements k in [lo,hi) of w into the bf16 W by
// stochastic rounding with the bits of element k under key.
func sparseRoundW(W []uint16, w []float32, key uint64, lo, hi int) {
	for k := lo; k < hi; k++ {
		W[k] = RoundBF16Bits(w[k], SRBits(key, uint64(k)))
	}
}
