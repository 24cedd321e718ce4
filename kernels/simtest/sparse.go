//go:build lsp_sim

// Go face of kernels/sparse.cu for the simulator tests: thin wrappers that
// call the LSP sparse projection launchers (compress A and B, S, apply) on
// simulator buffers. They check nothing themselves; the launchers' own
// argument checks are part of what the tests exercise.

package simtest

/*
#include "kernels.h"

static int lsp_sparse_compress_a_call(void* A, void* X, void* colptr, void* rowidx, void* colval, int BT, int m,
		int d) {
	return (int)lsp_sparse_compress_a((float*)A, (const __nv_bfloat16*)X, (const int*)colptr,
		(const int*)rowidx, (const float*)colval, BT, m, d, (cudaStream_t)0);
}

static int lsp_sparse_compress_b_call(void* B, void* dY, void* colptr, void* rowidx, void* colval, int BT, int n,
		int d) {
	return (int)lsp_sparse_compress_b((float*)B, (const __nv_bfloat16*)dY, (const int*)colptr,
		(const int*)rowidx, (const float*)colval, BT, n, d, (cudaStream_t)0);
}

static int lsp_sparse_s_call(void* S, void* A, void* B, int BT, int d, int accumulate) {
	return (int)lsp_sparse_s((float*)S, (const float*)A, (const float*)B, BT, d, accumulate, (cudaStream_t)0);
}

static int lsp_sparse_apply_call(void* W, void* T, void* Delta, void* pidx, void* pval, void* qidx, void* qval,
		int m, int n, int d, int r, float lr, float wd, unsigned long long seed, unsigned long long step,
		unsigned int matrix) {
	return (int)lsp_sparse_apply((__nv_bfloat16*)W, (float*)T, (const float*)Delta, (const int*)pidx,
		(const float*)pval, (const int*)qidx, (const float*)qval, m, n, d, r, lr, wd, seed, step, matrix,
		(cudaStream_t)0);
}
*/
import "C"

// SparseColumns is a projector in column storage (int32 colptr [d+1],
// rowidx [nnz], fp32 colval [nnz]) on the device.
type SparseColumns struct{ Colptr, Rowidx, Colval *Buffer }

// SparseRows is a projector in row storage (int32 idx, fp32 val, r per row).
type SparseRows struct{ Idx, Val *Buffer }

// SparseCompressA runs lsp_sparse_compress_a: A [d, BT] fp32 = P^T X^T,
// X [BT, m] bf16.
func SparseCompressA(A, X *Buffer, P SparseColumns, BT, m, d int) error {
	code := C.lsp_sparse_compress_a_call(ptrOf(A), ptrOf(X), ptrOf(P.Colptr), ptrOf(P.Rowidx), ptrOf(P.Colval),
		C.int(BT), C.int(m), C.int(d))
	return Check("lsp_sparse_compress_a", int(code))
}

// SparseCompressB runs lsp_sparse_compress_b: B [BT, d] fp32 = dY Q,
// dY [BT, n] bf16.
func SparseCompressB(B, dY *Buffer, Q SparseColumns, BT, n, d int) error {
	code := C.lsp_sparse_compress_b_call(ptrOf(B), ptrOf(dY), ptrOf(Q.Colptr), ptrOf(Q.Rowidx), ptrOf(Q.Colval),
		C.int(BT), C.int(n), C.int(d))
	return Check("lsp_sparse_compress_b", int(code))
}

// SparseS runs lsp_sparse_s: S [d, d] = A B, or S += A B with accumulate.
func SparseS(S, A, B *Buffer, BT, d int, accumulate bool) error {
	code := C.lsp_sparse_s_call(ptrOf(S), ptrOf(A), ptrOf(B), C.int(BT), C.int(d), cbool(accumulate))
	return Check("lsp_sparse_s", int(code))
}

// SparseApplyArgs are the arguments of lsp_sparse_apply: W [m, n] bf16 <-
// (1 - LR*WD) W + P Delta Q^T with stochastic rounding keyed by (Seed,
// Step, Matrix, element); T is d*n floats of workspace.
type SparseApplyArgs struct {
	W, T, Delta *Buffer
	P, Q        SparseRows
	M, N, D, R  int
	LR, WD      float32
	Seed, Step  uint64
	Matrix      uint32
}

// SparseApply runs lsp_sparse_apply with a.
func SparseApply(a SparseApplyArgs) error {
	code := C.lsp_sparse_apply_call(ptrOf(a.W), ptrOf(a.T), ptrOf(a.Delta), ptrOf(a.P.Idx), ptrOf(a.P.Val),
		ptrOf(a.Q.Idx), ptrOf(a.Q.Val), C.int(a.M), C.int(a.N), C.int(a.D), C.int(a.R), C.float(a.LR),
		C.float(a.WD), C.ulonglong(a.Seed), C.ulonglong(a.Step), C.uint(a.Matrix))
	return Check("lsp_sparse_apply", int(code))
}
