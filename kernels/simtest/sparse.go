//go:build lsp_sim || cuda

// Go face of kernels/sparse.cu for the simulator tests: thin wrappers that
// call the LSP sparse projection launchers (compress A and B, S, apply) on
// simulator buffers. X, dY and W are FloatBufs, whose dtype becomes the
// launchers' x_bf16, dy_bf16 and w_bf16 flag (0 fp32, 1 bf16); the
// unexported variants take the flag as given, so that tests can pass a bad
// one. The wrappers check nothing themselves; the launchers' own argument
// checks are part of what the tests exercise.

package simtest

/*
#include "kernels.h"
*/
import "C"

// SparseColumns is a projector in column storage (int32 colptr [d+1],
// rowidx [nnz], fp32 colval [nnz]) on the device.
type SparseColumns struct{ Colptr, Rowidx, Colval *Buffer }

// SparseRows is a projector in row storage (int32 idx, fp32 val, r per row).
type SparseRows struct{ Idx, Val *Buffer }

// bf16Flag is the launchers' dtype flag of a FloatBuf.
func bf16Flag(f FloatBuf) int {
	if f.BF16 {
		return 1
	}
	return 0
}

// SparseCompressA runs lsp_sparse_compress_a: A [d, BT] fp32 = P^T X^T,
// X [BT, m] fp32 or bf16.
func SparseCompressA(A *Buffer, X FloatBuf, P SparseColumns, BT, m, d int) error {
	return sparseCompressA(A, X, bf16Flag(X), P, BT, m, d)
}

func sparseCompressA(A *Buffer, X FloatBuf, xBF16 int, P SparseColumns, BT, m, d int) error {
	code := C.lsp_sparse_compress_a(f32Ptr(A), X.ptr(), i32Ptr(P.Colptr), i32Ptr(P.Rowidx), f32Ptr(P.Colval),
		C.int(BT), C.int(m), C.int(d), C.int(xBF16), nil)
	return Check("lsp_sparse_compress_a", int(code))
}

// SparseCompressB runs lsp_sparse_compress_b: B [BT, d] fp32 = dY Q,
// dY [BT, n] fp32 or bf16.
func SparseCompressB(B *Buffer, dY FloatBuf, Q SparseColumns, BT, n, d int) error {
	return sparseCompressB(B, dY, bf16Flag(dY), Q, BT, n, d)
}

func sparseCompressB(B *Buffer, dY FloatBuf, dyBF16 int, Q SparseColumns, BT, n, d int) error {
	code := C.lsp_sparse_compress_b(f32Ptr(B), dY.ptr(), i32Ptr(Q.Colptr), i32Ptr(Q.Rowidx), f32Ptr(Q.Colval),
		C.int(BT), C.int(n), C.int(d), C.int(dyBF16), nil)
	return Check("lsp_sparse_compress_b", int(code))
}

// SparseS runs lsp_sparse_s: S [d, d] = A B, or S += A B with accumulate.
func SparseS(S, A, B *Buffer, BT, d int, accumulate bool) error {
	code := C.lsp_sparse_s(f32Ptr(S), f32Ptr(A), f32Ptr(B), C.int(BT), C.int(d), cbool(accumulate), nil)
	return Check("lsp_sparse_s", int(code))
}

// SparseApplyArgs are the arguments of lsp_sparse_apply: W [m, n] (fp32,
// written exactly, or bf16, written by stochastic rounding keyed by (Seed,
// Step, Matrix, element)) <- (1 - LR*WD) W + P Delta Q^T; T is d*n floats
// of workspace.
type SparseApplyArgs struct {
	W          FloatBuf
	T, Delta   *Buffer
	P, Q       SparseRows
	M, N, D, R int
	LR, WD     float32
	Seed, Step uint64
	Matrix     uint32
}

// SparseApply runs lsp_sparse_apply with a.
func SparseApply(a SparseApplyArgs) error { return sparseApply(a, bf16Flag(a.W)) }

func sparseApply(a SparseApplyArgs, wBF16 int) error {
	code := C.lsp_sparse_apply(a.W.ptr(), f32Ptr(a.T), f32Ptr(a.Delta), i32Ptr(a.P.Idx), f32Ptr(a.P.Val),
		i32Ptr(a.Q.Idx), f32Ptr(a.Q.Val), C.int(a.M), C.int(a.N), C.int(a.D), C.int(a.R), C.float(a.LR),
		C.float(a.WD), C.ulonglong(a.Seed), C.ulonglong(a.Step), C.uint(a.Matrix), C.int(wBF16), nil)
	return Check("lsp_sparse_apply", int(code))
}
