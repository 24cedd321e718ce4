// CPU reference for the matrix multiply of kernels/gemm.cu: Gemm, the
// backend op's arithmetic, C = alpha * op(A) op(B) + beta * C on packed
// row-major fp32 matrices, op(A) M x K (A [M][K], or [K][M] with transA),
// op(B) K x N (B [K][N], or [N][K] with transB), C M x N. beta == 0 does
// not read C (NaNs there are ignored). The models store a weight W in x
// out, so their forward is NN (out = inp W; a tied head's out = h wte^T is
// NT), the input gradient NT (dinp = dout W^T) and the weight gradient TN
// (dW = inp^T dout): the layouts it needs.
//
// The launcher, lsp_gemm_bf16, is more: bf16 A and B, batches with strides,
// and an optional bias + GELU epilogue. Here bf16 operands are widened
// exactly before the call (as the op does), a batch is one call per matrix,
// and the epilogue is AddBias then GeluForward (ref_elementwise.go,
// ref_activations.go), which is how the kernel tests compose it.
//
// The loops are C, package host's (host.Sgemm: host/gemm_driver.c and the
// microkernels of gemm_scalar.c, gemm_avx2.c, gemm_avx512.c), for speed:
// Goto/BLIS-style packing and register-blocked SIMD microkernels, with
// tiles of C spread over threads. K is summed in fixed blocks of a path's
// KC, each from zero in ascending k, the blocks in ascending order, so the
// result is the same bits for any thread count.
//
// Limits: the bits differ between SIMD paths (the blocking and the fused
// multiply-adds of the AVX paths differ), so the kernel tests compare with
// a tolerance; C must not overlap A or B.

package cpu

import "github.com/lsp-offload/lsp-offload/host"

// Gemm computes C = alpha * op(A) op(B) + beta * C; it fails, with
// host.ErrGemmArgs, when a shape or length does not fit.
func Gemm(transA, transB bool, M, N, K int, alpha float32, A, B []float32, beta float32, C []float32) error {
	lda, ldb := K, N
	if transA {
		lda = M
	}
	if transB {
		ldb = K
	}
	return host.Sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, N)
}
