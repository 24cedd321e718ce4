/*
 * selftest.h: launchers of the simulator's self-test kernels (selftest.cu),
 * for the cgo preamble of sim_selftest.go. Test code only.
 */
#ifndef LSP_SELFTEST_H
#define LSP_SELFTEST_H

#include "../common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

// BEGIN selftest
// The Go face of these launchers is generated (kernels/cmd/kernelgen) into
// selftest_gen.go: stReverse, stOrder, ...
cudaError_t lsp_st_reverse(const float* in, float* out, int n, int use_barrier, cudaStream_t stream);
cudaError_t lsp_st_order(int* tickets, int* counter, int n, cudaStream_t stream);
cudaError_t lsp_st_warp(const int* in, int* out, int n, cudaStream_t stream);
cudaError_t lsp_st_wmma(const __nv_bfloat16* A, int a_col, int lda, const __nv_bfloat16* B, int b_col, int ldb,
                        const float* C, int c_col, int ldc, float* D, int d_col, int ldd, float scale,
                        const float* bias, cudaStream_t stream);
cudaError_t lsp_st_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N, int K,
                        cudaStream_t stream);
cudaError_t lsp_st_shift(const float* in, float* out, int n, int off, cudaStream_t stream);
cudaError_t lsp_st_smem(float* out, int n, int off, cudaStream_t stream);
cudaError_t lsp_st_config(int gx, int gy, int gz, int bx, int by, int bz, size_t smem, int set_attr,
                          cudaStream_t stream);
cudaError_t lsp_st_misuse(int kind, int* out, cudaStream_t stream);
cudaError_t lsp_st_wmma_misaligned(const __nv_bfloat16* A, int off, int lda, float* D, cudaStream_t stream);
cudaError_t lsp_st_reduce(const float* in, float* out, int n, int blocks, cudaStream_t stream);
cudaError_t lsp_st_blocks(int* out, int* counter, unsigned* maxv, int gx, int gy, int gz, int bx, int by, int bz,
                          cudaStream_t stream);
cudaError_t lsp_st_recurse(int depth, int* out, cudaStream_t stream);
// END selftest

#ifdef __cplusplus
}
#endif

#endif
