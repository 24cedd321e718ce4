/*
 * sparse.c: the LSP sparse-projection cores (see sparse.h) on three paths:
 * scalar (portable C, the reference and the fallback), AVX2 and AVX-512F,
 * the SIMD ones compiled with function target attributes, as in gemm_*.c.
 *
 * How each core is vectorised, always across independent outputs:
 *
 *   gather: a tile of W tokens (W = 64 on AVX-512, 32 on AVX2) of x is
 *     transposed into xT [rows][W] with register transposes, so that
 *     x[t, i] for the tile's tokens is one contiguous run; then each output
 *     column c sums val[k] * xT[idx[k]][0:W] over its entries k in their
 *     own order, four vectors of tokens at once. Outputs are stored by rows
 *     when tokens are contiguous in out (st == 1), else through a [d][W]
 *     tile transposed back (sa == 1) or element by element.
 *   S: a 6-row by 64-column (AVX-512; 6 by 16 on AVX2) register tile of
 *     sums, one A element broadcast per row and t, B rows loaded as vectors.
 *   apply W: each row's update in 64 (32) column chunks, one pval broadcast
 *     and one T row chunk per entry.
 *
 * Exactness: contraction of a*b+c into an FMA is switched off for this
 * file (GCC fuses even _mm512_mul_ps/_mm512_add_ps otherwise), every
 * product is rounded before its add, every sum starts from +0 and runs in
 * the scalar path's order, and lanes past the data compute on zeros and
 * are never stored. So all paths give the same bits, for any split of the
 * work into calls.
 *
 * Limits: x86-64 for the SIMD paths (checked by the Go side before use);
 * no argument checking (sparse.go does it).
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>
#include <string.h>

#include "sparse.h"

#define INL static inline __attribute__((always_inline))
#define T512 __attribute__((target("avx512f")))
#define T256 __attribute__((target("avx2")))

/* Tile widths (tokens) of the gather and column chunks of S and apply W. */
enum { W512 = 64, W256 = 32, S512_MR = 6, S256_MR = 6 };

static ptrdiff_t min_pd(ptrdiff_t a, ptrdiff_t b) { return a < b ? a : b; }

/* Entries [*k0, *k1) of output c. */
INL void entries(const int32_t *ptr, ptrdiff_t r, ptrdiff_t c, ptrdiff_t *k0,
		 ptrdiff_t *k1)
{
	if (ptr != NULL) {
		*k0 = ptr[c];
		*k1 = ptr[c + 1];
	} else {
		*k0 = c * r;
		*k1 = (c + 1) * r;
	}
}

/* ---------------------------------------------------------------- scalar */

static void gather_scalar(float *out, const float *x, ptrdiff_t rows,
			  const int32_t *ptr, ptrdiff_t r, const int32_t *idx,
			  const float *val, ptrdiff_t d, ptrdiff_t sa,
			  ptrdiff_t st, ptrdiff_t lo, ptrdiff_t hi)
{
	for (ptrdiff_t t = lo; t < hi; t++) {
		const float *xt = x + t * rows;
		for (ptrdiff_t c = 0; c < d; c++) {
			ptrdiff_t k0, k1;
			entries(ptr, r, c, &k0, &k1);
			float acc = 0.0f;
			for (ptrdiff_t k = k0; k < k1; k++)
				acc = acc + val[k] * xt[idx[k]];
			out[c * sa + t * st] = acc;
		}
	}
}

enum { SC_NB = 64 };

static void s_scalar(float *S, const float *A, const float *B, ptrdiff_t BT,
		     ptrdiff_t d, int accumulate, ptrdiff_t lo, ptrdiff_t hi)
{
	float acc[SC_NB];
	for (ptrdiff_t a = lo; a < hi; a++) {
		for (ptrdiff_t b0 = 0; b0 < d; b0 += SC_NB) {
			ptrdiff_t nb = min_pd(SC_NB, d - b0);
			for (ptrdiff_t b = 0; b < nb; b++)
				acc[b] = 0.0f;
			for (ptrdiff_t t = 0; t < BT; t++) {
				float x = A[a * BT + t];
				const float *bt = B + t * d + b0;
				for (ptrdiff_t b = 0; b < nb; b++)
					acc[b] = acc[b] + x * bt[b];
			}
			float *sa = S + a * d + b0;
			for (ptrdiff_t b = 0; b < nb; b++)
				sa[b] = accumulate ? acc[b] + sa[b] : acc[b];
		}
	}
}

static void apply_w_scalar(float *w, const float *T, const int32_t *pidx,
			   const float *pval, ptrdiff_t n, ptrdiff_t r,
			   float decay, ptrdiff_t lo, ptrdiff_t hi)
{
	float upd[SC_NB];
	for (ptrdiff_t i = lo; i < hi; i++) {
		for (ptrdiff_t j0 = 0; j0 < n; j0 += SC_NB) {
			ptrdiff_t nj = min_pd(SC_NB, n - j0);
			for (ptrdiff_t j = 0; j < nj; j++)
				upd[j] = 0.0f;
			for (ptrdiff_t s = 0; s < r; s++) {
				float p = pval[i * r + s];
				const float *ts = T + pidx[i * r + s] * n + j0;
				for (ptrdiff_t j = 0; j < nj; j++)
					upd[j] = upd[j] + p * ts[j];
			}
			float *wi = w + i * n + j0;
			for (ptrdiff_t j = 0; j < nj; j++)
				wi[j] = decay * wi[j] + upd[j];
		}
	}
}

/* --------------------------------------------------------------- AVX-512 */

/* Transposes the 16 x 16 block in r (r[i] is row i) in place. */
T512 INL void tr16(__m512 r[16])
{
	__m512 t[16];
#pragma GCC unroll 8
	for (int i = 0; i < 16; i += 2) {
		t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
		t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
	}
	/* r[4q+j]: rows 4q..4q+3, column 4L+j of each 128-bit lane L. */
#pragma GCC unroll 4
	for (int q = 0; q < 16; q += 4) {
		r[q] = _mm512_shuffle_ps(t[q], t[q + 2], 0x44);
		r[q + 1] = _mm512_shuffle_ps(t[q], t[q + 2], 0xee);
		r[q + 2] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0x44);
		r[q + 3] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0xee);
	}
	/* t[h+j]: columns j, j+8 (h = 0) or j+4, j+12 (h = 4) of rows 0..7,
	 * and t[8+h+j] the same of rows 8..15. */
#pragma GCC unroll 4
	for (int j = 0; j < 4; j++) {
		t[j] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0x88);
		t[j + 4] = _mm512_shuffle_f32x4(r[j], r[j + 4], 0xdd);
		t[j + 8] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0x88);
		t[j + 12] = _mm512_shuffle_f32x4(r[j + 8], r[j + 12], 0xdd);
	}
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++) {
		r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
		r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
	}
}

/* The low n lanes (n clamped to [0, 16]). */
static __mmask16 mask16(ptrdiff_t n)
{
	if (n <= 0)
		return 0;
	if (n >= 16)
		return 0xffff;
	return (__mmask16)((1u << n) - 1);
}

/* Transposes the block src[j*ss + i] (j < nj rows, i < ni columns; the rest
 * read as zero) into dst[i*ds + j] for i < ni, all 16 j. */
T512 INL void tr_block512(const float *src, ptrdiff_t ss, ptrdiff_t nj,
			  ptrdiff_t ni, float *dst, ptrdiff_t ds)
{
	__mmask16 m = mask16(ni);
	__m512 v[16];
#pragma GCC unroll 16
	for (int j = 0; j < 16; j++)
		v[j] = j < nj ? _mm512_maskz_loadu_ps(m, src + j * ss)
			      : _mm512_setzero_ps();
	tr16(v);
#pragma GCC unroll 16
	for (int i = 0; i < 16; i++)
		if (i < ni)
			_mm512_storeu_ps(dst + i * ds, v[i]);
}

/* The same with a masked store of nd lanes of each output row. */
T512 INL void tr_block512_out(const float *src, ptrdiff_t ss, ptrdiff_t nj,
			      ptrdiff_t ni, float *dst, ptrdiff_t ds,
			      __mmask16 md)
{
	__m512 v[16];
#pragma GCC unroll 16
	for (int j = 0; j < 16; j++)
		v[j] = j < nj ? _mm512_loadu_ps(src + j * ss)
			      : _mm512_setzero_ps();
	tr16(v);
#pragma GCC unroll 16
	for (int i = 0; i < 16; i++)
		if (i < ni)
			_mm512_mask_storeu_ps(dst + i * ds, md, v[i]);
}

T512 static void gather_avx512(float *out, const float *x, ptrdiff_t rows,
			       const int32_t *ptr, ptrdiff_t r,
			       const int32_t *idx, const float *val,
			       ptrdiff_t d, ptrdiff_t sa, ptrdiff_t st,
			       ptrdiff_t lo, ptrdiff_t hi, float *scratch)
{
	float *xT = scratch, *res = scratch + rows * W512;
	for (ptrdiff_t t0 = lo; t0 < hi; t0 += W512) {
		ptrdiff_t nt = min_pd(W512, hi - t0);
		const float *xt = x + t0 * rows;
		/* xT[i*W + l] = x[t0+l, i], zero for tokens past nt. */
		for (ptrdiff_t l0 = 0; l0 < W512; l0 += 16)
			for (ptrdiff_t i0 = 0; i0 < rows; i0 += 16)
				tr_block512(xt + l0 * rows + i0, rows, nt - l0,
					    min_pd(16, rows - i0),
					    xT + i0 * W512 + l0, W512);
		__mmask16 m[4];
		for (int v = 0; v < 4; v++)
			m[v] = mask16(nt - 16 * v);
		float *ot = out + t0 * st;
		for (ptrdiff_t c = 0; c < d; c++) {
			ptrdiff_t k0, k1;
			entries(ptr, r, c, &k0, &k1);
			__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
			for (ptrdiff_t k = k0; k < k1; k++) {
				const float *p = xT + (ptrdiff_t)idx[k] * W512;
				__m512 v = _mm512_set1_ps(val[k]);
				a0 = _mm512_add_ps(a0, _mm512_mul_ps(v, _mm512_loadu_ps(p)));
				a1 = _mm512_add_ps(a1, _mm512_mul_ps(v, _mm512_loadu_ps(p + 16)));
				a2 = _mm512_add_ps(a2, _mm512_mul_ps(v, _mm512_loadu_ps(p + 32)));
				a3 = _mm512_add_ps(a3, _mm512_mul_ps(v, _mm512_loadu_ps(p + 48)));
			}
			float *o = st == 1 ? ot + c * sa : res + c * W512;
			__mmask16 full = 0xffff;
			_mm512_mask_storeu_ps(o, st == 1 ? m[0] : full, a0);
			_mm512_mask_storeu_ps(o + 16, st == 1 ? m[1] : full, a1);
			_mm512_mask_storeu_ps(o + 32, st == 1 ? m[2] : full, a2);
			_mm512_mask_storeu_ps(o + 48, st == 1 ? m[3] : full, a3);
		}
		if (st == 1)
			continue;
		if (sa == 1) {
			/* out[(t0+l)*st + c] = res[c*W + l], by 16 x 16 blocks. */
			for (ptrdiff_t c0 = 0; c0 < d; c0 += 16)
				for (ptrdiff_t l0 = 0; l0 < nt; l0 += 16)
					tr_block512_out(res + c0 * W512 + l0, W512,
							d - c0, min_pd(16, nt - l0),
							ot + l0 * st + c0, st,
							mask16(d - c0));
			continue;
		}
		for (ptrdiff_t c = 0; c < d; c++)
			for (ptrdiff_t l = 0; l < nt; l++)
				ot[c * sa + l * st] = res[c * W512 + l];
	}
}

/* Rows [0, mr) x columns [0, 16*nv) of S (S points at row a0, column b0),
 * the last vector masked by lm. */
T512 INL void s_tile512(const int mr, const int nv, float *S, const float *A,
			const float *B, ptrdiff_t BT, ptrdiff_t d,
			int accumulate, __mmask16 lm)
{
	__m512 acc[S512_MR][4];
#pragma GCC unroll 6
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			acc[i][v] = _mm512_setzero_ps();
	for (ptrdiff_t t = 0; t < BT; t++) {
		const float *bt = B + t * d;
		__m512 bv[4];
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			bv[v] = v == nv - 1 ? _mm512_maskz_loadu_ps(lm, bt + 16 * v)
					    : _mm512_loadu_ps(bt + 16 * v);
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			__m512 x = _mm512_set1_ps(A[i * BT + t]);
#pragma GCC unroll 4
			for (int v = 0; v < nv; v++)
				acc[i][v] = _mm512_add_ps(acc[i][v], _mm512_mul_ps(x, bv[v]));
		}
	}
#pragma GCC unroll 6
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++) {
			float *sp = S + i * d + 16 * v;
			__mmask16 m = v == nv - 1 ? lm : 0xffff;
			__m512 s = acc[i][v];
			if (accumulate)
				s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, sp));
			_mm512_mask_storeu_ps(sp, m, s);
		}
}

#define S_CASE(MR, NV, fn)                                                    \
	case MR * 8 + NV:                                                     \
		fn(MR, NV, Sp, Ap, Bp, BT, d, accumulate, lm);                \
		break;
#define S_CASES(MR, fn)                                                       \
	S_CASE(MR, 1, fn) S_CASE(MR, 2, fn) S_CASE(MR, 3, fn) S_CASE(MR, 4, fn)

T512 static void s_avx512(float *S, const float *A, const float *B,
			  ptrdiff_t BT, ptrdiff_t d, int accumulate,
			  ptrdiff_t lo, ptrdiff_t hi)
{
	/* Column chunks outer: a BT x 64 chunk of B stays in L2 while all the
	 * row tiles pass over it. */
	for (ptrdiff_t b0 = 0; b0 < d; b0 += 64) {
		ptrdiff_t nb = min_pd(64, d - b0);
		int nv = (int)(nb + 15) / 16;
		__mmask16 lm = mask16(nb - 16 * (nv - 1));
		for (ptrdiff_t a0 = lo; a0 < hi; a0 += S512_MR) {
			int mr = (int)min_pd(S512_MR, hi - a0);
			float *Sp = S + a0 * d + b0;
			const float *Ap = A + a0 * BT, *Bp = B + b0;
			switch (mr * 8 + nv) {
				S_CASES(1, s_tile512)
				S_CASES(2, s_tile512)
				S_CASES(3, s_tile512)
				S_CASES(4, s_tile512)
				S_CASES(5, s_tile512)
				S_CASES(6, s_tile512)
			}
		}
	}
}

T512 static void apply_w_avx512(float *w, const float *T, const int32_t *pidx,
				const float *pval, ptrdiff_t n, ptrdiff_t r,
				float decay, ptrdiff_t lo, ptrdiff_t hi)
{
	__m512 dec = _mm512_set1_ps(decay);
	for (ptrdiff_t i = lo; i < hi; i++) {
		const int32_t *pi = pidx + i * r;
		const float *pv = pval + i * r;
		for (ptrdiff_t j0 = 0; j0 < n; j0 += 64) {
			__mmask16 m[4];
			for (int v = 0; v < 4; v++)
				m[v] = mask16(n - j0 - 16 * v);
			__m512 acc[4];
#pragma GCC unroll 4
			for (int v = 0; v < 4; v++)
				acc[v] = _mm512_setzero_ps();
			for (ptrdiff_t s = 0; s < r; s++) {
				__m512 p = _mm512_set1_ps(pv[s]);
				const float *ts = T + (ptrdiff_t)pi[s] * n + j0;
#pragma GCC unroll 4
				for (int v = 0; v < 4; v++)
					acc[v] = _mm512_add_ps(acc[v], _mm512_mul_ps(p, _mm512_maskz_loadu_ps(m[v], ts + 16 * v)));
			}
			float *wi = w + i * n + j0;
#pragma GCC unroll 4
			for (int v = 0; v < 4; v++) {
				__m512 x = _mm512_maskz_loadu_ps(m[v], wi + 16 * v);
				x = _mm512_add_ps(_mm512_mul_ps(dec, x), acc[v]);
				_mm512_mask_storeu_ps(wi + 16 * v, m[v], x);
			}
		}
	}
}

/* ------------------------------------------------------------------ AVX2 */

/* Transposes the 8 x 8 block in r in place. */
T256 INL void tr8(__m256 r[8])
{
	__m256 t[8];
#pragma GCC unroll 4
	for (int i = 0; i < 8; i += 2) {
		t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
		t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
	}
	/* r[4q+j]: rows 4q..4q+3, column 4L+j of each 128-bit lane L. */
#pragma GCC unroll 2
	for (int q = 0; q < 8; q += 4) {
		r[q] = _mm256_shuffle_ps(t[q], t[q + 2], 0x44);
		r[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], 0xee);
		r[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0x44);
		r[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0xee);
	}
#pragma GCC unroll 4
	for (int j = 0; j < 4; j++) {
		t[j] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x20);
		t[j + 4] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x31);
	}
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		r[j] = t[j];
}

/* The low n lanes as a maskload/maskstore mask (n clamped to [0, 8]). */
T256 INL __m256i mask8(ptrdiff_t n)
{
	int k = n <= 0 ? 0 : n >= 8 ? 8 : (int)n;
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(k),
				  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* As tr_block512, 8 x 8, with an output lane mask md. */
T256 INL void tr_block256(const float *src, ptrdiff_t ss, ptrdiff_t nj,
			  ptrdiff_t ni, float *dst, ptrdiff_t ds, __m256i md)
{
	__m256i m = mask8(ni);
	__m256 v[8];
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		v[j] = j < nj ? _mm256_maskload_ps(src + j * ss, m)
			      : _mm256_setzero_ps();
	tr8(v);
#pragma GCC unroll 8
	for (int i = 0; i < 8; i++)
		if (i < ni)
			_mm256_maskstore_ps(dst + i * ds, md, v[i]);
}

T256 static void gather_avx2(float *out, const float *x, ptrdiff_t rows,
			     const int32_t *ptr, ptrdiff_t r,
			     const int32_t *idx, const float *val,
			     ptrdiff_t d, ptrdiff_t sa, ptrdiff_t st,
			     ptrdiff_t lo, ptrdiff_t hi, float *scratch)
{
	float *xT = scratch, *res = scratch + rows * W256;
	__m256i full = _mm256_set1_epi32(-1);
	for (ptrdiff_t t0 = lo; t0 < hi; t0 += W256) {
		ptrdiff_t nt = min_pd(W256, hi - t0);
		const float *xt = x + t0 * rows;
		for (ptrdiff_t l0 = 0; l0 < W256; l0 += 8)
			for (ptrdiff_t i0 = 0; i0 < rows; i0 += 8)
				tr_block256(xt + l0 * rows + i0, rows, nt - l0,
					    min_pd(8, rows - i0),
					    xT + i0 * W256 + l0, W256, full);
		__m256i m[4];
		for (int v = 0; v < 4; v++)
			m[v] = st == 1 ? mask8(nt - 8 * v) : full;
		float *ot = out + t0 * st;
		for (ptrdiff_t c = 0; c < d; c++) {
			ptrdiff_t k0, k1;
			entries(ptr, r, c, &k0, &k1);
			__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
			for (ptrdiff_t k = k0; k < k1; k++) {
				const float *p = xT + (ptrdiff_t)idx[k] * W256;
				__m256 v = _mm256_set1_ps(val[k]);
				a0 = _mm256_add_ps(a0, _mm256_mul_ps(v, _mm256_loadu_ps(p)));
				a1 = _mm256_add_ps(a1, _mm256_mul_ps(v, _mm256_loadu_ps(p + 8)));
				a2 = _mm256_add_ps(a2, _mm256_mul_ps(v, _mm256_loadu_ps(p + 16)));
				a3 = _mm256_add_ps(a3, _mm256_mul_ps(v, _mm256_loadu_ps(p + 24)));
			}
			float *o = st == 1 ? ot + c * sa : res + c * W256;
			_mm256_maskstore_ps(o, m[0], a0);
			_mm256_maskstore_ps(o + 8, m[1], a1);
			_mm256_maskstore_ps(o + 16, m[2], a2);
			_mm256_maskstore_ps(o + 24, m[3], a3);
		}
		if (st == 1)
			continue;
		if (sa == 1) {
			for (ptrdiff_t c0 = 0; c0 < d; c0 += 8)
				for (ptrdiff_t l0 = 0; l0 < nt; l0 += 8)
					tr_block256(res + c0 * W256 + l0, W256,
						    d - c0, min_pd(8, nt - l0),
						    ot + l0 * st + c0, st,
						    mask8(d - c0));
			continue;
		}
		for (ptrdiff_t c = 0; c < d; c++)
			for (ptrdiff_t l = 0; l < nt; l++)
				ot[c * sa + l * st] = res[c * W256 + l];
	}
}

/* Rows [0, mr) x columns [0, 8*nv) of S, the last vector masked by lm. */
T256 INL void s_tile256(const int mr, const int nv, float *S, const float *A,
			const float *B, ptrdiff_t BT, ptrdiff_t d,
			int accumulate, __m256i lm)
{
	__m256 acc[S256_MR][2];
#pragma GCC unroll 6
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
		for (int v = 0; v < nv; v++)
			acc[i][v] = _mm256_setzero_ps();
	for (ptrdiff_t t = 0; t < BT; t++) {
		const float *bt = B + t * d;
		__m256 bv[2];
#pragma GCC unroll 2
		for (int v = 0; v < nv; v++)
			bv[v] = v == nv - 1 ? _mm256_maskload_ps(bt + 8 * v, lm)
					    : _mm256_loadu_ps(bt + 8 * v);
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			__m256 x = _mm256_set1_ps(A[i * BT + t]);
#pragma GCC unroll 2
			for (int v = 0; v < nv; v++)
				acc[i][v] = _mm256_add_ps(acc[i][v], _mm256_mul_ps(x, bv[v]));
		}
	}
	__m256i full = _mm256_set1_epi32(-1);
#pragma GCC unroll 6
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
		for (int v = 0; v < nv; v++) {
			float *sp = S + i * d + 8 * v;
			__m256i m = v == nv - 1 ? lm : full;
			__m256 s = acc[i][v];
			if (accumulate)
				s = _mm256_add_ps(s, _mm256_maskload_ps(sp, m));
			_mm256_maskstore_ps(sp, m, s);
		}
}

#define S_CASES2(MR, fn) S_CASE(MR, 1, fn) S_CASE(MR, 2, fn)

T256 static void s_avx2(float *S, const float *A, const float *B,
			ptrdiff_t BT, ptrdiff_t d, int accumulate,
			ptrdiff_t lo, ptrdiff_t hi)
{
	for (ptrdiff_t b0 = 0; b0 < d; b0 += 16) {
		ptrdiff_t nb = min_pd(16, d - b0);
		int nv = (int)(nb + 7) / 8;
		__m256i lm = mask8(nb - 8 * (nv - 1));
		for (ptrdiff_t a0 = lo; a0 < hi; a0 += S256_MR) {
			int mr = (int)min_pd(S256_MR, hi - a0);
			float *Sp = S + a0 * d + b0;
			const float *Ap = A + a0 * BT, *Bp = B + b0;
			switch (mr * 8 + nv) {
				S_CASES2(1, s_tile256)
				S_CASES2(2, s_tile256)
				S_CASES2(3, s_tile256)
				S_CASES2(4, s_tile256)
				S_CASES2(5, s_tile256)
				S_CASES2(6, s_tile256)
			}
		}
	}
}

T256 static void apply_w_avx2(float *w, const float *T, const int32_t *pidx,
			      const float *pval, ptrdiff_t n, ptrdiff_t r,
			      float decay, ptrdiff_t lo, ptrdiff_t hi)
{
	__m256 dec = _mm256_set1_ps(decay);
	for (ptrdiff_t i = lo; i < hi; i++) {
		const int32_t *pi = pidx + i * r;
		const float *pv = pval + i * r;
		for (ptrdiff_t j0 = 0; j0 < n; j0 += 32) {
			__m256i m[4];
			for (int v = 0; v < 4; v++)
				m[v] = mask8(n - j0 - 8 * v);
			__m256 acc[4];
#pragma GCC unroll 4
			for (int v = 0; v < 4; v++)
				acc[v] = _mm256_setzero_ps();
			for (ptrdiff_t s = 0; s < r; s++) {
				__m256 p = _mm256_set1_ps(pv[s]);
				const float *ts = T + (ptrdiff_t)pi[s] * n + j0;
#pragma GCC unroll 4
				for (int v = 0; v < 4; v++)
					acc[v] = _mm256_add_ps(acc[v], _mm256_mul_ps(p, _mm256_maskload_ps(ts + 8 * v, m[v])));
			}
			float *wi = w + i * n + j0;
#pragma GCC unroll 4
			for (int v = 0; v < 4; v++) {
				__m256 x = _mm256_maskload_ps(wi + 8 * v, m[v]);
				x = _mm256_add_ps(_mm256_mul_ps(dec, x), acc[v]);
				_mm256_maskstore_ps(wi + 8 * v, m[v], x);
			}
		}
	}
}

/* ------------------------------------------------------------- dispatch */

ptrdiff_t lsp_host_sparse_gather_scratch(int path, ptrdiff_t rows, ptrdiff_t d)
{
	switch (path) {
	case 1:
		return W256 * (rows + d);
	case 2:
		return W512 * (rows + d);
	}
	return 0;
}

void lsp_host_sparse_gather(int path, float *out, const float *x, ptrdiff_t rows,
		       const int32_t *ptr, ptrdiff_t r, const int32_t *idx,
		       const float *val, ptrdiff_t d, ptrdiff_t sa,
		       ptrdiff_t st, ptrdiff_t lo, ptrdiff_t hi,
		       float *scratch)
{
	switch (path) {
	case 1:
		gather_avx2(out, x, rows, ptr, r, idx, val, d, sa, st, lo, hi,
			    scratch);
		return;
	case 2:
		gather_avx512(out, x, rows, ptr, r, idx, val, d, sa, st, lo,
			      hi, scratch);
		return;
	}
	gather_scalar(out, x, rows, ptr, r, idx, val, d, sa, st, lo, hi);
}

void lsp_host_sparse_s(int path, float *S, const float *A, const float *B,
		  ptrdiff_t BT, ptrdiff_t d, int accumulate, ptrdiff_t lo,
		  ptrdiff_t hi)
{
	switch (path) {
	case 1:
		s_avx2(S, A, B, BT, d, accumulate, lo, hi);
		return;
	case 2:
		s_avx512(S, A, B, BT, d, accumulate, lo, hi);
		return;
	}
	s_scalar(S, A, B, BT, d, accumulate, lo, hi);
}

void lsp_host_sparse_apply_w(int path, float *w, const float *T,
			const int32_t *pidx, const float *pval, ptrdiff_t n,
			ptrdiff_t r, float decay, ptrdiff_t lo, ptrdiff_t hi)
{
	switch (path) {
	case 1:
		apply_w_avx2(w, T, pidx, pval, n, r, decay, lo, hi);
		return;
	case 2:
		apply_w_avx512(w, T, pidx, pval, n, r, decay, lo, hi);
		return;
	}
	apply_w_scalar(w, T, pidx, pval, n, r, decay, lo, hi);
}
