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

void lsp_gemm_pack_a_generic(int mr, int transA, const float *A,
			     ptrdiff_t lda, ptrdiff_t i0, ptrdiff_t mrows,
			     ptrdiff_t k0, ptrdiff_t kc, float *ap)
{
	const ptrdiff_t npan = (mrows + mr - 1) / mr;
	if (transA) {
		/* op(A)[r][k] = A[k][r]: walk each row of A once, dealing mr
		 * floats to each panel (a column strip would miss cache). */
		for (ptrdiff_t k = 0; k < kc; k++) {
			const float *src = A + (k0 + k) * lda + i0;
			for (ptrdiff_t q = 0; q < npan; q++) {
				float *d = ap + q * kc * mr + k * mr;
				ptrdiff_t rows = min_pd(mr, mrows - q * mr);
				ptrdiff_t i = 0;
				for (; i < rows; i++)
					d[i] = src[q * mr + i];
				for (; i < mr; i++)
					d[i] = 0;
			}
		}
		return;
	}
	/* op(A)[r][k] = A[r][k]: walk each row, write strided. */
	for (ptrdiff_t q = 0; q < npan; q++) {
		float *dst = ap + q * kc * mr;
		ptrdiff_t r0 = i0 + q * mr;
		ptrdiff_t rows = min_pd(mr, mrows - q * mr);
		ptrdiff_t i = 0;
		for (; i < rows; i++) {
			const float *src = A + (r0 + i) * lda + k0;
			for (ptrdiff_t k = 0; k < kc; k++)
				dst[k * mr + i] = src[k];
		}
		for (; i < mr; i++)
			for (ptrdiff_t k = 0; k < kc; k++)
				dst[k * mr + i] = 0;
	}
}

void lsp_gemm_pack_b_generic(int nr, int transB, const float *B,
			     ptrdiff_t ldb, ptrdiff_t j0, ptrdiff_t ncols,
			     ptrdiff_t p0, ptrdiff_t p1, ptrdiff_t k0,
			     ptrdiff_t kc, float *bp)
{
	if (!transB) {
		/* op(B)[k][c] = B[k][c]: walk each row of B once, dealing nr
		 * floats to each panel. */
		for (ptrdiff_t k = 0; k < kc; k++) {
			const float *src = B + (k0 + k) * ldb + j0;
			for (ptrdiff_t p = p0; p < p1; p++) {
				float *d = bp + p * kc * nr + k * nr;
				ptrdiff_t cols = min_pd(nr, ncols - p * nr);
				memcpy(d, src + p * nr,
				       (size_t)cols * sizeof(float));
				for (ptrdiff_t j = cols; j < nr; j++)
					d[j] = 0;
			}
		}
		return;
	}
	/* op(B)[k][c] = B[c][k]: walk each row of B, write strided. */
	for (ptrdiff_t p = p0; p < p1; p++) {
		float *dst = bp + p * kc * nr;
		ptrdiff_t c0 = j0 + p * nr;
		ptrdiff_t cols = min_pd(nr, ncols - p * nr);
		ptrdiff_t j = 0;
		for (; j < cols; j++) {
			const float *src = B + (c0 + j) * ldb + k0;
			for (ptrdiff_t k = 0; k < kc; k++)
				dst[k * nr + j] = src[k];
		}
		for (; j < nr; j++)
			for (ptrdiff_t k = 0; k < kc; k++)
				dst[k * nr + j] = 0;
	}
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
		pp->pack_b(transB, B, ldb, j0, ncols, p0, p1, k0, kc,
			   bp + (k0 - kb) * npanels * nr);
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
		pp->pack_a(transA, A, lda, i0, mrows, k0, kc, ap);

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
