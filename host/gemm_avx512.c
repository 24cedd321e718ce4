/*
 * gemm_avx512.c: the AVX-512F path of host.Sgemm. A 14 x 32 microkernel
 * keeps 28 zmm accumulators in registers, loads two B vectors and
 * broadcasts one A element per row for each k; packing transposes 16 x 16
 * blocks in registers. (8 x 48, 12 x 32 and 6 x 64 tiles measured slower on
 * a Sapphire Rapids VM.)
 *
 * Limits: x86-64 with AVX-512F (checked by the Go side before use).
 */
#include <immintrin.h>

#include "gemm.h"

/* Microtile A5_MR x A5_NR, A5_NR = 16*A5_NV; overridable with -D for
 * tuning runs (A5_MR <= 16, A5_MR*A5_NV + A5_NV + 1 <= 32 registers). */
#ifndef LSP_A5_MR
#define LSP_A5_MR 14
#endif
#ifndef LSP_A5_NV
#define LSP_A5_NV 2
#endif
enum { A5_MR = LSP_A5_MR, A5_NV = LSP_A5_NV, A5_NR = 16 * LSP_A5_NV };

/* Cache blocking; overridable with -D for tuning runs. */
#ifndef LSP_A5_KC
#define LSP_A5_KC 256
#endif
#ifndef LSP_A5_MC
#define LSP_A5_MC 168
#endif
#ifndef LSP_A5_NC
#define LSP_A5_NC 768
#endif

__attribute__((target("avx512f"))) static void
kernel_avx512(ptrdiff_t kc, const float *a, const float *b, float *c,
	      ptrdiff_t ldc, float alpha, float beff, int overwrite)
{
	__m512 acc[A5_MR][A5_NV];
	/* C is touched once per K-block, usually from L3 or memory: start
	 * fetching the tile now so it is in L1 when the sums are done. */
#pragma GCC unroll 16
	for (int i = 0; i < A5_MR; i++)
#pragma GCC unroll 4
		for (int v = 0; v < A5_NV; v++)
			_mm_prefetch((const char *)(c + i * ldc + 16 * v),
				     _MM_HINT_T0);
#pragma GCC unroll 16
	for (int i = 0; i < A5_MR; i++)
#pragma GCC unroll 4
		for (int v = 0; v < A5_NV; v++)
			acc[i][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
	for (ptrdiff_t k = 0; k < kc; k++) {
		__m512 bv[A5_NV];
#pragma GCC unroll 4
		for (int v = 0; v < A5_NV; v++)
			bv[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 16
		for (int i = 0; i < A5_MR; i++) {
			__m512 ai = _mm512_set1_ps(a[i]);
#pragma GCC unroll 4
			for (int v = 0; v < A5_NV; v++)
				acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
		}
		a += A5_MR;
		b += A5_NR;
	}
	__m512 va = _mm512_set1_ps(alpha);
	if (overwrite) {
#pragma GCC unroll 16
		for (int i = 0; i < A5_MR; i++)
#pragma GCC unroll 4
			for (int v = 0; v < A5_NV; v++)
				_mm512_storeu_ps(c + i * ldc + 16 * v,
						 _mm512_mul_ps(va, acc[i][v]));
		return;
	}
	__m512 vb = _mm512_set1_ps(beff);
#pragma GCC unroll 16
	for (int i = 0; i < A5_MR; i++) {
#pragma GCC unroll 4
		for (int v = 0; v < A5_NV; v++) {
			float *ci = c + i * ldc + 16 * v;
			__m512 cv = _mm512_mul_ps(vb, _mm512_loadu_ps(ci));
			_mm512_storeu_ps(
				ci, _mm512_add_ps(cv, _mm512_mul_ps(va, acc[i][v])));
		}
	}
}

/* tr16 transposes the 16 x 16 block r in place: r[c][i] = old r[i][c]. */
__attribute__((target("avx512f"))) static inline void tr16(__m512 r[16])
{
	__m512 t[16];
	/* Pairs of rows interleaved within 128-bit lanes. */
	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	/* u[g][j], lane L: column 4L+j of rows 4g..4g+3. */
	__m512 u[4][4];
	for (int g = 0; g < 4; g++) {
		__m512d a = _mm512_castps_pd(t[4 * g]);
		__m512d b = _mm512_castps_pd(t[4 * g + 2]);
		__m512d c = _mm512_castps_pd(t[4 * g + 1]);
		__m512d d = _mm512_castps_pd(t[4 * g + 3]);
		u[g][0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
		u[g][1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
		u[g][2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
		u[g][3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
	}
	/* A 4 x 4 transpose of 128-bit lanes for each j. */
	for (int j = 0; j < 4; j++) {
		__m512 s0 = _mm512_shuffle_f32x4(u[0][j], u[1][j], 0x44);
		__m512 s1 = _mm512_shuffle_f32x4(u[0][j], u[1][j], 0xEE);
		__m512 s2 = _mm512_shuffle_f32x4(u[2][j], u[3][j], 0x44);
		__m512 s3 = _mm512_shuffle_f32x4(u[2][j], u[3][j], 0xEE);
		r[j] = _mm512_shuffle_f32x4(s0, s2, 0x88);
		r[4 + j] = _mm512_shuffle_f32x4(s0, s2, 0xDD);
		r[8 + j] = _mm512_shuffle_f32x4(s1, s3, 0x88);
		r[12 + j] = _mm512_shuffle_f32x4(s1, s3, 0xDD);
	}
}

/* tr_rows packs k in [0, kc) of n <= 16 rows src[i*ld + k] into
 * dst[k*dstride + i] for i < 16 (rows past n are zero), writing only the
 * lanes in keep. */
__attribute__((target("avx512f"))) static void
tr_rows(const float *src, ptrdiff_t ld, int n, ptrdiff_t kc, float *dst,
	ptrdiff_t dstride, __mmask16 keep)
{
	__m512 r[16];
	for (ptrdiff_t k = 0; k < kc; k += 16) {
		ptrdiff_t w = kc - k < 16 ? kc - k : 16;
		__mmask16 m = (__mmask16)((1u << w) - 1);
		for (int i = 0; i < 16; i++)
			r[i] = i < n ? _mm512_maskz_loadu_ps(m, src + i * ld + k)
				     : _mm512_setzero_ps();
		tr16(r);
		for (ptrdiff_t c = 0; c < w; c++)
			_mm512_mask_storeu_ps(dst + (k + c) * dstride, keep,
					      r[c]);
	}
}

__attribute__((target("avx512f"))) static void
pack_a_avx512(int transA, const float *A, ptrdiff_t lda, ptrdiff_t i0,
	      ptrdiff_t mrows, ptrdiff_t k0, ptrdiff_t kc, float *ap)
{
	const __mmask16 keep = (1u << A5_MR) - 1;
	const ptrdiff_t npan = (mrows + A5_MR - 1) / A5_MR;
	if (transA) {
		/* op(A)[r][k] = A[k][r]: walk each row of A once (rows of A
		 * are far apart, so going down a column strip would miss). */
		for (ptrdiff_t k = 0; k < kc; k++) {
			const float *src = A + (k0 + k) * lda + i0;
			for (ptrdiff_t q = 0; q < npan; q++) {
				ptrdiff_t rows = mrows - q * A5_MR;
				__mmask16 m = rows >= A5_MR
						      ? keep
						      : (__mmask16)((1u << rows) - 1);
				_mm512_mask_storeu_ps(
					ap + q * kc * A5_MR + k * A5_MR, keep,
					_mm512_maskz_loadu_ps(m, src + q * A5_MR));
			}
		}
		return;
	}
	/* op(A)[r][k] = A[r][k]: transpose 14 rows at a time. */
	for (ptrdiff_t q = 0; q < npan; q++) {
		ptrdiff_t rows = mrows - q * A5_MR;
		if (rows > A5_MR)
			rows = A5_MR;
		tr_rows(A + (i0 + q * A5_MR) * lda + k0, lda, (int)rows, kc,
			ap + q * kc * A5_MR, A5_MR, keep);
	}
}

__attribute__((target("avx512f"))) static void
pack_b_avx512(int transB, const float *B, ptrdiff_t ldb, ptrdiff_t j0,
	      ptrdiff_t ncols, ptrdiff_t p0, ptrdiff_t p1, ptrdiff_t k0,
	      ptrdiff_t kc, float *bp)
{
	if (!transB) {
		/* op(B)[k][c] = B[k][c]: walk each row of B once, dealing
		 * nr floats to each panel. */
		for (ptrdiff_t k = 0; k < kc; k++) {
			const float *src = B + (k0 + k) * ldb + j0;
			for (ptrdiff_t p = p0; p < p1; p++) {
				ptrdiff_t cols = ncols - p * A5_NR;
				float *d = bp + p * kc * A5_NR + k * A5_NR;
				const float *s = src + p * A5_NR;
				for (int v = 0; v < A5_NV; v++) {
					ptrdiff_t n = cols - 16 * v;
					__mmask16 m = n >= 16 ? 0xFFFF
						      : n <= 0 ? 0
							       : (__mmask16)((1u << n) - 1);
					_mm512_storeu_ps(
						d + 16 * v,
						_mm512_maskz_loadu_ps(m, s + 16 * v));
				}
			}
		}
		return;
	}
	/* op(B)[k][c] = B[c][k]: transpose 16 rows of B at a time. */
	for (ptrdiff_t p = p0; p < p1; p++) {
		float *dst = bp + p * kc * A5_NR;
		ptrdiff_t cols = ncols - p * A5_NR;
		const float *src = B + (j0 + p * A5_NR) * ldb + k0;
		for (int v = 0; v < A5_NV; v++) {
			ptrdiff_t n = cols - 16 * v;
			n = n < 0 ? 0 : n > 16 ? 16 : n;
			/* n == 0 only writes zeros; keep src in bounds. */
			tr_rows(n ? src + 16 * v * ldb : src, ldb, (int)n, kc,
				dst + 16 * v, A5_NR, 0xFFFF);
		}
	}
}

const lsp_gemm_path lsp_gemm_path_avx512 = {
	.p = {.mr = A5_MR, .nr = A5_NR, .kc = LSP_A5_KC, .mc = LSP_A5_MC, .nc = LSP_A5_NC},
	.kernel = kernel_avx512,
	.pack_a = pack_a_avx512,
	.pack_b = pack_b_avx512,
};
