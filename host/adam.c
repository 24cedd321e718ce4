/*
 * adam.c: the fused CPU AdamW step (fp32 master weights and moments; fp32,
 * bf16 or fp16 gradient; optional bf16 copy of the new weights; or the
 * subspace form that writes the update instead of weights) and the gradient
 * pre-scan, with scalar, AVX2+FMA+F16C and AVX-512F paths. adam.h states the
 * exact arithmetic; all paths give the same bits. Limits: x86-64 only for
 * SIMD (other targets get the scalar path); tails shorter than a vector run
 * the scalar code, which is the same arithmetic.
 */
#include <math.h>
#include <string.h>

#include "adam.h"

#define LSP_INLINE static inline __attribute__((always_inline))

/* ---- scalar reference ---------------------------------------------------- */

/* lsp_f16_to_f32 converts IEEE binary16 exactly (subnormals included; a NaN
 * comes back quiet, as the hardware conversion does). */
static inline float lsp_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t ex = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;
	uint32_t bits;
	if (ex == 0) {
		if (man == 0) {
			bits = sign;
		} else {
			/* Subnormal: shift until the hidden bit appears. */
			int e = -1;
			do {
				e++;
				man <<= 1;
			} while (!(man & 0x400u));
			man &= 0x3ffu;
			bits = sign | ((uint32_t)(112 - e) << 23) | (man << 13);
		}
	} else if (ex == 31) {
		bits = sign | 0x7f800000u | (man << 13);
		if (man)
			bits |= 0x00400000u;
	} else {
		bits = sign | ((ex + 112u) << 23) | (man << 13);
	}
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

static inline float lsp_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

/* lsp_f32_to_bf16 rounds to nearest, ties to even; a NaN stays a quiet NaN. */
static inline uint16_t lsp_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static inline float lsp_load_g(const void *g, size_t i, int gt)
{
	switch (gt) {
	case LSP_ADAM_BF16:
		return lsp_bf16_to_f32(((const uint16_t *)g)[i]);
	case LSP_ADAM_F16:
		return lsp_f16_to_f32(((const uint16_t *)g)[i]);
	default:
		return ((const float *)g)[i];
	}
}

/* adam_scalar_range updates elements [i0, n): the reference arithmetic, also
 * used for the tails of the SIMD paths. */
static void adam_scalar_range(const lsp_adam_coef *c, float *w, float *m,
	float *v, const void *g, int gt, float *delta, uint16_t *out16,
	size_t i0, size_t n)
{
	const float nstep = -c->step;
	for (size_t i = i0; i < n; i++) {
		float gv = lsp_load_g(g, i, gt) * c->gscale;
		float mm = fmaf(c->beta1, m[i], c->omb1 * gv);
		float vv = fmaf(c->beta2, v[i], c->omb2 * (gv * gv));
		m[i] = mm;
		v[i] = vv;
		float den = fmaf(sqrtf(vv), c->rbc2, c->eps);
		float q = mm / den;
		if (w == NULL) {
			delta[i] = nstep * q;
		} else {
			float ww = fmaf(nstep, q, w[i] * c->decay);
			w[i] = ww;
			if (out16)
				out16[i] = lsp_f32_to_bf16(ww);
		}
	}
}

/* Canonical sum of squares: 16 lanes by index mod 16, fixed pairwise tree. */
static void sumsq_scalar_range(double acc[16], const void *g, int gt,
	size_t i0, size_t n)
{
	for (size_t i = i0; i < n; i++) {
		double x = (double)lsp_load_g(g, i, gt);
		acc[i & 15] += x * x; /* x*x is exact in double */
	}
}

static double sumsq_finish(double acc[16])
{
	for (int s = 8; s >= 1; s >>= 1)
		for (int j = 0; j < s; j++)
			acc[j] += acc[j + s];
	return acc[0];
}

/* ---- x86 SIMD paths ------------------------------------------------------ */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LSP_HAVE_X86 1
#include <immintrin.h>

#define LSP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LSP_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

/* Body modes, constant-folded into specialised loops. MODE_W_OUT_NT writes
 * the bf16 copy with non-temporal stores (when it is aligned): the copy goes
 * to the device by DMA, so caching it only evicts useful lines, and skipping
 * the write-allocate read saves about a tenth of the step's memory time. */
enum { MODE_W = 0, MODE_W_OUT = 1, MODE_DELTA = 2, MODE_W_OUT_NT = 3 };

/* Software prefetch levels (the `pf` argument): LSP_PF_NONE leaves the
 * streams to the hardware prefetchers, LSP_PF_NEAR prefetches 1-2 KiB ahead
 * into L1, LSP_PF_FAR also further ahead into L2. Which pays depends on the
 * machine: where bandwidth per core is limited by outstanding misses the
 * near ones gained 10-25%, but on the AMD EPYC (Zen 4) this project is
 * measured on, the hardware prefetchers keep the update's four streams fed
 * and the prefetch instructions only cost: at 128M parameters the update
 * moved 15-25% more bytes per second without them, on one core and on two
 * (adam.go says what the Go side picks). The distances are in elements.
 * Prefetches past the end of an array are harmless (they never fault). */
#define LSP_PF_UPDATE 256
#define LSP_PF_UPDATE_L2 1024
#define LSP_PF_SCAN 512
#define LSP_PF_SCAN_L2 4096

#define LSP_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#define LSP_PREFETCH_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)

/* LSP_GPTR is the address of gradient element i of type gt. */
#define LSP_GPTR(g, i, gt)                                                 \
	((gt) == LSP_ADAM_F32 ? (const void *)((const float *)(g) + (i))  \
			      : (const void *)((const uint16_t *)(g) + (i)))

/* LSP_PREFETCH_G prefetches gradient element i of type gt. */
#define LSP_PREFETCH_G(g, i, gt) LSP_PREFETCH(LSP_GPTR(g, i, gt))

/* LSP_PREFETCH_UPDATE prefetches the update's input streams for element i
 * at level pf (w only in the weight modes). */
#define LSP_PREFETCH_UPDATE(w, m, v, g, i, gt, mode, pf)                   \
	do {                                                               \
		if ((pf) == LSP_PF_NONE)                                    \
			break;                                              \
		LSP_PREFETCH_G(g, (i) + LSP_PF_UPDATE, gt);                 \
		LSP_PREFETCH((m) + (i) + LSP_PF_UPDATE);                    \
		LSP_PREFETCH((v) + (i) + LSP_PF_UPDATE);                    \
		if ((mode) != MODE_DELTA)                                   \
			LSP_PREFETCH((w) + (i) + LSP_PF_UPDATE);            \
		if ((pf) == LSP_PF_FAR) {                                   \
			LSP_PREFETCH_L2(LSP_GPTR(g, (i) + LSP_PF_UPDATE_L2, gt)); \
			LSP_PREFETCH_L2((m) + (i) + LSP_PF_UPDATE_L2);      \
			LSP_PREFETCH_L2((v) + (i) + LSP_PF_UPDATE_L2);      \
			if ((mode) != MODE_DELTA)                           \
				LSP_PREFETCH_L2((w) + (i) + LSP_PF_UPDATE_L2); \
		}                                                           \
	} while (0)

LSP_AVX2 LSP_INLINE __m256 ld8_256(const void *g, size_t i, int gt)
{
	if (gt == LSP_ADAM_F32)
		return _mm256_loadu_ps((const float *)g + i);
	__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
	if (gt == LSP_ADAM_BF16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	return _mm256_cvtph_ps(h);
}

LSP_AVX2 LSP_INLINE __m128i bf16_256(__m256 w)
{
	__m256i x = _mm256_castps_si256(w);
	__m256i hi = _mm256_srli_epi32(x, 16);
	__m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
		_mm256_and_si256(hi, _mm256_set1_epi32(1)));
	__m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
	__m256i nan = _mm256_castps_si256(_mm256_cmp_ps(w, w, _CMP_UNORD_Q));
	r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
	return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

LSP_AVX2 LSP_INLINE void adam_body_avx2(const lsp_adam_coef *c, float *w,
	float *m, float *v, const void *g, const int gt, float *delta,
	uint16_t *out16, const int mode, const int pf, size_t n)
{
	const __m256 b1 = _mm256_set1_ps(c->beta1), omb1 = _mm256_set1_ps(c->omb1);
	const __m256 b2 = _mm256_set1_ps(c->beta2), omb2 = _mm256_set1_ps(c->omb2);
	const __m256 eps = _mm256_set1_ps(c->eps), rbc2 = _mm256_set1_ps(c->rbc2);
	const __m256 nstep = _mm256_set1_ps(-c->step), decay = _mm256_set1_ps(c->decay);
	const __m256 gs = _mm256_set1_ps(c->gscale);
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		LSP_PREFETCH_UPDATE(w, m, v, g, i, gt, mode, pf);
		__m256 gg = _mm256_mul_ps(ld8_256(g, i, gt), gs);
		__m256 mm = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(omb1, gg));
		__m256 vv = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i),
			_mm256_mul_ps(omb2, _mm256_mul_ps(gg, gg)));
		_mm256_storeu_ps(m + i, mm);
		_mm256_storeu_ps(v + i, vv);
		__m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), rbc2, eps);
		__m256 q = _mm256_div_ps(mm, den);
		if (mode == MODE_DELTA) {
			_mm256_storeu_ps(delta + i, _mm256_mul_ps(nstep, q));
		} else {
			__m256 ww = _mm256_fmadd_ps(nstep, q, _mm256_mul_ps(_mm256_loadu_ps(w + i), decay));
			_mm256_storeu_ps(w + i, ww);
			if (mode == MODE_W_OUT)
				_mm_storeu_si128((__m128i *)(out16 + i), bf16_256(ww));
			if (mode == MODE_W_OUT_NT)
				_mm_stream_si128((__m128i *)(out16 + i), bf16_256(ww));
		}
	}
	if (mode == MODE_W_OUT_NT)
		_mm_sfence(); /* order the streaming stores before completion */
	adam_scalar_range(c, mode == MODE_DELTA ? NULL : w, m, v, g, gt, delta,
		mode == MODE_W_OUT || mode == MODE_W_OUT_NT ? out16 : NULL, i, n);
}

LSP_AVX512 LSP_INLINE __m512 ld16_512(const void *g, size_t i, int gt)
{
	if (gt == LSP_ADAM_F32)
		return _mm512_loadu_ps((const float *)g + i);
	__m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
	if (gt == LSP_ADAM_BF16)
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
	return _mm512_cvtph_ps(h);
}

LSP_AVX512 LSP_INLINE __m256i bf16_512(__m512 w)
{
	__m512i x = _mm512_castps_si512(w);
	__m512i hi = _mm512_srli_epi32(x, 16);
	__m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
		_mm512_and_si512(hi, _mm512_set1_epi32(1)));
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
	__mmask16 nan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
	r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
	return _mm512_cvtepi32_epi16(r);
}

LSP_AVX512 LSP_INLINE void adam_body_avx512(const lsp_adam_coef *c, float *w,
	float *m, float *v, const void *g, const int gt, float *delta,
	uint16_t *out16, const int mode, const int pf, size_t n)
{
	const __m512 b1 = _mm512_set1_ps(c->beta1), omb1 = _mm512_set1_ps(c->omb1);
	const __m512 b2 = _mm512_set1_ps(c->beta2), omb2 = _mm512_set1_ps(c->omb2);
	const __m512 eps = _mm512_set1_ps(c->eps), rbc2 = _mm512_set1_ps(c->rbc2);
	const __m512 nstep = _mm512_set1_ps(-c->step), decay = _mm512_set1_ps(c->decay);
	const __m512 gs = _mm512_set1_ps(c->gscale);
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		LSP_PREFETCH_UPDATE(w, m, v, g, i, gt, mode, pf);
		__m512 gg = _mm512_mul_ps(ld16_512(g, i, gt), gs);
		__m512 mm = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, gg));
		__m512 vv = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i),
			_mm512_mul_ps(omb2, _mm512_mul_ps(gg, gg)));
		_mm512_storeu_ps(m + i, mm);
		_mm512_storeu_ps(v + i, vv);
		__m512 den = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), rbc2, eps);
		__m512 q = _mm512_div_ps(mm, den);
		if (mode == MODE_DELTA) {
			_mm512_storeu_ps(delta + i, _mm512_mul_ps(nstep, q));
		} else {
			__m512 ww = _mm512_fmadd_ps(nstep, q, _mm512_mul_ps(_mm512_loadu_ps(w + i), decay));
			_mm512_storeu_ps(w + i, ww);
			if (mode == MODE_W_OUT)
				_mm256_storeu_si256((__m256i *)(out16 + i), bf16_512(ww));
			if (mode == MODE_W_OUT_NT)
				_mm256_stream_si256((__m256i *)(out16 + i), bf16_512(ww));
		}
	}
	if (mode == MODE_W_OUT_NT)
		_mm_sfence(); /* order the streaming stores before completion */
	adam_scalar_range(c, mode == MODE_DELTA ? NULL : w, m, v, g, gt, delta,
		mode == MODE_W_OUT || mode == MODE_W_OUT_NT ? out16 : NULL, i, n);
}

/* One specialised function per (gradient type, mode, prefetch level) so
 * the loop carries no branches. */
#define LSP_CASE(BODY, GT, MODE, PF)                                           \
	case (GT) * 12 + (PF) * 4 + (MODE):                                    \
		BODY(c, w, m, v, g, GT, delta, out16, MODE, PF, n);            \
		break;
#define LSP_CASES_PF(BODY, GT, PF)                                             \
	LSP_CASE(BODY, GT, 0, PF) LSP_CASE(BODY, GT, 1, PF)                    \
	LSP_CASE(BODY, GT, 2, PF) LSP_CASE(BODY, GT, 3, PF)
#define LSP_CASES(BODY, GT)                                                    \
	LSP_CASES_PF(BODY, GT, 0) LSP_CASES_PF(BODY, GT, 1)                    \
	LSP_CASES_PF(BODY, GT, 2)
#define LSP_SPECIALISE(ATTR, NAME, BODY)                                       \
	ATTR static void NAME(const lsp_adam_coef *c, float *w, float *m,      \
		float *v, const void *g, int gt, float *delta, uint16_t *out16, \
		int mode, int pf, size_t n)                                     \
	{                                                                      \
		switch (gt * 12 + pf * 4 + mode) {                             \
			LSP_CASES(BODY, 0)                                     \
			LSP_CASES(BODY, 1)                                     \
			LSP_CASES(BODY, 2)                                     \
		}                                                              \
	}

LSP_SPECIALISE(LSP_AVX2, adam_avx2, adam_body_avx2)
LSP_SPECIALISE(LSP_AVX512, adam_avx512, adam_body_avx512)

LSP_AVX2 LSP_INLINE double sumsq_body_avx2(const void *g, int gt, size_t n,
	const int pf)
{
	__m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		if (pf != LSP_PF_NONE)
			LSP_PREFETCH_G(g, i + LSP_PF_SCAN, gt);
		if (pf == LSP_PF_FAR)
			LSP_PREFETCH_L2(LSP_GPTR(g, i + LSP_PF_SCAN_L2, gt));
		__m256 x = ld8_256(g, i, gt), y = ld8_256(g, i + 8, gt);
		__m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
		__m256d x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
		__m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
		__m256d y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
		a0 = _mm256_fmadd_pd(x0, x0, a0);
		a1 = _mm256_fmadd_pd(x1, x1, a1);
		a2 = _mm256_fmadd_pd(y0, y0, a2);
		a3 = _mm256_fmadd_pd(y1, y1, a3);
	}
	double acc[16];
	_mm256_storeu_pd(acc, a0);
	_mm256_storeu_pd(acc + 4, a1);
	_mm256_storeu_pd(acc + 8, a2);
	_mm256_storeu_pd(acc + 12, a3);
	sumsq_scalar_range(acc, g, gt, i, n);
	return sumsq_finish(acc);
}

LSP_AVX512 LSP_INLINE double sumsq_body_avx512(const void *g, int gt,
	size_t n, const int pf)
{
	__m512d a0 = _mm512_setzero_pd(), a1 = a0;
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		if (pf != LSP_PF_NONE)
			LSP_PREFETCH_G(g, i + LSP_PF_SCAN, gt);
		if (pf == LSP_PF_FAR)
			LSP_PREFETCH_L2(LSP_GPTR(g, i + LSP_PF_SCAN_L2, gt));
		__m512d x = _mm512_cvtps_pd(ld8_256(g, i, gt));
		__m512d y = _mm512_cvtps_pd(ld8_256(g, i + 8, gt));
		a0 = _mm512_fmadd_pd(x, x, a0);
		a1 = _mm512_fmadd_pd(y, y, a1);
	}
	double acc[16];
	_mm512_storeu_pd(acc, a0);
	_mm512_storeu_pd(acc + 8, a1);
	sumsq_scalar_range(acc, g, gt, i, n);
	return sumsq_finish(acc);
}

/* The scans, with the prefetch level hoisted out of the loop. */
LSP_AVX2 static double sumsq_avx2(const void *g, int gt, size_t n, int pf)
{
	switch (pf) {
	case LSP_PF_NONE:
		return sumsq_body_avx2(g, gt, n, LSP_PF_NONE);
	case LSP_PF_NEAR:
		return sumsq_body_avx2(g, gt, n, LSP_PF_NEAR);
	default:
		return sumsq_body_avx2(g, gt, n, LSP_PF_FAR);
	}
}

LSP_AVX512 static double sumsq_avx512(const void *g, int gt, size_t n, int pf)
{
	switch (pf) {
	case LSP_PF_NONE:
		return sumsq_body_avx512(g, gt, n, LSP_PF_NONE);
	case LSP_PF_NEAR:
		return sumsq_body_avx512(g, gt, n, LSP_PF_NEAR);
	default:
		return sumsq_body_avx512(g, gt, n, LSP_PF_FAR);
	}
}
#endif /* x86 */

/* ---- dispatch ------------------------------------------------------------ */

int lsp_adam_simd_compiled(void)
{
#ifdef LSP_HAVE_X86
	return 1;
#else
	return 0;
#endif
}

/* lsp_adam_pf is lsp_adam with the software prefetch level pf (LSP_PF_*;
 * out of range means LSP_PF_NONE). The results are the same bits at every
 * level. */
void lsp_adam_pf(int path, lsp_adam_coef c, float *w, float *m, float *v,
	const void *g, int gtype, float *delta, uint16_t *out16, size_t n,
	int pf)
{
	if (gtype < LSP_ADAM_F32 || gtype > LSP_ADAM_F16)
		return; /* the Go side validates; never read with a wrong width */
	if (pf < LSP_PF_NONE || pf > LSP_PF_FAR)
		pf = LSP_PF_NONE;
#ifdef LSP_HAVE_X86
	int mode = w == NULL ? MODE_DELTA : (out16 ? MODE_W_OUT : MODE_W);
	/* Streaming stores need the vector's alignment (32 bytes for 16 bf16,
	 * 16 for 8); host buffers and chunk starts keep it. */
	if (path == LSP_PATH_AVX512) {
		if (mode == MODE_W_OUT && ((uintptr_t)out16 & 31) == 0)
			mode = MODE_W_OUT_NT;
		adam_avx512(&c, w, m, v, g, gtype, delta, out16, mode, pf, n);
		return;
	}
	if (path == LSP_PATH_AVX2) {
		if (mode == MODE_W_OUT && ((uintptr_t)out16 & 15) == 0)
			mode = MODE_W_OUT_NT;
		adam_avx2(&c, w, m, v, g, gtype, delta, out16, mode, pf, n);
		return;
	}
#else
	(void)path;
	(void)pf;
#endif
	adam_scalar_range(&c, w, m, v, g, gtype, delta, out16, 0, n);
}

void lsp_adam(int path, lsp_adam_coef c, float *w, float *m, float *v,
	const void *g, int gtype, float *delta, uint16_t *out16, size_t n)
{
	lsp_adam_pf(path, c, w, m, v, g, gtype, delta, out16, n, LSP_PF_NONE);
}

static double sumsq_pf(int path, const void *g, int gtype, size_t n, int pf)
{
	if (gtype < LSP_ADAM_F32 || gtype > LSP_ADAM_F16)
		return NAN;
	if (pf < LSP_PF_NONE || pf > LSP_PF_FAR)
		pf = LSP_PF_NONE;
#ifdef LSP_HAVE_X86
	if (path == LSP_PATH_AVX512)
		return sumsq_avx512(g, gtype, n, pf);
	if (path == LSP_PATH_AVX2)
		return sumsq_avx2(g, gtype, n, pf);
#else
	(void)path;
	(void)pf;
#endif
	double acc[16] = {0};
	sumsq_scalar_range(acc, g, gtype, 0, n);
	return sumsq_finish(acc);
}

double lsp_adam_sumsq(int path, const void *g, int gtype, size_t n)
{
	return sumsq_pf(path, g, gtype, n, LSP_PF_NONE);
}

/* lsp_adam_sumsq_chunks writes the canonical sum of squares of each chunk of
 * `chunk` elements of g[0:n] (the last may be short) to out[0], out[1], ...
 * (pf as for lsp_adam_pf): one call for a worker's whole run of chunks. */
void lsp_adam_sumsq_chunks(int path, const void *g, int gtype, size_t n,
	size_t chunk, double *out, int pf)
{
	size_t size = gtype == LSP_ADAM_F32 ? 4 : 2;
	for (size_t lo = 0, k = 0; lo < n; lo += chunk, k++) {
		size_t len = n - lo < chunk ? n - lo : chunk;
		out[k] = sumsq_pf(path, (const char *)g + lo * size, gtype, len, pf);
	}
}

/* ---- the unfused (torch order) AdamW of the CPU backend -------------------
 *
 * lsp_adamw_plain is the CPU backend's AdamW arithmetic, which the CUDA
 * kernel and its simulator match bit for bit: no fused multiply-add, the
 * bias corrections applied by division, per element in fp32:
 *
 *   g   = grad * gscale
 *   m   = beta1 * m + omb1 * g
 *   v   = beta2 * v + (omb2 * g) * g
 *   den = sqrt(v) / sqrtbc2 + eps
 *   w   = w * decay - (step * m) / den
 *   out16 = bf16(w) (nearest even) when out16 != NULL
 *
 * Each operation is correctly rounded in every path (mul, add, div and sqrt
 * are IEEE in SSE/AVX and in C), and contraction into FMA is off (-std=c11
 * for GCC, the pragma for clang), so all paths give the same bits as the
 * Go loop it replaces. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static void adamw_plain_scalar(const lsp_adamw_plain_coef *c, float *w,
	float *m, float *v, const void *g, int gt, uint16_t *out16, size_t i0,
	size_t n)
{
	for (size_t i = i0; i < n; i++) {
		float gi = lsp_load_g(g, i, gt) * c->gscale;
		float mm = c->beta1 * m[i] + c->omb1 * gi;
		float vv = c->beta2 * v[i] + (c->omb2 * gi) * gi;
		m[i] = mm;
		v[i] = vv;
		float den = sqrtf(vv) / c->sqrtbc2 + c->eps;
		float ww = w[i] * c->decay - (c->step * mm) / den;
		w[i] = ww;
		if (out16)
			out16[i] = lsp_f32_to_bf16(ww);
	}
}

#ifdef LSP_HAVE_X86
LSP_AVX2 LSP_INLINE void adamw_plain_body_avx2(const lsp_adamw_plain_coef *c,
	float *w, float *m, float *v, const void *g, const int gt,
	uint16_t *out16, const int out, size_t n)
{
	const __m256 b1 = _mm256_set1_ps(c->beta1), omb1 = _mm256_set1_ps(c->omb1);
	const __m256 b2 = _mm256_set1_ps(c->beta2), omb2 = _mm256_set1_ps(c->omb2);
	const __m256 eps = _mm256_set1_ps(c->eps), sbc2 = _mm256_set1_ps(c->sqrtbc2);
	const __m256 step = _mm256_set1_ps(c->step), decay = _mm256_set1_ps(c->decay);
	const __m256 gs = _mm256_set1_ps(c->gscale);
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		LSP_PREFETCH_UPDATE(w, m, v, g, i, gt, MODE_W, LSP_PF_NEAR);
		__m256 gg = _mm256_mul_ps(ld8_256(g, i, gt), gs);
		__m256 mm = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, gg));
		__m256 vv = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
			_mm256_mul_ps(_mm256_mul_ps(omb2, gg), gg));
		_mm256_storeu_ps(m + i, mm);
		_mm256_storeu_ps(v + i, vv);
		__m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), sbc2), eps);
		__m256 ww = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(w + i), decay),
			_mm256_div_ps(_mm256_mul_ps(step, mm), den));
		_mm256_storeu_ps(w + i, ww);
		if (out)
			_mm_storeu_si128((__m128i *)(out16 + i), bf16_256(ww));
	}
	adamw_plain_scalar(c, w, m, v, g, gt, out ? out16 : NULL, i, n);
}

LSP_AVX512 LSP_INLINE void adamw_plain_body_avx512(const lsp_adamw_plain_coef *c,
	float *w, float *m, float *v, const void *g, const int gt,
	uint16_t *out16, const int out, size_t n)
{
	const __m512 b1 = _mm512_set1_ps(c->beta1), omb1 = _mm512_set1_ps(c->omb1);
	const __m512 b2 = _mm512_set1_ps(c->beta2), omb2 = _mm512_set1_ps(c->omb2);
	const __m512 eps = _mm512_set1_ps(c->eps), sbc2 = _mm512_set1_ps(c->sqrtbc2);
	const __m512 step = _mm512_set1_ps(c->step), decay = _mm512_set1_ps(c->decay);
	const __m512 gs = _mm512_set1_ps(c->gscale);
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		LSP_PREFETCH_UPDATE(w, m, v, g, i, gt, MODE_W, LSP_PF_NEAR);
		__m512 gg = _mm512_mul_ps(ld16_512(g, i, gt), gs);
		__m512 mm = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, gg));
		__m512 vv = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
			_mm512_mul_ps(_mm512_mul_ps(omb2, gg), gg));
		_mm512_storeu_ps(m + i, mm);
		_mm512_storeu_ps(v + i, vv);
		__m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), sbc2), eps);
		__m512 ww = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(w + i), decay),
			_mm512_div_ps(_mm512_mul_ps(step, mm), den));
		_mm512_storeu_ps(w + i, ww);
		if (out)
			_mm256_storeu_si256((__m256i *)(out16 + i), bf16_512(ww));
	}
	adamw_plain_scalar(c, w, m, v, g, gt, out ? out16 : NULL, i, n);
}

/* One loop per (gradient type, bf16 copy), as for lsp_adam. */
#define LSP_PLAIN(ATTR, NAME, BODY)                                            \
	ATTR static void NAME(const lsp_adamw_plain_coef *c, float *w,         \
		float *m, float *v, const void *g, int gt, uint16_t *out16,     \
		size_t n)                                                       \
	{                                                                      \
		int out = out16 != NULL;                                       \
		switch (gt * 2 + out) {                                        \
		case 0: BODY(c, w, m, v, g, 0, out16, 0, n); break;            \
		case 1: BODY(c, w, m, v, g, 0, out16, 1, n); break;            \
		case 2: BODY(c, w, m, v, g, 1, out16, 0, n); break;            \
		case 3: BODY(c, w, m, v, g, 1, out16, 1, n); break;            \
		case 4: BODY(c, w, m, v, g, 2, out16, 0, n); break;            \
		case 5: BODY(c, w, m, v, g, 2, out16, 1, n); break;            \
		}                                                              \
	}
LSP_PLAIN(LSP_AVX2, adamw_plain_avx2, adamw_plain_body_avx2)
LSP_PLAIN(LSP_AVX512, adamw_plain_avx512, adamw_plain_body_avx512)
#endif

void lsp_adamw_plain(int path, lsp_adamw_plain_coef c, float *w, float *m,
	float *v, const void *g, int gtype, uint16_t *out16, size_t n)
{
	if (gtype < LSP_ADAM_F32 || gtype > LSP_ADAM_F16)
		return;
#ifdef LSP_HAVE_X86
	if (path == LSP_PATH_AVX512) {
		adamw_plain_avx512(&c, w, m, v, g, gtype, out16, n);
		return;
	}
	if (path == LSP_PATH_AVX2) {
		adamw_plain_avx2(&c, w, m, v, g, gtype, out16, n);
		return;
	}
#else
	(void)path;
#endif
	adamw_plain_scalar(&c, w, m, v, g, gtype, out16, 0, n);
}
