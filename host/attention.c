/*
 * attention.c: see attention.h. One body, compiled for each SIMD path by
 * inlining it into functions with that path's target attribute; the loops
 * the compiler vectorises have independent lanes (no reductions across
 * lanes), so vectorising never changes a result.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* FP exceptions are never read here, so GCC may compute both sides of a
 * select (if-convert), which it needs to vectorise these loops; results do
 * not change. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#define ATTN_INLINE static inline __attribute__((always_inline))

/* transpose writes x[t*row + i] for t < T, i < HS to xt[i*T + t]. */
ATTN_INLINE void attn_transpose(float *restrict xt, const float *restrict x,
	long row, long T, long HS)
{
	for (long t = 0; t < T; t++)
		for (long i = 0; i < HS; i++)
			xt[i * T + t] = x[t * row + i];
}

/* dots sets s[t2] = sum_i q[i] * xt[i*T + t2] for t2 < n, i ascending. */
ATTN_INLINE void attn_dots(float *restrict s, const float *restrict q,
	const float *restrict xt, long n, long T, long HS)
{
	for (long t2 = 0; t2 < n; t2++)
		s[t2] = 0;
	for (long i = 0; i < HS; i++) {
		const float qi = q[i];
		const float *restrict k = xt + i * T;
		for (long t2 = 0; t2 < n; t2++)
			s[t2] += qi * k[t2];
	}
}

ATTN_INLINE int attn_forward_body(const lsp_attn_shape *a, float *out,
	float *lse, const float *qkv, long lo, long hi)
{
	const long T = a->T, HS = a->HS, NH = a->NH, per = a->NH / a->KVH;
	const float scale = (float)(1 / sqrt((double)HS));
	float *kt = malloc(sizeof(float) * (size_t)(HS * T + T));
	if (!kt)
		return -1;
	float *p = kt + HS * T;
	long g0 = -1;
	for (long bh = lo; bh < hi; bh++) {
		const long b = bh / NH, h = bh % NH, g = h / per;
		if (b * a->KVH + g != g0) { /* query heads of a group share it */
			g0 = b * a->KVH + g;
			attn_transpose(kt, qkv + a->kbase + b * T * a->kvrow + g * HS, a->kvrow, T, HS);
		}
		for (long t = 0; t < T; t++) {
			const float *q = qkv + a->qbase + (b * T + t) * a->qrow + h * HS;
			const long n = t + 1;
			attn_dots(p, q, kt, n, T, HS);
			float mx = -INFINITY;
			for (long t2 = 0; t2 < n; t2++) {
				p[t2] *= scale;
				mx = p[t2] > mx ? p[t2] : mx;
			}
			float sum = 0;
			for (long t2 = 0; t2 < n; t2++) {
				p[t2] = (float)exp((double)(p[t2] - mx));
				sum += p[t2];
			}
			float *restrict o = out + ((b * T + t) * NH + h) * HS;
			for (long i = 0; i < HS; i++)
				o[i] = 0;
			for (long t2 = 0; t2 < n; t2++) {
				const float *restrict v = qkv + a->vbase + (b * T + t2) * a->kvrow + g * HS;
				const float w = p[t2] / sum;
				for (long i = 0; i < HS; i++)
					o[i] += w * v[i];
			}
			lse[(b * NH + h) * T + t] = mx + (float)log((double)sum);
		}
	}
	free(kt);
	return 0;
}

ATTN_INLINE int attn_backward_body(const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	long lo, long hi)
{
	const long T = a->T, HS = a->HS, NH = a->NH, per = a->NH / a->KVH;
	const float scale = (float)(1 / sqrt((double)HS));
	/* kt, vt: the head's keys and values transposed; dks, dvs: its key and
	 * value gradients, accumulated contiguously (in L2) and copied out. */
	float *kt = malloc(sizeof(float) * (size_t)(4 * HS * T + 2 * T));
	if (!kt)
		return -1;
	float *vt = kt + HS * T, *dks = vt + HS * T, *dvs = dks + HS * T;
	float *s = dvs + HS * T, *dp = s + T;
	for (long bg = lo; bg < hi; bg++) {
		const long b = bg / a->KVH, g = bg % a->KVH;
		memset(dks, 0, sizeof(float) * (size_t)(2 * HS * T));
		for (long t = 0; t < T; t++) {
			for (long h = g * per; h < (g + 1) * per; h++)
				memset(dqkv + a->qbase + (b * T + t) * a->qrow + h * HS, 0, sizeof(float) * (size_t)HS);
		}
		attn_transpose(kt, qkv + a->kbase + b * T * a->kvrow + g * HS, a->kvrow, T, HS);
		attn_transpose(vt, qkv + a->vbase + b * T * a->kvrow + g * HS, a->kvrow, T, HS);
		for (long h = g * per; h < (g + 1) * per; h++) {
			for (long t = 0; t < T; t++) {
				const float *restrict q = qkv + a->qbase + (b * T + t) * a->qrow + h * HS;
				float *restrict dq = dqkv + a->qbase + (b * T + t) * a->qrow + h * HS;
				const float *restrict d = dout + ((b * T + t) * NH + h) * HS;
				const float *restrict o = out + ((b * T + t) * NH + h) * HS;
				float D = 0;
				for (long i = 0; i < HS; i++)
					D += d[i] * o[i];
				const float l = lse[(b * NH + h) * T + t];
				const long n = t + 1;
				attn_dots(s, q, kt, n, T, HS);
				attn_dots(dp, d, vt, n, T, HS);
				for (long t2 = 0; t2 < n; t2++) {
					const float pp = (float)exp((double)(s[t2] * scale - l));
					s[t2] = pp;                          /* P */
					dp[t2] = pp * (dp[t2] - D) * scale; /* dS */
				}
				for (long t2 = 0; t2 < n; t2++) {
					const float *restrict k = qkv + a->kbase + (b * T + t2) * a->kvrow + g * HS;
					float *restrict dk = dks + t2 * HS, *restrict dv = dvs + t2 * HS;
					const float pp = s[t2], ds = dp[t2];
					for (long i = 0; i < HS; i++) {
						dv[i] += pp * d[i];
						dq[i] += ds * k[i];
						dk[i] += ds * q[i];
					}
				}
			}
		}
		for (long t = 0; t < T; t++) {
			memcpy(dqkv + a->kbase + (b * T + t) * a->kvrow + g * HS, dks + t * HS, sizeof(float) * (size_t)HS);
			memcpy(dqkv + a->vbase + (b * T + t) * a->kvrow + g * HS, dvs + t * HS, sizeof(float) * (size_t)HS);
		}
	}
	free(kt);
	return 0;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_X86 1
#define ATTN_AVX2 __attribute__((target("avx2,fma")))
#define ATTN_AVX512 __attribute__((target("avx512f,avx2,fma")))

ATTN_AVX2 static int attn_forward_avx2(const lsp_attn_shape *a, float *out,
	float *lse, const float *qkv, long lo, long hi)
{
	return attn_forward_body(a, out, lse, qkv, lo, hi);
}

ATTN_AVX512 static int attn_forward_avx512(const lsp_attn_shape *a, float *out,
	float *lse, const float *qkv, long lo, long hi)
{
	return attn_forward_body(a, out, lse, qkv, lo, hi);
}

ATTN_AVX2 static int attn_backward_avx2(const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	long lo, long hi)
{
	return attn_backward_body(a, dqkv, dout, qkv, out, lse, lo, hi);
}

ATTN_AVX512 static int attn_backward_avx512(const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	long lo, long hi)
{
	return attn_backward_body(a, dqkv, dout, qkv, out, lse, lo, hi);
}
#endif

/* The path numbers are host's SIMD constants: 0 scalar, 1 AVX2, 2 AVX-512. */
int lsp_attn_forward(int path, const lsp_attn_shape *a, float *out, float *lse,
	const float *qkv, long lo, long hi)
{
#ifdef ATTN_X86
	if (path == 2)
		return attn_forward_avx512(a, out, lse, qkv, lo, hi);
	if (path == 1)
		return attn_forward_avx2(a, out, lse, qkv, lo, hi);
#endif
	(void)path;
	return attn_forward_body(a, out, lse, qkv, lo, hi);
}

int lsp_attn_backward(int path, const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	long lo, long hi)
{
#ifdef ATTN_X86
	if (path == 2)
		return attn_backward_avx512(a, dqkv, dout, qkv, out, lse, lo, hi);
	if (path == 1)
		return attn_backward_avx2(a, dqkv, dout, qkv, out, lse, lo, hi);
#endif
	(void)path;
	return attn_backward_body(a, dqkv, dout, qkv, out, lse, lo, hi);
}
