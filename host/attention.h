/*
 * attention.h: the CPU backend's causal attention (train/cpu) in C, laid
 * out so the compiler vectorises it: keys and values are transposed per
 * head, so scores are computed for 4 queries by 16 keys at a time in
 * registers (each key vector loaded once for 4 queries), and every other
 * accumulation is a loop over the head's channels; the backward pass keeps
 * a head's dK and dV contiguous until it is done. Each element is summed in the same
 * order as the Go loops these replace (channels ascending for a dot
 * product, keys ascending, then query heads and queries ascending for the
 * key/value gradients), with no fused multiply-add, so the results differ
 * from them only by exp and log (C's against Go's, both in double, rounded
 * to fp32), and are the same bits on every SIMD path and for any split of
 * the heads.
 */
#ifndef LSP_HOST_ATTENTION_H
#define LSP_HOST_ATTENTION_H

#include <stddef.h>

/* The shape of one attention op: NH query heads in groups of NH/KVH
 * sharing a key/value head, HS channels each; q of (b, t, h) starts at
 * qbase + (b*T+t)*qrow + h*HS, k and v of (b, t, g) at kbase or vbase +
 * (b*T+t)*kvrow + g*HS; out and dout are [B, T, NH, HS]; lse is
 * [B, NH, T]. */
typedef struct {
	long B, T, NH, KVH, HS;
	long qbase, kbase, vbase, qrow, kvrow;
} lsp_attn_shape;

/* pos, [B, T] or NULL, is each token's position within its document when
 * a row packs several: query t then attends keys t - pos[b*T+t] .. t, and
 * every sum runs over those keys only, in the same order, so a packed
 * document's results are the bits of the document run alone. NULL is
 * keys 0..t. */

/* lsp_host_attn_forward does query heads b*NH+h in [lo, hi): for each query t,
 * softmax over keys 0..t (or its document's) of q.k/sqrt(HS), out = P V,
 * lse = log sum exp. Returns 0, or -1 when scratch memory cannot be had. */
int lsp_host_attn_forward(int path, const lsp_attn_shape *a, float *out, float *lse,
	const float *qkv, const int *pos, long lo, long hi);

/* lsp_host_attn_backward does key/value heads b*KVH+g in [lo, hi) and their
 * query heads: dV = P^T dO, dP = dO V^T, dS = P o (dP - D) with D =
 * rowsum(dO o O), dQ = dS K scale, dK = dS^T Q scale, P recomputed from
 * lse. It overwrites those heads' parts of dqkv. Returns 0 or -1. */
int lsp_host_attn_backward(int path, const lsp_attn_shape *a, float *dqkv,
	const float *dout, const float *qkv, const float *out, const float *lse,
	const int *pos, long lo, long hi);

#endif
