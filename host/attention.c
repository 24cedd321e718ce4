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
#include "vecloops.h"

#define ATTN_INLINE static inline __attribute__((always_inline))

/* transpose writes x[t*row + i] for t < T, i < HS to xt[i*Tp + t]; the
 * rows are padded to Tp (a multiple of ATTN_VL) with zeros. */
ATTN_INLINE void attn_transpose(float *restrict xt, const float *restrict x,
	long row, long T, long Tp, long HS)
{
	for (long t = 0; t < T; t++)
		for (long i = 0; i < HS; i++)
			xt[i * Tp + t] = x[t * row + i];
	for (long i = 0; i < HS; i++)
		for (long t = T; t < Tp; t++)
			xt[i * Tp + t] = 0;
}

/* attn_v is 16 floats, loaded and stored unaligned; arithmetic on it is
 * lane by lane, each operation rounded as in scalar code. */
#define ATTN_VL 16
typedef float attn_v __attribute__((vector_size(4 * ATTN_VL), aligned(4), may_alias));

/* scores4 sets s[j*Tp + t2] = sum_i q[j][i] * xt[i*Tp + t2], i ascending,
 * for 4 queries j and keys t2 < n rounded up to ATTN_VL (the padding lanes
 * are computed and ignored): a register block of 4 queries by 16 keys, so
 * each key vector is loaded once for 4 queries. */
ATTN_INLINE void attn_scores4(float *s, const float *const q[4],
	const float *xt, long n, long Tp, long HS)
{
	const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
	for (long t2 = 0; t2 < n; t2 += ATTN_VL) {
		attn_v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
		for (long i = 0; i < HS; i++) {
			const attn_v k = *(const attn_v *)(xt + i * Tp + t2);
			a0 += q0[i] * k;
			a1 += q1[i] * k;
			a2 += q2[i] * k;
			a3 += q3[i] * k;
		}
		*(attn_v *)(s + t2) = a0;
		*(attn_v *)(s + Tp + t2) = a1;
		*(attn_v *)(s + 2 * Tp + t2) = a2;
		*(attn_v *)(s + 3 * Tp + t2) = a3;
	}
}

ATTN_INLINE int attn_forward_body(const lsp_attn_shape *a, float *out,
	float *lse, const float *qkv, const int *pos, long lo, long hi)
{
	const long T = a->T, HS = a->HS, NH = a->NH, per = a->NH / a->KVH;
	const long Tp = (T + ATTN_VL - 1) / ATTN_VL * ATTN_VL;
	const float scale = (float)(1 / sqrt((double)HS));
	float *kt = malloc(sizeof(float) * (size_t)(HS * Tp + 4 * Tp));
	if (!kt)
		return -1;
	float *S = kt + HS * Tp;
	long g0 = -1;
	for (long bh = lo; bh < hi; bh++) {
		const long b = bh / NH, h = bh % NH, g = h / per;
		if (b * a->KVH + g != g0) { /* query heads of a group share it */
			g0 = b * a->KVH + g;
			attn_transpose(kt, qkv + a->kbase + b * T * a->kvrow + g * HS, a->kvrow, T, Tp, HS);
		}
		for (long t0 = 0; t0 < T; t0 += 4) {
			const long nq = T - t0 < 4 ? T - t0 : 4;
			const float *q[4];
			for (long j = 0; j < 4; j++) /* past T: repeat the last query, ignored */
				q[j] = qkv + a->qbase + (b * T + t0 + (j < nq ? j : nq - 1)) * a->qrow + h * HS;
			attn_scores4(S, q, kt, t0 + nq, Tp, HS);
			for (long j = 0; j < nq; j++) {
				const long t = t0 + j, n = t + 1;
				const long k0 = pos ? t - pos[b * T + t] : 0; /* the document's first key */
				float *p = S + j * Tp;
				float mx = -INFINITY;
				for (long t2 = k0; t2 < n; t2++) {
					p[t2] *= scale;
					mx = p[t2] > mx ? p[t2] : mx;
				}
				float sum = 0;
				for (long t2 = k0; t2 < n; t2++) {
					p[t2] = (float)exp((double)(p[t2] - mx));
					sum += p[t2];
				}
				float *restrict o = out + ((b * T + t) * NH + h) * HS;
				for (long i = 0; i < HS; i++)
					o[i] = 0;
				for (long t2 = k0; t2 < n; t2++) {
					const float *restrict v = qkv + a->vbase + (b * T + t2) * a->kvrow + g * HS;
					const float w = p[t2] / sum;
					for (long i = 0; i < HS; i++)
						o[i] += w * v[i];
				}
				lse[(b * NH + h) * T + t] = mx + (float)log((double)sum);
			}
		}
	}
	free(kt);
	return 0;
}

ATTN_INLINE int attn_backward_body(const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	const int *pos, long lo, long hi)
{
	const long T = a->T, HS = a->HS, NH = a->NH, per = a->NH / a->KVH;
	const long Tp = (T + ATTN_VL - 1) / ATTN_VL * ATTN_VL;
	const float scale = (float)(1 / sqrt((double)HS));
	/* kt, vt: the head's keys and values transposed; dks, dvs: its key and
	 * value gradients, accumulated contiguously (in L2) and copied out;
	 * S, DP: scores and dO V^T of 4 queries. */
	float *kt = malloc(sizeof(float) * (size_t)(2 * HS * Tp + 2 * HS * T + 8 * Tp));
	if (!kt)
		return -1;
	float *vt = kt + HS * Tp, *dks = vt + HS * Tp, *dvs = dks + HS * T;
	float *S = dvs + HS * T, *DP = S + 4 * Tp;
	for (long bg = lo; bg < hi; bg++) {
		const long b = bg / a->KVH, g = bg % a->KVH;
		memset(dks, 0, sizeof(float) * (size_t)(2 * HS * T));
		for (long t = 0; t < T; t++) {
			for (long h = g * per; h < (g + 1) * per; h++)
				memset(dqkv + a->qbase + (b * T + t) * a->qrow + h * HS, 0, sizeof(float) * (size_t)HS);
		}
		attn_transpose(kt, qkv + a->kbase + b * T * a->kvrow + g * HS, a->kvrow, T, Tp, HS);
		attn_transpose(vt, qkv + a->vbase + b * T * a->kvrow + g * HS, a->kvrow, T, Tp, HS);
		for (long h = g * per; h < (g + 1) * per; h++) {
			for (long t0 = 0; t0 < T; t0 += 4) {
				const long nq = T - t0 < 4 ? T - t0 : 4;
				const float *q4[4], *d4[4];
				for (long j = 0; j < 4; j++) { /* past T: repeat the last query, ignored */
					const long t = t0 + (j < nq ? j : nq - 1);
					q4[j] = qkv + a->qbase + (b * T + t) * a->qrow + h * HS;
					d4[j] = dout + ((b * T + t) * NH + h) * HS;
				}
				attn_scores4(S, q4, kt, t0 + nq, Tp, HS);
				attn_scores4(DP, d4, vt, t0 + nq, Tp, HS);
				for (long j = 0; j < nq; j++) {
					const long t = t0 + j, n = t + 1;
					const long k0 = pos ? t - pos[b * T + t] : 0;
					const float *restrict q = q4[j], *restrict d = d4[j];
					float *restrict dq = dqkv + a->qbase + (b * T + t) * a->qrow + h * HS;
					const float *restrict o = out + ((b * T + t) * NH + h) * HS;
					float *s = S + j * Tp, *dp = DP + j * Tp;
					float D = 0;
					for (long i = 0; i < HS; i++)
						D += d[i] * o[i];
					const float l = lse[(b * NH + h) * T + t];
					for (long t2 = k0; t2 < n; t2++) {
						const float pp = (float)exp((double)(s[t2] * scale - l));
						s[t2] = pp;                          /* P */
						dp[t2] = pp * (dp[t2] - D) * scale; /* dS */
					}
					for (long t2 = k0; t2 < n; t2++) {
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
	float *lse, const float *qkv, const int *pos, long lo, long hi)
{
	return attn_forward_body(a, out, lse, qkv, pos, lo, hi);
}

ATTN_AVX512 static int attn_forward_avx512(const lsp_attn_shape *a, float *out,
	float *lse, const float *qkv, const int *pos, long lo, long hi)
{
	return attn_forward_body(a, out, lse, qkv, pos, lo, hi);
}

ATTN_AVX2 static int attn_backward_avx2(const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	const int *pos, long lo, long hi)
{
	return attn_backward_body(a, dqkv, dout, qkv, out, lse, pos, lo, hi);
}

ATTN_AVX512 static int attn_backward_avx512(const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	const int *pos, long lo, long hi)
{
	return attn_backward_body(a, dqkv, dout, qkv, out, lse, pos, lo, hi);
}
#endif

/* The path numbers are host's SIMD constants: 0 scalar, 1 AVX2, 2 AVX-512. */
int lsp_host_attn_forward(int path, const lsp_attn_shape *a, float *out, float *lse,
	const float *qkv, const int *pos, long lo, long hi)
{
#ifdef ATTN_X86
	if (path == 2)
		return attn_forward_avx512(a, out, lse, qkv, pos, lo, hi);
	if (path == 1)
		return attn_forward_avx2(a, out, lse, qkv, pos, lo, hi);
#endif
	(void)path;
	return attn_forward_body(a, out, lse, qkv, pos, lo, hi);
}

int lsp_host_attn_backward(int path, const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	const int *pos, long lo, long hi)
{
#ifdef ATTN_X86
	if (path == 2)
		return attn_backward_avx512(a, dqkv, dout, qkv, out, lse, pos, lo, hi);
	if (path == 1)
		return attn_backward_avx2(a, dqkv, dout, qkv, out, lse, pos, lo, hi);
#endif
	(void)path;
	return attn_backward_body(a, dqkv, dout, qkv, out, lse, pos, lo, hi);
}
