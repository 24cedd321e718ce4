/*
 * triad.c: the STREAM triad kernel (see triad.h). Limits: x86-64 SIMD only;
 * other targets and tails use the scalar loop.
 */
#include <math.h>
#include <stdint.h>

#include "triad.h"

static void triad_scalar(float *a, const float *b, const float *c, float s,
	size_t i0, size_t n)
{
	for (size_t i = i0; i < n; i++)
		a[i] = fmaf(s, c[i], b[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* The same software prefetch as the Adam update (adam.c, LSP_PF_UPDATE):
 * on this kind of VM a core's bandwidth is bound by its outstanding misses,
 * so a triad without it would understate the memory system and flatter the
 * Adam-vs-triad ratio. */
#define LSP_TRIAD_PF 256
#define LSP_TRIAD_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

/* LSP_TRIAD_SIMD(NAME, TARGET, W) defines NAME, the triad on vectors of W
 * bits (256 or 512: W/32 floats, the _mmW_ intrinsics): one body for the
 * AVX2 and the AVX-512 path. */
#define LSP_TRIAD_SIMD(NAME, TARGET, W)                                                                   \
	__attribute__((target(TARGET))) static void NAME(float *a, const float *b,                        \
		const float *c, float s, size_t n, int nt)                                                \
	{                                                                                                 \
		const __m##W vs = _mm##W##_set1_ps(s);                                                    \
		size_t i = 0;                                                                             \
		if (nt) {                                                                                 \
			for (; i + W / 32 <= n; i += W / 32) {                                            \
				LSP_TRIAD_PREFETCH(b + i + LSP_TRIAD_PF);                                 \
				LSP_TRIAD_PREFETCH(c + i + LSP_TRIAD_PF);                                 \
				_mm##W##_stream_ps(a + i, _mm##W##_fmadd_ps(vs, _mm##W##_loadu_ps(c + i), \
					_mm##W##_loadu_ps(b + i)));                                       \
			}                                                                                 \
			_mm_sfence();                                                                     \
		}                                                                                         \
		for (; i + W / 32 <= n; i += W / 32) {                                                    \
			LSP_TRIAD_PREFETCH(a + i + LSP_TRIAD_PF);                                         \
			LSP_TRIAD_PREFETCH(b + i + LSP_TRIAD_PF);                                         \
			LSP_TRIAD_PREFETCH(c + i + LSP_TRIAD_PF);                                         \
			_mm##W##_storeu_ps(a + i, _mm##W##_fmadd_ps(vs, _mm##W##_loadu_ps(c + i),         \
				_mm##W##_loadu_ps(b + i)));                                               \
		}                                                                                         \
		triad_scalar(a, b, c, s, i, n);                                                           \
	}

LSP_TRIAD_SIMD(triad_avx2, "avx2,fma", 256)
LSP_TRIAD_SIMD(triad_avx512, "avx512f,avx2,fma", 512)
#define LSP_TRIAD_X86 1
#endif

void lsp_triad(int path, int nt, float *a, const float *b, const float *c, float s, size_t n)
{
#ifdef LSP_TRIAD_X86
	nt = nt && ((uintptr_t)a & 63) == 0;
	if (path == 2) {
		triad_avx512(a, b, c, s, n, nt);
		return;
	}
	if (path == 1) {
		triad_avx2(a, b, c, s, n, nt);
		return;
	}
#else
	(void)path;
	(void)nt;
#endif
	triad_scalar(a, b, c, s, 0, n);
}
