//go:build lsp_sim || cuda

// Go face of kernels/gemm.cu for the simulator tests: GemmBF16 calls the
// launcher lsp_gemm_bf16 on simulator buffers. It checks nothing itself;
// the launcher's own argument checks are part of what the tests exercise.

package simtest

/*
#include "kernels.h"

static int lsp_gemm_bf16_call(int transA, int transB, int M, int N, int K, float alpha, void* A,
		long long strideA, void* B, long long strideB, float beta, void* C, int cBF16,
		long long strideC, int batch, void* bias, int gelu) {
	return (int)lsp_gemm_bf16(transA, transB, M, N, K, alpha, (const __nv_bfloat16*)A, strideA,
		(const __nv_bfloat16*)B, strideB, beta, C, cBF16, strideC, batch,
		(const __nv_bfloat16*)bias, gelu, (cudaStream_t)0);
}
*/
import "C"

import "unsafe"

// GemmArgs are the arguments of lsp_gemm_bf16 (see kernels/gemm.cu):
// C[b] = gelu?(Alpha op(A[b]) op(B[b]) + Beta C[b] + Bias) for b < Batch,
// row-major, op(A) M x K, op(B) K x N, C M x N; strides in elements.
type GemmArgs struct {
	TransA, TransB            bool
	M, N, K                   int
	Alpha, Beta               float32
	A, B                      *Buffer // bf16
	C                         *Buffer // fp32, or bf16 with CBF16
	CBF16                     bool
	StrideA, StrideB, StrideC int64
	Batch                     int
	Bias                      *Buffer // bf16, length N; nil for none
	Gelu                      bool
}

func ptrOf(b *Buffer) unsafe.Pointer {
	if b == nil {
		return nil
	}
	return b.Ptr()
}

func cbool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}

// GemmBF16 runs lsp_gemm_bf16 with a and returns its error (see Check).
func GemmBF16(a GemmArgs) error {
	code := C.lsp_gemm_bf16_call(cbool(a.TransA), cbool(a.TransB), C.int(a.M), C.int(a.N), C.int(a.K),
		C.float(a.Alpha), ptrOf(a.A), C.longlong(a.StrideA), ptrOf(a.B), C.longlong(a.StrideB), C.float(a.Beta),
		ptrOf(a.C), cbool(a.CBF16), C.longlong(a.StrideC), C.int(a.Batch), ptrOf(a.Bias), cbool(a.Gelu))
	return Check("lsp_gemm_bf16", int(code))
}
