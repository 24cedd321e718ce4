/*
 * rmw.h: the read-modify-write ceiling kernel over four float32 arrays with
 * the Adam update's bytes per element: w, m and v read and written, g read
 * (28 bytes), but almost no arithmetic:
 *
 *   m[i] = m[i] + g[i];  v[i] = v[i] + g[i]*g[i];  w[i] = w[i] + s*m[i]
 *
 * (m[i] the new value). Scalar, AVX2+FMA and AVX-512F paths; pf != 0 adds
 * the software prefetch of the Adam update (adam.c) on every stream.
 * Pointers are used for the call only.
 */
#ifndef LSP_HOST_RMW_H
#define LSP_HOST_RMW_H

#include <stddef.h>

void lsp_rmw4(int path, int pf, float *w, const float *g, float *m, float *v, float s, size_t n);

#endif
