/*
 * adam.h: the fused CPU AdamW step and the gradient pre-scan, in plain C11
 * with AVX-512F and AVX2+FMA variants selected per call (the Go side picks
 * the path with cpuid). Every path computes bit-identical results: the only
 * fused operations are explicit fmaf / FMA intrinsics, and sqrt, division and
 * the conversions are correctly rounded in every path. Pointers passed in are
 * used for the duration of the call only and never retained.
 *
 * The update, per element, in fp32 (each line one rounding):
 *
 *   g  = gscale * grad                       (grad converted exactly to fp32)
 *   m  = fmaf(beta1, m, omb1 * g)            (omb1 = 1 - beta1)
 *   v  = fmaf(beta2, v, omb2 * (g * g))      (omb2 = 1 - beta2)
 *   den = fmaf(sqrtf(v), rbc2, eps)          (rbc2 = 1 / sqrt(1 - beta2^t))
 *   q  = m / den
 *   weights mode:  w = fmaf(-step, q, w * decay)   (step = lr / (1 - beta1^t),
 *                                                   decay = 1 - lr * wd)
 *                  out16 = bf16(w), round to nearest even, when out16 != NULL
 *   delta mode:    delta = -step * q               (w == NULL; may alias grad)
 *
 * The pre-scan returns the sum of squares of the gradient in double, in a
 * canonical order shared by all paths (16 lanes, lane j takes the elements
 * with index = j mod 16, then a fixed pairwise tree), so the result is the
 * same bits whatever the path. It is Inf or NaN exactly when some gradient
 * element is (a finite fp32 squared never overflows a double).
 */
#ifndef LSP_HOST_ADAM_H
#define LSP_HOST_ADAM_H

#include <stddef.h>
#include <stdint.h>

/* Gradient element types. */
enum { LSP_ADAM_F32 = 0, LSP_ADAM_BF16 = 1, LSP_ADAM_F16 = 2 };

/* Paths; the numbers match the Go SIMD constants. */
enum { LSP_PATH_SCALAR = 0, LSP_PATH_AVX2 = 1, LSP_PATH_AVX512 = 2 };

/* Per-step coefficients, computed once per tensor and step in double on the
 * Go side and rounded to fp32. */
typedef struct {
	float beta1, omb1;
	float beta2, omb2;
	float eps;
	float rbc2;   /* 1 / sqrt(1 - beta2^t) */
	float step;   /* lr / (1 - beta1^t) */
	float decay;  /* 1 - lr * wd; 1 in delta mode */
	float gscale; /* gradient scale (clipping); 1 when none */
} lsp_adam_coef;

/* lsp_adam runs the update on n elements with the given path (a path the
 * CPU lacks, or one not compiled in, falls back to scalar). */
void lsp_adam(int path, lsp_adam_coef c, float *w, float *m, float *v,
	const void *g, int gtype, float *delta, uint16_t *out16, size_t n);

/* lsp_adam_sumsq returns the canonical sum of squares of n gradient
 * elements. */
double lsp_adam_sumsq(int path, const void *g, int gtype, size_t n);

/* Software prefetch levels of lsp_adam_pf and lsp_adam_sumsq_chunks: none
 * (the hardware prefetchers only), near (into L1, 1-2 KiB ahead), far (near,
 * and further ahead into L2). Every level gives the same bits. */
enum { LSP_PF_NONE = 0, LSP_PF_NEAR = 1, LSP_PF_FAR = 2 };

/* lsp_adam_pf is lsp_adam with the software prefetch level pf. lsp_adam
 * prefetches nothing. */
void lsp_adam_pf(int path, lsp_adam_coef c, float *w, float *m, float *v,
	const void *g, int gtype, float *delta, uint16_t *out16, size_t n,
	int pf);

/* lsp_adam_sumsq_chunks writes the canonical sum of squares of each
 * chunk-element piece of n gradient elements to out, in one call, with
 * the software prefetch level pf. */
void lsp_adam_sumsq_chunks(int path, const void *g, int gtype, size_t n,
	size_t chunk, double *out, int pf);

/* lsp_adam_simd_compiled reports whether the SIMD paths were compiled in
 * (x86-64 with a compiler that supports target attributes). */
int lsp_adam_simd_compiled(void);

/* Coefficients of lsp_adamw_plain, computed in fp32 as the CPU backend does. */
typedef struct {
	float beta1, omb1;
	float beta2, omb2;
	float eps;
	float sqrtbc2; /* sqrt(1 - beta2^t) */
	float step;    /* lr / (1 - beta1^t) */
	float decay;   /* 1 - lr * wd */
	float gscale;  /* gradient scale (clipping); 1 when none */
} lsp_adamw_plain_coef;

/* lsp_adamw_plain is the CPU backend's unfused AdamW on n elements (adam.c
 * states its arithmetic): w, m, v updated in place, out16 (may be NULL)
 * gets bf16(w). */
void lsp_adamw_plain(int path, lsp_adamw_plain_coef c, float *w, float *m,
	float *v, const void *g, int gtype, uint16_t *out16, size_t n);

#endif
