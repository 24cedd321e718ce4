/*
 * gemm_scalar.c: the portable C path of host.Sgemm, the reference the SIMD
 * paths are tested against. A 4 x 16 microkernel with plain loops; the
 * compiler may vectorise across j, which keeps each element's sum in the
 * same ascending-k order.
 *
 * Limits: written for clarity over speed (a few GFLOP/s).
 */
#include "gemm.h"

enum { SC_MR = 4, SC_NR = 16 };

static void kernel_scalar(ptrdiff_t kc, const float *a, const float *b,
			  float *c, ptrdiff_t ldc, float alpha, float beff,
			  int overwrite)
{
	float acc[SC_MR][SC_NR] = {{0}};
	for (ptrdiff_t k = 0; k < kc; k++) {
		for (int i = 0; i < SC_MR; i++) {
			float ai = a[k * SC_MR + i];
			for (int j = 0; j < SC_NR; j++)
				acc[i][j] += ai * b[k * SC_NR + j];
		}
	}
	for (int i = 0; i < SC_MR; i++) {
		float *ci = c + i * ldc;
		for (int j = 0; j < SC_NR; j++) {
			float t = alpha * acc[i][j];
			ci[j] = overwrite ? t : beff * ci[j] + t;
		}
	}
}

const lsp_gemm_path lsp_gemm_path_scalar = {
	.p = {.mr = SC_MR, .nr = SC_NR, .kc = 256, .mc = 64, .nc = 512},
	.kernel = kernel_scalar, /* the generic packers */
};
