/*
 * rmw.c: the four-array read-modify-write ceiling kernel (see rmw.h).
 * Limits: x86-64 SIMD only; other targets and tails use the scalar loop.
 */
#include <math.h>
#include <stdint.h>

#include "rmw.h"

static void rmw4_scalar(float *w, const float *g, float *m, float *v, float s,
	size_t i0, size_t n)
{
	for (size_t i = i0; i < n; i++) {
		float mi = m[i] + g[i];
		m[i] = mi;
		v[i] = fmaf(g[i], g[i], v[i]);
		w[i] = fmaf(s, mi, w[i]);
	}
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* The near prefetch distance of the Adam update (adam.c, LSP_PF_UPDATE). */
#define LSP_RMW_PF 256
#define LSP_RMW_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define LSP_RMW_PREFETCH_ALL(i)                  \
	do {                                     \
		LSP_RMW_PREFETCH(w + (i) + LSP_RMW_PF); \
		LSP_RMW_PREFETCH(g + (i) + LSP_RMW_PF); \
		LSP_RMW_PREFETCH(m + (i) + LSP_RMW_PF); \
		LSP_RMW_PREFETCH(v + (i) + LSP_RMW_PF); \
	} while (0)

/* LSP_RMW_SIMD(NAME, TARGET, W) defines NAME, rmw4 on vectors of W bits
 * (256 or 512: W/32 floats, the _mmW_ intrinsics): one body for the AVX2
 * and the AVX-512 path. */
#define LSP_RMW_SIMD(NAME, TARGET, W)                                                                   \
	__attribute__((target(TARGET))) static void NAME(float *w,                                      \
		const float *g, float *m, float *v, float s, size_t n, int pf)                          \
	{                                                                                               \
		const __m##W vs = _mm##W##_set1_ps(s);                                                  \
		size_t i = 0;                                                                           \
		for (; i + W / 32 <= n; i += W / 32) {                                                  \
			if (pf)                                                                         \
				LSP_RMW_PREFETCH_ALL(i);                                                \
			__m##W gi = _mm##W##_loadu_ps(g + i);                                           \
			__m##W mi = _mm##W##_add_ps(_mm##W##_loadu_ps(m + i), gi);                      \
			_mm##W##_storeu_ps(m + i, mi);                                                  \
			_mm##W##_storeu_ps(v + i, _mm##W##_fmadd_ps(gi, gi, _mm##W##_loadu_ps(v + i))); \
			_mm##W##_storeu_ps(w + i, _mm##W##_fmadd_ps(vs, mi, _mm##W##_loadu_ps(w + i))); \
		}                                                                                       \
		rmw4_scalar(w, g, m, v, s, i, n);                                                       \
	}

LSP_RMW_SIMD(rmw4_avx2, "avx2,fma", 256)
LSP_RMW_SIMD(rmw4_avx512, "avx512f,avx2,fma", 512)
#define LSP_RMW_X86 1
#endif

void lsp_rmw4(int path, int pf, float *w, const float *g, float *m, float *v, float s, size_t n)
{
#ifdef LSP_RMW_X86
	/* The branch on pf is loop-invariant; the compiler unswitches it. */
	if (path == 2) {
		rmw4_avx512(w, g, m, v, s, n, pf);
		return;
	}
	if (path == 1) {
		rmw4_avx2(w, g, m, v, s, n, pf);
		return;
	}
#else
	(void)path;
	(void)pf;
#endif
	rmw4_scalar(w, g, m, v, s, 0, n);
}
