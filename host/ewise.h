/*
 * ewise.h: the CPU backend's exp-heavy row and elementwise ops (train/cpu)
 * in C: cross-entropy over rows of logits, and gelu_new forward and
 * backward. They are the Go loops they replace with exp computed by a
 * vectorisable double-precision exp (lsp_exp: Cody-Waite reduction and a
 * degree-13 Taylor polynomial, within a few ulp of exp in double, so the fp32
 * results they feed agree with Go's math.Exp except in rare last-bit ties)
 * and the cross-entropy row sums in 8 interleaved double partial sums
 * added by a fixed tree. Every lane is independent and no multiply-add is
 * fused, so every SIMD path and any split of rows or elements gives the
 * same bits.
 */
#ifndef LSP_HOST_EWISE_H
#define LSP_HOST_EWISE_H

#include <stddef.h>
#include <stdint.h>

/* lsp_host_xent does rows [lo, hi) of logits z [N, V]: loss = logsumexp(z) -
 * z[target]; when scale != 0, z <- scale * (softmax(z) - onehot(target)).
 * A negative target gives loss 0 (and a zero row when scale != 0).
 * Targets must be < V. Returns 0, or -1 without scratch memory. */
int lsp_host_xent(int path, float *losses, float *z, const int32_t *targets,
	long V, float scale, long lo, long hi);

/* lsp_host_gelu_forward: out = x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3). */
void lsp_host_gelu_forward(int path, float *out, const float *x, size_t n);

/* lsp_host_gelu_backward: dinp = dout * (sig + 0.5 x (1 - th^2) u'(x)), th = 2 sig - 1.
 * dinp may alias dout. */
void lsp_host_gelu_backward(int path, float *dinp, const float *x,
	const float *dout, size_t n);

#endif
