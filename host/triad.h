/*
 * triad.h: the STREAM triad a[i] = b[i] + s * c[i] with scalar, AVX2+FMA
 * and AVX-512F paths, used to measure the memory bandwidth that the Adam step
 * is compared with. Plain (write-allocating) stores, as STREAM compiled with
 * a stock compiler does, or non-temporal ones (nt != 0, SIMD paths, where a
 * is 64-byte aligned) that skip the write-allocate read; pointers are used
 * for the call only.
 */
#ifndef LSP_HOST_TRIAD_H
#define LSP_HOST_TRIAD_H

#include <stddef.h>

void lsp_triad(int path, int nt, float *a, const float *b, const float *c, float s, size_t n);

#endif
