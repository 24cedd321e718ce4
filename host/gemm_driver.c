/*
 * gemm_driver.c: the path-independent part of host.Sgemm: packing of op(B)
 * and op(A) into panels, and the loops over K-blocks and microtiles of one
 * C tile. The microkernels live in gemm_scalar.c, gemm_avx2.c and
 * gemm_avx512.c; the split of C over threads lives in gemm.go.
 *
 * Limits: trusts its caller (gemm.go) for shapes, strides and buffer sizes.
 */
#include <string.h>

#include "gemm.h"

static const lsp_gemm_path *path_of(int path)
{
	switch (path) {
	case 0:
		return &lsp_gemm_path_scalar;
	case 1:
		return &lsp_gemm_path_avx2;
	case 2:
		return &lsp_gemm_path_avx512;
	}
	return NULL;
}

int lsp_sgemm_params(int path, lsp_gemm_params *out)
{
	const lsp_gemm_path *p = path_of(path);
	if (p == NULL)
		return -1;
	*out = p->p;
	return 0;
}

static ptrdiff_t min_pd(ptrdiff_t a, ptrdiff_t b) { return a < b ? a : b; }

/* Packing op(A) and op(B) is one job on lines of a matrix M (rows of
 * op(A), columns of op(B)): panels [p0, p1) of w lines each, the last one
 * cut to n - p*w lines and padded with zeros to w, hold elements k0 ..
 * k0+kc-1 of lines l0 + p*w + j, stored kc x w (element k of line j of
 * panel p at out[p*kc*w + k*w + j]). Where a line is a row of the matrix
 * in memory (ld apart) pack_strided reads it whole and writes strided;
 * where it is a column, pack_dealt walks each row of the matrix once,
 * dealing w floats to each panel (a column strip would miss cache). */
static void pack_strided(const float *M, ptrdiff_t ld, ptrdiff_t l0,
			 ptrdiff_t n, ptrdiff_t k0, ptrdiff_t kc, ptrdiff_t w,
			 ptrdiff_t p0, ptrdiff_t p1, float *out)
{
	for (ptrdiff_t p = p0; p < p1; p++) {
		float *dst = out + p * kc * w;
		ptrdiff_t c0 = l0 + p * w;
		ptrdiff_t lines = min_pd(w, n - p * w);
		ptrdiff_t j = 0;
		for (; j < lines; j++) {
			const float *src = M + (c0 + j) * ld + k0;
			for (ptrdiff_t k = 0; k < kc; k++)
				dst[k * w + j] = src[k];
		}
		for (; j < w; j++)
			for (ptrdiff_t k = 0; k < kc; k++)
				dst[k * w + j] = 0;
	}
}

static void pack_dealt(const float *M, ptrdiff_t ld, ptrdiff_t l0,
		       ptrdiff_t n, ptrdiff_t k0, ptrdiff_t kc, ptrdiff_t w,
		       ptrdiff_t p0, ptrdiff_t p1, float *out)
{
	for (ptrdiff_t k = 0; k < kc; k++) {
		const float *src = M + (k0 + k) * ld + l0;
		for (ptrdiff_t p = p0; p < p1; p++) {
			float *d = out + p * kc * w + k * w;
			ptrdiff_t lines = min_pd(w, n - p * w);
			memcpy(d, src + p * w, (size_t)lines * sizeof(float));
			for (ptrdiff_t j = lines; j < w; j++)
				d[j] = 0;
		}
	}
}

/* The generic packers, for the paths without their own (pack_a and
 * pack_b NULL). */
static void pack_a_generic(int mr, int transA, const float *A, ptrdiff_t lda,
			   ptrdiff_t i0, ptrdiff_t mrows, ptrdiff_t k0,
			   ptrdiff_t kc, float *ap)
{
	const ptrdiff_t npan = (mrows + mr - 1) / mr;
	if (transA) /* op(A)[r][k] = A[k][r] */
		pack_dealt(A, lda, i0, mrows, k0, kc, mr, 0, npan, ap);
	else /* op(A)[r][k] = A[r][k] */
		pack_strided(A, lda, i0, mrows, k0, kc, mr, 0, npan, ap);
}

static void pack_b_generic(int nr, int transB, const float *B, ptrdiff_t ldb,
			   ptrdiff_t j0, ptrdiff_t ncols, ptrdiff_t p0,
			   ptrdiff_t p1, ptrdiff_t k0, ptrdiff_t kc, float *bp)
{
	if (transB) /* op(B)[k][c] = B[c][k] */
		pack_strided(B, ldb, j0, ncols, k0, kc, nr, p0, p1, bp);
	else /* op(B)[k][c] = B[k][c] */
		pack_dealt(B, ldb, j0, ncols, k0, kc, nr, p0, p1, bp);
}

void lsp_sgemm_pack_b(int path, int transB, const float *B, ptrdiff_t ldb,
		      ptrdiff_t kb, ptrdiff_t kn, ptrdiff_t j0,
		      ptrdiff_t ncols, ptrdiff_t npanels, ptrdiff_t p0,
		      ptrdiff_t p1, float *bp)
{
	const lsp_gemm_path *pp = path_of(path);
	const ptrdiff_t nr = pp->p.nr, KC = pp->p.kc;
	for (ptrdiff_t k0 = kb; k0 < kb + kn; k0 += KC) {
		ptrdiff_t kc = min_pd(KC, kb + kn - k0);
		float *dst = bp + (k0 - kb) * npanels * nr;
		if (pp->pack_b != NULL)
			pp->pack_b(transB, B, ldb, j0, ncols, p0, p1, k0, kc, dst);
		else
			pack_b_generic(nr, transB, B, ldb, j0, ncols, p0, p1, k0, kc, dst);
	}
}

void lsp_sgemm_task(int path, int transA, const float *A, ptrdiff_t lda,
		    ptrdiff_t kb, ptrdiff_t kn, ptrdiff_t i0, ptrdiff_t mrows,
		    const float *bp, ptrdiff_t npanels, ptrdiff_t p0,
		    ptrdiff_t cj0, ptrdiff_t ncols, float alpha, float beta,
		    float *C, ptrdiff_t ldc, float *ap)
{
	const lsp_gemm_path *pp = path_of(path);
	const ptrdiff_t mr = pp->p.mr, nr = pp->p.nr, KC = pp->p.kc;
	const lsp_gemm_kernel kern = pp->kernel;
	/* Edge tiles go through this buffer so they run the same kernel. */
	float tmp[64 * 64];

	for (ptrdiff_t k0 = kb; k0 < kb + kn; k0 += KC) {
		ptrdiff_t kc = min_pd(KC, kb + kn - k0);
		int first = k0 == 0;
		int overwrite = first && beta == 0.0f;
		float beff = first ? beta : 1.0f;
		const float *blk = bp + (k0 - kb) * npanels * nr;
		if (pp->pack_a != NULL)
			pp->pack_a(transA, A, lda, i0, mrows, k0, kc, ap);
		else
			pack_a_generic(mr, transA, A, lda, i0, mrows, k0, kc, ap);

		/* One A micropanel (mr x kc) stays in L1 while the task's B
		 * panels (kc x ncols, sized for L2) stream past it. */
		for (ptrdiff_t ic = 0; ic < mrows; ic += mr) {
			const float *a = ap + (ic / mr) * kc * mr;
			ptrdiff_t rows = min_pd(mr, mrows - ic);
			for (ptrdiff_t jc = 0; jc < ncols; jc += nr) {
				const float *b = blk + (p0 + jc / nr) * kc * nr;
				ptrdiff_t cols = min_pd(nr, ncols - jc);
				float *c = C + (i0 + ic) * ldc + cj0 + jc;
				if (rows == mr && cols == nr) {
					kern(kc, a, b, c, ldc, alpha, beff,
					     overwrite);
					continue;
				}
				if (!overwrite) {
					/* Rows and columns past the edge are
					 * computed and dropped; keep them 0. */
					memset(tmp, 0,
					       (size_t)(mr * nr) * sizeof(float));
					for (ptrdiff_t i = 0; i < rows; i++)
						memcpy(tmp + i * nr,
						       c + i * ldc,
						       (size_t)cols *
							       sizeof(float));
				}
				kern(kc, a, b, tmp, nr, alpha, beff,
				     overwrite);
				for (ptrdiff_t i = 0; i < rows; i++)
					memcpy(c + i * ldc, tmp + i * nr,
					       (size_t)cols * sizeof(float));
			}
		}
	}
}
