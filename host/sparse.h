/*
 * sparse.h: the C side of host's LSP sparse-projection cores (sparse.go):
 * the gather of compress (A = P^T X^T, B = dY Q) and of T = Delta Q^T, the
 * row combination S = A B, and the W update of apply. Three paths, as for
 * Sgemm (0 scalar, 1 avx2, 2 avx512, matching host.SIMD).
 *
 * Exactness: every output is summed in fp32 from +0 in the order written
 * below, each product rounded to fp32 before it is added (no FMA: the file
 * is compiled with contraction off and the SIMD paths use separate multiply
 * and add instructions). The SIMD paths only run independent outputs in
 * different lanes, so every path gives the scalar path's bits, which are
 * those of the plain Go loops of train/cpu (the CUDA kernels' reference).
 *
 * Limits: no argument checking here (sparse.go checks shapes, lengths and
 * index ranges); pointers are only used for the duration of a call.
 */
#ifndef LSP_HOST_SPARSE_H
#define LSP_HOST_SPARSE_H

#include <stddef.h>
#include <stdint.h>

/* lsp_host_sparse_gather_scratch is the number of floats of scratch that
 * lsp_host_sparse_gather needs on path for rows-long rows of x and d outputs
 * (0 for the scalar path). */
ptrdiff_t lsp_host_sparse_gather_scratch(int path, ptrdiff_t rows, ptrdiff_t d);

/* lsp_host_sparse_gather: for t in [lo, hi) and c in [0, d),
 *   out[c*sa + t*st] = sum over k in [ptr[c], ptr[c+1]), ascending,
 *                      of val[k] * x[t*rows + idx[k]];
 * ptr == NULL means output c's entries are [c*r, (c+1)*r). x is
 * [hi, rows]; idx entries are in [0, rows). scratch holds
 * lsp_host_sparse_gather_scratch floats, 64-byte aligned; out must not overlap
 * x or scratch. */
void lsp_host_sparse_gather(int path, float *out, const float *x, ptrdiff_t rows,
		       const int32_t *ptr, ptrdiff_t r, const int32_t *idx,
		       const float *val, ptrdiff_t d, ptrdiff_t sa,
		       ptrdiff_t st, ptrdiff_t lo, ptrdiff_t hi,
		       float *scratch);

/* lsp_host_sparse_s: rows a in [lo, hi) of S [d, d] = A B (A [d, BT], B [BT, d]),
 *   acc = sum over t ascending of A[a, t] * B[t, b],
 *   S[a, b] = accumulate ? acc + S[a, b] : acc.
 * The rows index A and S only, so hi may exceed d: S [*, d] = A [*, BT]
 * B [BT, d] at any number of rows (host.DenseRows). */
void lsp_host_sparse_s(int path, float *S, const float *A, const float *B,
		  ptrdiff_t BT, ptrdiff_t d, int accumulate, ptrdiff_t lo,
		  ptrdiff_t hi);

/* lsp_host_sparse_apply_w: rows i in [lo, hi) of w [*, n], in place,
 *   upd = sum over s ascending < r of pval[i*r+s] * T[pidx[i*r+s]*n + j],
 *   w[i, j] = decay*w[i, j] + upd. */
void lsp_host_sparse_apply_w(int path, float *w, const float *T,
			const int32_t *pidx, const float *pval, ptrdiff_t n,
			ptrdiff_t r, float decay, ptrdiff_t lo, ptrdiff_t hi);

#endif
