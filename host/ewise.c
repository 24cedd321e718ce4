/* ewise.c: see ewise.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ewise.h"
#include "vecloops.h"

#define EW_INLINE static inline __attribute__((always_inline))

/* lsp_exp is exp(x) in double for the uses here, whose results are
 * rounded to fp32 or added to sums of at least 1: x = k ln2 + r with |r| <=
 * ln2/2 (ln2 split in two so that k ln2 is exact), exp(r) by its Taylor
 * series to r^13 (truncation below 2^-56 relative), times 2^k built in the
 * exponent bits. Below -708 it returns 0 (exp is under 2^-1021 there, 0
 * in fp32 and nothing against 1), above 709 +Inf (Inf in fp32 too); NaN
 * stays NaN. Branch-free, so loops over it vectorise. */
EW_INLINE double lsp_exp(double x)
{
	const double log2e = 1.4426950408889634, shift = 0x1.8p52;
	const double ln2hi = 0x1.62e42fefa3800p-1, ln2lo = 0x1.ef35793c76730p-45;
	double xc = x > 709.0 ? 709.0 : x;
	xc = xc < -708.0 ? -708.0 : xc;
	double kd = xc * log2e + shift;
	uint64_t kb;
	memcpy(&kb, &kd, 8);
	kd -= shift;
	double r = (xc - kd * ln2hi) - kd * ln2lo;
	double p = 1.0 / 6227020800.0;
	p = p * r + 1.0 / 479001600.0;
	p = p * r + 1.0 / 39916800.0;
	p = p * r + 1.0 / 3628800.0;
	p = p * r + 1.0 / 362880.0;
	p = p * r + 1.0 / 40320.0;
	p = p * r + 1.0 / 5040.0;
	p = p * r + 1.0 / 720.0;
	p = p * r + 1.0 / 120.0;
	p = p * r + 1.0 / 24.0;
	p = p * r + 1.0 / 6.0;
	p = p * r + 0.5;
	p = p * r + 1.0;
	p = p * r + 1.0;
	/* k sits in kb's low bits, offset by shift's; 2^k for k in [-1022, 1023]. */
	uint64_t sb = (kb - 0x4338000000000000ull + 1023u) << 52;
	double sc;
	memcpy(&sc, &sb, 8);
	double y = p * sc;
	y = x > 709.0 ? INFINITY : y;
	y = x < -708.0 ? 0.0 : y;
	return x != x ? x : y;
}

EW_INLINE int xent_body(float *losses, float *z, const int32_t *targets,
	long V, float scale, long lo, long hi)
{
	double *e = malloc(sizeof(double) * (size_t)V);
	if (!e)
		return -1;
	for (long r = lo; r < hi; r++) {
		float *restrict zr = z + r * V;
		const int32_t t = targets[r];
		if (t < 0) {
			losses[r] = 0;
			if (scale != 0)
				memset(zr, 0, sizeof(float) * (size_t)V);
			continue;
		}
		float mx = zr[0];
		for (long i = 0; i < V; i++)
			mx = zr[i] > mx ? zr[i] : mx;
		for (long i = 0; i < V; i++)
			e[i] = lsp_exp((double)(zr[i] - mx));
		double acc[8] = {0};
		long i = 0;
		for (; i + 8 <= V; i += 8)
			for (int j = 0; j < 8; j++)
				acc[j] += e[i + j];
		for (; i < V; i++)
			acc[i & 7] += e[i];
		for (int s = 4; s >= 1; s >>= 1)
			for (int j = 0; j < s; j++)
				acc[j] += acc[j + s];
		const double lse = (double)mx + log(acc[0]);
		losses[r] = (float)(lse - (double)zr[t]);
		if (scale == 0)
			continue;
		for (long i = 0; i < V; i++)
			zr[i] = scale * (float)lsp_exp((double)zr[i] - lse);
		zr[t] -= scale;
	}
	free(e);
	return 0;
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

EW_INLINE void gelu_forward_body(float *out, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float xi = x[i];
		float u = GELU_C * (xi + 0.044715f * xi * xi * xi);
		out[i] = xi / (1 + (float)lsp_exp((double)(-2 * u)));
	}
}

/* Outputs may alias inputs (in place), so nothing is restrict; each element is read
 * before it is written. */
EW_INLINE void gelu_backward_body(float *dinp, const float *x,
	const float *dout, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float xi = x[i];
		float u = GELU_C * (xi + 0.044715f * xi * xi * xi);
		float sig = 1 / (1 + (float)lsp_exp((double)(-2 * u)));
		float th = 2 * sig - 1;
		/* Go folds 3*0.044715 as a constant before rounding it to fp32. */
		float d = sig + 0.5f * xi * (1 - th * th) * GELU_C * (1 + 0.134145f * xi * xi);
		dinp[i] = d * dout[i];
	}
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EW_X86 1
#define EW_AVX2 __attribute__((target("avx2,fma")))
#define EW_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma")))

EW_AVX2 static int xent_avx2(float *l, float *z, const int32_t *t, long V, float s, long lo, long hi)
{
	return xent_body(l, z, t, V, s, lo, hi);
}
EW_AVX512 static int xent_avx512(float *l, float *z, const int32_t *t, long V, float s, long lo, long hi)
{
	return xent_body(l, z, t, V, s, lo, hi);
}
EW_AVX2 static void gelu_forward_avx2(float *o, const float *x, size_t n) { gelu_forward_body(o, x, n); }
EW_AVX512 static void gelu_forward_avx512(float *o, const float *x, size_t n) { gelu_forward_body(o, x, n); }
EW_AVX2 static void gelu_backward_avx2(float *d, const float *x, const float *g, size_t n)
{
	gelu_backward_body(d, x, g, n);
}
EW_AVX512 static void gelu_backward_avx512(float *d, const float *x, const float *g, size_t n)
{
	gelu_backward_body(d, x, g, n);
}
#endif

/* Paths as host's SIMD constants: 0 scalar, 1 AVX2, 2 AVX-512. */
int lsp_host_xent(int path, float *losses, float *z, const int32_t *targets,
	long V, float scale, long lo, long hi)
{
#ifdef EW_X86
	if (path == 2)
		return xent_avx512(losses, z, targets, V, scale, lo, hi);
	if (path == 1)
		return xent_avx2(losses, z, targets, V, scale, lo, hi);
#endif
	(void)path;
	return xent_body(losses, z, targets, V, scale, lo, hi);
}

void lsp_host_gelu_forward(int path, float *out, const float *x, size_t n)
{
#ifdef EW_X86
	if (path == 2) {
		gelu_forward_avx512(out, x, n);
		return;
	}
	if (path == 1) {
		gelu_forward_avx2(out, x, n);
		return;
	}
#endif
	(void)path;
	gelu_forward_body(out, x, n);
}

void lsp_host_gelu_backward(int path, float *dinp, const float *x,
	const float *dout, size_t n)
{
#ifdef EW_X86
	if (path == 2) {
		gelu_backward_avx512(dinp, x, dout, n);
		return;
	}
	if (path == 1) {
		gelu_backward_avx2(dinp, x, dout, n);
		return;
	}
#endif
	(void)path;
	gelu_backward_body(dinp, x, dout, n);
}
