/*
 * gemm_avx2.c: the AVX2+FMA path of host.Sgemm. A 6 x 16 microkernel keeps
 * 12 ymm accumulators in registers, loads two B vectors and broadcasts one A
 * element per row for each k.
 *
 * Limits: x86-64 with AVX2 and FMA (checked by the Go side before use).
 */
#include <immintrin.h>

#include "gemm.h"

enum { A2_MR = 6, A2_NR = 16 };

/* Cache blocking; overridable with -D for tuning runs. The B block of a
 * task (nc x kc floats) is meant for L2, which is smaller on AVX2-only
 * CPUs than on AVX-512 ones. */
#ifndef LSP_A2_KC
#define LSP_A2_KC 256
#endif
#ifndef LSP_A2_MC
#define LSP_A2_MC 96
#endif
#ifndef LSP_A2_NC
#define LSP_A2_NC 256
#endif

__attribute__((target("avx2,fma"))) static void
kernel_avx2(ptrdiff_t kc, const float *a, const float *b, float *c,
	    ptrdiff_t ldc, float alpha, float beff, int overwrite)
{
	__m256 acc[A2_MR][2];
	/* Fetch the C tile while the sums run (see gemm_avx512.c). */
#pragma GCC unroll 6
	for (int i = 0; i < A2_MR; i++) {
		_mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
		_mm_prefetch((const char *)(c + i * ldc + 15), _MM_HINT_T0);
	}
#pragma GCC unroll 6
	for (int i = 0; i < A2_MR; i++) {
		acc[i][0] = _mm256_setzero_ps();
		acc[i][1] = _mm256_setzero_ps();
	}
#pragma GCC unroll 2
	for (ptrdiff_t k = 0; k < kc; k++) {
		__m256 b0 = _mm256_loadu_ps(b);
		__m256 b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
		for (int i = 0; i < A2_MR; i++) {
			__m256 ai = _mm256_broadcast_ss(a + i);
			acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
			acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
		}
		a += A2_MR;
		b += A2_NR;
	}
	__m256 va = _mm256_set1_ps(alpha);
	if (overwrite) {
#pragma GCC unroll 6
		for (int i = 0; i < A2_MR; i++) {
			_mm256_storeu_ps(c + i * ldc, _mm256_mul_ps(va, acc[i][0]));
			_mm256_storeu_ps(c + i * ldc + 8,
					 _mm256_mul_ps(va, acc[i][1]));
		}
		return;
	}
	__m256 vb = _mm256_set1_ps(beff);
#pragma GCC unroll 6
	for (int i = 0; i < A2_MR; i++) {
		float *ci = c + i * ldc;
		__m256 c0 = _mm256_mul_ps(vb, _mm256_loadu_ps(ci));
		__m256 c1 = _mm256_mul_ps(vb, _mm256_loadu_ps(ci + 8));
		_mm256_storeu_ps(ci, _mm256_add_ps(c0, _mm256_mul_ps(va, acc[i][0])));
		_mm256_storeu_ps(ci + 8,
				 _mm256_add_ps(c1, _mm256_mul_ps(va, acc[i][1])));
	}
}

const lsp_gemm_path lsp_gemm_path_avx2 = {
	.p = {.mr = A2_MR, .nr = A2_NR, .kc = LSP_A2_KC, .mc = LSP_A2_MC, .nc = LSP_A2_NC},
	.kernel = kernel_avx2, /* the generic packers */
};
