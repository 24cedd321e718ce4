/*
 * selftest.cu: small kernels that test the CPU simulator itself (compiled
 * only into the simulator tests, through selftest.cc; never part of
 * libkernels.a). Each sits next to its extern "C" launcher, declared in
 * selftest.h. They are written as ordinary CUDA through common.cuh (nvcc
 * compiles this file too), except where a kernel is wrong on purpose: a
 * missing barrier, an off-by-one read, a shared memory overrun, divergent
 * barriers, fragment indexing by position. Shapes: n threads per block,
 * one warp for the wmma kernels, M x N x K for the tiled GEMM.
 *
 * Limits: test code; the launchers validate only what the tests need.
 */
#include "../common.cuh"
#include "selftest.h"

using namespace nvcuda;

/* ---- barrier semantics: out[t] = in[n-1-t] through shared memory ---- */

__global__ void st_reverse_kernel(const float* in, float* out, int n, int use_barrier) {
	__shared__ float s[1024];
	int t = threadIdx.x;
	s[t] = in[t];
	if (use_barrier) __syncthreads(); /* SELFTEST_BARRIER_REVERSE */
	out[t] = s[n - 1 - t];
}

extern "C" cudaError_t lsp_st_reverse(const float* in, float* out, int n, int use_barrier, cudaStream_t stream) {
	if (n < 1 || n > 1024) return cudaErrorInvalidValue;
	LSP_LAUNCH(st_reverse_kernel, 1, n, 0, stream, in, out, n, use_barrier);
	return cudaGetLastError();
}

/* ---- run order: each thread takes a ticket before and after a barrier ---- */

__global__ void st_order_kernel(int* tickets, int* counter) {
	int t = threadIdx.x;
	tickets[t] = atomicAdd(counter, 1);
	__syncthreads();
	tickets[blockDim.x + t] = atomicAdd(counter, 1);
}

extern "C" cudaError_t lsp_st_order(int* tickets, int* counter, int n, cudaStream_t stream) {
	LSP_LAUNCH(st_order_kernel, 1, n, 0, stream, tickets, counter);
	return cudaGetLastError();
}

/* ---- warp shuffles and votes: out[op * n + t] ---- */

__global__ void st_warp_kernel(const int* in, int* out) {
	int t = threadIdx.x, n = blockDim.x, lane = t % 32;
	int v = in[t];
	int k = 0;
	out[k++ * n + t] = __shfl_sync(0xffffffffu, v, (lane * 7 + 3) % 32);
	out[k++ * n + t] = __shfl_sync(0xffffffffu, v, lane + 5, 8);
	out[k++ * n + t] = __shfl_up_sync(0xffffffffu, v, 3);
	out[k++ * n + t] = __shfl_up_sync(0xffffffffu, v, 5, 16);
	out[k++ * n + t] = __shfl_down_sync(0xffffffffu, v, 4);
	out[k++ * n + t] = __shfl_down_sync(0xffffffffu, v, 3, 8);
	out[k++ * n + t] = __shfl_xor_sync(0xffffffffu, v, 5);
	out[k++ * n + t] = __shfl_xor_sync(0xffffffffu, v, 3, 4);
	out[k++ * n + t] = int(__ballot_sync(0xffffffffu, v & 1));
	out[k++ * n + t] = __all_sync(0xffffffffu, v > 0);
	out[k++ * n + t] = __any_sync(0xffffffffu, v > 90);
	out[k++ * n + t] = __reduce_add_sync(0xffffffffu, v);
	float f = __shfl_xor_sync(0xffffffffu, float(v) * 0.5f, 16);
	out[k++ * n + t] = int(f * 2.0f);
	/* Lanes 0-15 only: lane 15 reads lane 16, outside the mask (NaN bytes). */
	int r = -2;
	if (lane < 16) r = __shfl_down_sync(0x0000ffffu, v, 1);
	__syncwarp();
	out[k++ * n + t] = r;
}

extern "C" cudaError_t lsp_st_warp(const int* in, int* out, int n, cudaStream_t stream) {
	if (n % 32 != 0) return cudaErrorInvalidValue;
	LSP_LAUNCH(st_warp_kernel, 1, n, 0, stream, in, out);
	return cudaGetLastError();
}

/* ---- wmma: D = scale (A B + C) (+ bias by position when asked) ---- */

template <typename LA, typename LB>
__global__ void st_wmma_kernel(const __nv_bfloat16* A, int lda, const __nv_bfloat16* B, int ldb, const float* C,
                               int ldc, int c_col, float* D, int ldd, int d_col, float scale, const float* bias) {
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> a;
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> b;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
	wmma::load_matrix_sync(a, A, lda);
	wmma::load_matrix_sync(b, B, ldb);
	wmma::load_matrix_sync(c, C, ldc, c_col ? wmma::mem_col_major : wmma::mem_row_major);
	wmma::mma_sync(c, a, b, c);
	for (int i = 0; i < c.num_elements; i++) c.x[i] *= scale; /* elementwise: fine */
	if (bias) {
		/* Wrong on purpose: assumes lane l holds row l/2, columns (l%2)*8 + i. */
		int lane = threadIdx.x % 32;
		for (int i = 0; i < c.num_elements; i++) c.x[i] += bias[(lane % 2) * 8 + i];
	}
	wmma::store_matrix_sync(D, c, ldd, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

extern "C" cudaError_t lsp_st_wmma(const __nv_bfloat16* A, int a_col, int lda, const __nv_bfloat16* B, int b_col,
                                   int ldb, const float* C, int c_col, int ldc, float* D, int d_col, int ldd,
                                   float scale, const float* bias, cudaStream_t stream) {
	if (!a_col && !b_col) {
		auto k = st_wmma_kernel<wmma::row_major, wmma::row_major>;
		LSP_LAUNCH(k, 1, 32, 0, stream, A, lda, B, ldb, C, ldc, c_col, D, ldd, d_col, scale, bias);
	} else if (!a_col && b_col) {
		auto k = st_wmma_kernel<wmma::row_major, wmma::col_major>;
		LSP_LAUNCH(k, 1, 32, 0, stream, A, lda, B, ldb, C, ldc, c_col, D, ldd, d_col, scale, bias);
	} else if (a_col && !b_col) {
		auto k = st_wmma_kernel<wmma::col_major, wmma::row_major>;
		LSP_LAUNCH(k, 1, 32, 0, stream, A, lda, B, ldb, C, ldc, c_col, D, ldd, d_col, scale, bias);
	} else {
		auto k = st_wmma_kernel<wmma::col_major, wmma::col_major>;
		LSP_LAUNCH(k, 1, 32, 0, stream, A, lda, B, ldb, C, ldc, c_col, D, ldd, d_col, scale, bias);
	}
	return cudaGetLastError();
}

/* ---- a tiled tensor-core GEMM: C[M][N] = A[M][K] B[K][N], all row-major,
 * M, N multiples of 64 and K of 32. 128 threads; each warp owns 32 x 32. ---- */

__global__ void __launch_bounds__(128) st_gemm_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int N,
                                                      int K) {
	__shared__ __align__(32) __nv_bfloat16 As[64][32 + 16];
	__shared__ __align__(32) __nv_bfloat16 Bs[32][64 + 16];
	int t = threadIdx.x, warp = t / 32;
	int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
	int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
	for (int k0 = 0; k0 < K; k0 += 32) {
		for (int e = t; e < 64 * 32; e += 128) As[e / 32][e % 32] = A[size_t(m0 + e / 32) * K + k0 + e % 32];
		for (int e = t; e < 32 * 64; e += 128) Bs[e / 64][e % 64] = B[size_t(k0 + e / 64) * N + n0 + e % 64];
		__syncthreads(); /* SELFTEST_BARRIER_GEMM_LOADED */
		for (int kk = 0; kk < 32; kk += 16) {
			wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
			wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b[2];
			for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], &As[wm + 16 * i][kk], 32 + 16);
			for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], &Bs[kk][wn + 16 * j], 64 + 16);
			for (int i = 0; i < 2; i++)
				for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
		}
		__syncthreads(); /* SELFTEST_BARRIER_GEMM_CONSUMED */
	}
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			wmma::store_matrix_sync(&C[size_t(m0 + wm + 16 * i) * N + n0 + wn + 16 * j], acc[i][j], N,
			                        wmma::mem_row_major);
}

extern "C" cudaError_t lsp_st_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N, int K,
                                   cudaStream_t stream) {
	if (M <= 0 || N <= 0 || K <= 0 || M % 64 || N % 64 || K % 32) return cudaErrorInvalidValue;
	LSP_LAUNCH(st_gemm_kernel, dim3(N / 64, M / 64), 128, 0, stream, A, B, C, N, K);
	return cudaGetLastError();
}

/* ---- out-of-bounds reads: out[t] = in[t + off] for t < n ---- */

__global__ void st_shift_kernel(const float* in, float* out, int n, int off) {
	int t = blockIdx.x * blockDim.x + threadIdx.x;
	if (t < n) out[t] = in[t + off];
}

extern "C" cudaError_t lsp_st_shift(const float* in, float* out, int n, int off, cudaStream_t stream) {
	LSP_LAUNCH(st_shift_kernel, (n + 127) / 128, 128, 0, stream, in, out, n, off);
	return cudaGetLastError();
}

/* ---- dynamic shared memory: n floats; thread t writes s[t + off], then
 * out[t] = what s[t] held before (poison) and after ---- */

__global__ void st_smem_kernel(float* out, int n, int off) {
	LSP_DYN_SMEM(float, s);
	int t = threadIdx.x;
	float before = s[t];
	__syncthreads();
	s[t + off] = float(t);
	__syncthreads();
	out[t] = before;
	out[n + t] = s[t];
}

extern "C" cudaError_t lsp_st_smem(float* out, int n, int off, cudaStream_t stream) {
	LSP_LAUNCH(st_smem_kernel, 1, n, size_t(n) * sizeof(float), stream, out, n, off);
	return cudaGetLastError();
}

/* ---- launch configurations: a kernel that writes nothing ---- */

__global__ void st_nop_kernel(int* out) {
	LSP_DYN_SMEM(unsigned char, s);
	if (out && threadIdx.x == 0 && blockIdx.x == 0) out[0] = s[0];
}

extern "C" cudaError_t lsp_st_config(int gx, int gy, int gz, int bx, int by, int bz, size_t smem, int set_attr,
                                     cudaStream_t stream) {
	if (set_attr > 0) {
		cudaError_t e = cudaFuncSetAttribute(st_nop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, set_attr);
		if (e != cudaSuccess) return e;
	}
	LSP_LAUNCH(st_nop_kernel, dim3(gx, gy, gz), dim3(bx, by, bz), smem, stream, (int*)nullptr);
	return cudaGetLastError();
}

/* ---- misuse that must be reported by the launch ---- */

__global__ void st_misuse_kernel(int kind, int* out) {
	int t = threadIdx.x;
	switch (kind) {
	case 0: /* divergent barriers */
		if (t < 32) __syncthreads();
		__syncthreads();
		break;
	case 1: /* early return before a barrier */
		if (t >= 16) return;
		__syncthreads();
		break;
	case 2: /* lanes disagree on the mask */
		out[t] = __shfl_sync(t % 32 < 16 ? 0x0000ffffu : 0xffffffffu, t, 0);
		break;
	case 3: /* calling lane not in the mask */
		out[t] = __shfl_sync(0x0000ffffu, t, 0);
		break;
	case 4: /* a lane returns while the others wait in a shuffle */
		if (t == 5) return;
		out[t] = __shfl_sync(0xffffffffu, t, 0);
		break;
	case 5: /* a barrier while another lane waits in a shuffle naming this one */
		if (t == 0) out[t] = __shfl_sync(0xffffffffu, t, 0);
		else __syncthreads();
		break;
	}
}

extern "C" cudaError_t lsp_st_misuse(int kind, int* out, cudaStream_t stream) {
	LSP_LAUNCH(st_misuse_kernel, 1, 64, 0, stream, kind, out);
	return cudaGetLastError();
}

/* ---- misaligned wmma: the pointer is offset by off elements ---- */

__global__ void st_wmma_misaligned_kernel(const __nv_bfloat16* A, int off, int lda, float* D) {
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
	wmma::fill_fragment(c, 0.0f);
	wmma::load_matrix_sync(a, A + off, lda);
	wmma::load_matrix_sync(b, A + off, lda);
	wmma::mma_sync(c, a, b, c);
	wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

extern "C" cudaError_t lsp_st_wmma_misaligned(const __nv_bfloat16* A, int off, int lda, float* D,
                                              cudaStream_t stream) {
	LSP_LAUNCH(st_wmma_misaligned_kernel, 1, 32, 0, stream, A, off, lda, D);
	return cudaGetLastError();
}

/* ---- deterministic block reduction: out[b] = sum of in[b*n .. b*n+n) in a
 * fixed order (strided partial sums, xor-shuffle tree, warp sums in smem) ---- */

__global__ void st_reduce_kernel(const float* in, float* out, int n) {
	__shared__ float warp_sums[32];
	const float* x = in + size_t(blockIdx.x) * n;
	int t = threadIdx.x, lane = t % 32, warp = t / 32, nwarps = blockDim.x / 32;
	float s = 0.0f;
	for (int i = t; i < n; i += blockDim.x) s += x[i] * 1.0009765625f + 0.1f;
	for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
	if (lane == 0) warp_sums[warp] = s;
	__syncthreads();
	if (warp == 0) {
		float w = lane < nwarps ? warp_sums[lane] : 0.0f;
		for (int o = 16; o > 0; o /= 2) w += __shfl_xor_sync(0xffffffffu, w, o);
		if (lane == 0) out[blockIdx.x] = w;
	}
}

extern "C" cudaError_t lsp_st_reduce(const float* in, float* out, int n, int blocks, cudaStream_t stream) {
	LSP_LAUNCH(st_reduce_kernel, blocks, 256, 0, stream, in, out, n);
	return cudaGetLastError();
}

/* ---- static shared memory is per block; 3-D coordinates; atomics ---- */

__global__ void st_blocks_kernel(int* out, int* counter, unsigned* maxv) {
	__shared__ int tag;
	int nthreads = blockDim.x * blockDim.y * blockDim.z;
	int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
	int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
	if (t == 0) tag = b;
	__syncthreads();
	int seen = tag;
	int cnt = __syncthreads_count(threadIdx.y == 1);
	int all = __syncthreads_and(threadIdx.z < blockDim.z);
	int any = __syncthreads_or(t == nthreads - 1 && b == 0);
	out[(size_t)b * nthreads + t] = seen * 1000000 + cnt * 1000 + all * 10 + any;
	atomicAdd(counter, 1);
	atomicMax(maxv, unsigned(b * nthreads + t));
}

extern "C" cudaError_t lsp_st_blocks(int* out, int* counter, unsigned* maxv, int gx, int gy, int gz, int bx, int by,
                                     int bz, cudaStream_t stream) {
	LSP_LAUNCH(st_blocks_kernel, dim3(gx, gy, gz), dim3(bx, by, bz), 0, stream, out, counter, maxv);
	return cudaGetLastError();
}

/* ---- a fiber stack overflow (deep recursion with a large frame) ---- */

__device__ int st_deep(int depth, volatile int* sink) {
	volatile int pad[1024];
	pad[depth % 1024] = depth;
	if (depth == 0) return pad[0];
	int r = st_deep(depth - 1, sink) + pad[depth % 1024];
	*sink = r;
	return r;
}

__global__ void st_recurse_kernel(int depth, int* out) {
	out[threadIdx.x] = st_deep(depth, out + threadIdx.x);
}

extern "C" cudaError_t lsp_st_recurse(int depth, int* out, cudaStream_t stream) {
	LSP_LAUNCH(st_recurse_kernel, 1, 1, 0, stream, depth, out);
	return cudaGetLastError();
}
