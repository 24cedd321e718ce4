/*
 * gemm.h: the C side of host.Sgemm, single-precision row-major matrix
 * multiply C = alpha*op(A)*op(B) + beta*C in the Goto/BLIS style: op(B) is
 * packed into NR-wide panels, op(A) into MR-tall panels per cache block, and
 * a register-blocked MR x NR microkernel does the arithmetic.
 *
 * Three paths share one driver and differ in their microkernel and blocking:
 * scalar (portable C, the reference), AVX2+FMA and AVX-512F, the SIMD ones
 * compiled with function target attributes so no special CFLAGS are needed.
 * Path numbers match host.SIMD (0 scalar, 1 avx2, 2 avx512).
 *
 * Determinism: K is cut into fixed KC-blocks (a per-path constant), each
 * block is summed in registers from zero in ascending k and then added into
 * C, blocks in ascending order. The split of C over threads (the Go side)
 * never changes that order, so results are bit-identical for any thread
 * count. Edge tiles run the same microkernel on zero-padded panels.
 *
 * Limits: no argument checking here (the Go side checks shapes, strides and
 * lengths); pointers are only used for the duration of a call.
 */
#ifndef LSP_GEMM_H
#define LSP_GEMM_H

#include <stddef.h>

/* Blocking of one path: microtile mr x nr, K-block kc (fixed, so the
 * summation order is too), at most mc rows (a multiple of mr) and nc
 * columns (a multiple of nr) per task; a task's kc x nc block of packed B is
 * meant for L2, one mr x kc micropanel of packed A for L1. */
typedef struct {
	int mr, nr, kc, mc, nc;
} lsp_gemm_params;

/* lsp_sgemm_params fills *out for path; returns 0, or -1 for an unknown
 * path or one this build lacks. */
int lsp_sgemm_params(int path, lsp_gemm_params *out);

/* lsp_sgemm_pack_b packs columns [j0, j0+ncols) of op(B) (K x N, B is K x N
 * row-major, or N x K when transB), rows [kb, kb+kn) of it, into bp. kb is a
 * multiple of the path's kc. Layout: for each K-block starting at k0 with
 * width kc, at bp + (k0-kb)*npanels*nr, panel p holds kc rows of nr floats
 * at offset p*kc*nr; columns past ncols are zero. Only panels [p0, p1) are
 * written, so threads can share one bp. */
void lsp_sgemm_pack_b(int path, int transB, const float *B, ptrdiff_t ldb,
		      ptrdiff_t kb, ptrdiff_t kn, ptrdiff_t j0, ptrdiff_t ncols,
		      ptrdiff_t npanels, ptrdiff_t p0, ptrdiff_t p1, float *bp);

/* lsp_sgemm_task adds the K range [kb, kb+kn) of the product into the C
 * tile rows [i0, i0+mrows), columns [cj0, cj0+ncols), where cj0 is the
 * first column of panel p0 of bp (packed by lsp_sgemm_pack_b for the same
 * K range with npanels panels). The K-block at k0 == 0 applies beta (and
 * does not read C when beta == 0); later ones add. mrows must not exceed
 * the path's mc. ap is scratch of at least mc*kc floats, private to the
 * calling thread. */
void lsp_sgemm_task(int path, int transA, const float *A, ptrdiff_t lda,
		    ptrdiff_t kb, ptrdiff_t kn, ptrdiff_t i0, ptrdiff_t mrows,
		    const float *bp, ptrdiff_t npanels, ptrdiff_t p0,
		    ptrdiff_t cj0, ptrdiff_t ncols, float alpha, float beta,
		    float *C, ptrdiff_t ldc, float *ap);

/* Internal: what each path file provides to the driver (gemm_driver.c). */

/* A microkernel: c[0:mr][0:nr] (row stride ldc) = beff*c + alpha*sum over
 * k < kc of a[k*mr+i]*b[k*nr+j]; when overwrite, c is not read and the
 * result is alpha*sum. The sum runs over ascending k from zero. */
typedef void (*lsp_gemm_kernel)(ptrdiff_t kc, const float *a, const float *b,
				float *c, ptrdiff_t ldc, float alpha,
				float beff, int overwrite);

/* Packs rows [i0, i0+mrows) of op(A) (transA: A is K x M), K range
 * [k0, k0+kc), into mr-tall panels: panel q at ap + q*kc*mr holds
 * ap[k*mr+i]; rows past mrows are zero. */
typedef void (*lsp_gemm_pack_a_fn)(int transA, const float *A, ptrdiff_t lda,
				   ptrdiff_t i0, ptrdiff_t mrows,
				   ptrdiff_t k0, ptrdiff_t kc, float *ap);

/* Packs panels [p0, p1) of columns [j0, j0+ncols) of op(B) (transB: B is
 * N x K), K range [k0, k0+kc), into nr-wide panels: panel p at
 * bp + p*kc*nr holds bp[k*nr+j]; columns past ncols are zero. */
typedef void (*lsp_gemm_pack_b_fn)(int transB, const float *B, ptrdiff_t ldb,
				   ptrdiff_t j0, ptrdiff_t ncols,
				   ptrdiff_t p0, ptrdiff_t p1,
				   ptrdiff_t k0, ptrdiff_t kc, float *bp);

/* A path: its blocking, its microkernel and its packers, where it has its
 * own (NULL: the driver's generic ones, for panels of p.mr and p.nr). */
typedef struct {
	lsp_gemm_params p;
	lsp_gemm_kernel kernel;
	lsp_gemm_pack_a_fn pack_a;
	lsp_gemm_pack_b_fn pack_b;
} lsp_gemm_path;

extern const lsp_gemm_path lsp_gemm_path_scalar;
extern const lsp_gemm_path lsp_gemm_path_avx2;
extern const lsp_gemm_path lsp_gemm_path_avx512;

#endif
