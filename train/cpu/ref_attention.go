// CPU reference for the causal attention of kernels/attention.cu, with the
// launchers' names and argument order (lsp_attention_forward/backward; the
// backward's scratch is the kernel's own): grouped-query heads, NH query
// heads in groups of NH/KVH sharing a key/value head, HS channels each,
// scale 1/sqrt(HS) rounded to fp32.
//
// Shapes (llm.c names, C = NH*HS): qkv holds q (NH*HS), k and v (KVH*HS
// each) of the B*T positions as layout says (backend.QKVLayout: fused, one
// [q | k | v] row per position, [B,T,(NH+2*KVH)*HS]; or planar, all q
// [B,T,NH*HS], then all k, then all v); out, dout [B,T,C]; lse [B,NH,T],
// the natural log-sum-exp of each scaled score row, saved by the forward
// so that the backward recomputes P; dqkv in qkv's layout, written, not
// accumulated. pos, nil or [B,T] (backend.Positions), restricts query t to
// keys t-pos[b,t]..t, its document's in a packed row; the sums then run
// over those keys in the same order, so a packed document gets the bits
// of the same document run alone.
//
// The loops are C, package host's (host/attention.c, host.AttentionForward
// and AttentionBackward), for speed: the C is laid out so that the compiler
// vectorises it (keys and values transposed per head, scores for 4 queries
// by 16 keys in registers). It sums every element in one fixed order (channels ascending in a dot
// product, keys ascending, then query heads and queries ascending for the
// key/value gradients) without fused multiply-adds, so the result is the
// same bits on every SIMD path and for any split of the heads over threads
// (the op splits them; the functions here do all of them on the calling
// goroutine). host/attention.h states the arithmetic.
//
// Limits: fp32 over plain slices (callers holding bf16 widen before and
// round after, as the kernels do at load and store); any HS (the kernel
// takes HS <= 256); exp and log are C's, in double and rounded to fp32,
// which may differ from Go's math.Exp and math.Log in the last bit.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// attention is the shape of one attention op: NH query heads in groups of
// NH/KVH sharing a key/value head, HS each, q, k and v found by x.
type attention struct {
	B, T, NH, KVH, HS int
	x                 backend.QKVIndex
	pos               []int32 // nil: unpacked rows
}

// host is a as package host's kernels take it.
func (a attention) host() host.AttentionShape {
	return host.AttentionShape{B: a.B, T: a.T, NH: a.NH, KVH: a.KVH, HS: a.HS,
		QBase: a.x.QBase, KBase: a.x.KBase, VBase: a.x.VBase, QRow: a.x.QRow, KVRow: a.x.KVRow, Pos: a.pos}
}

// checkHeads checks an attention op's shape and returns it with q, k and
// v located in a qkv tensor of layout, and qkv's length.
func checkHeads(op string, B, T, NH, KVH, HS int, layout backend.QKVLayout) (attention, int, error) {
	if err := checkDims(op, "B T NH KVH HS", B, T, NH, KVH, HS); err != nil {
		return attention{}, 0, err
	}
	if NH <= 0 || KVH <= 0 || NH%KVH != 0 {
		return attention{}, 0, fmt.Errorf("cpu: %s: NH=%d query heads not a positive multiple of KVH=%d key/value heads", op, NH, KVH)
	}
	if layout != backend.QKVFused && layout != backend.QKVPlanar {
		return attention{}, 0, fmt.Errorf("cpu: %s: unknown qkv layout %v", op, layout)
	}
	a := attention{B: B, T: T, NH: NH, KVH: KVH, HS: HS, x: layout.Index(B*T, NH, KVH, HS)}
	return a, B * T * (NH + 2*KVH) * HS, nil
}

// AttentionForward writes out = softmax(q k^T * scale, causal) v per query
// head and lse for every (b, h, t).
func AttentionForward(out, lse, qkv []float32, pos []int32, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	a, _, err := checkHeads("attention forward", B, T, NH, KVH, HS, layout)
	if err != nil {
		return err
	}
	if a.pos, err = checkPositions("attention forward", pos, B, T); err != nil {
		return err
	}
	return host.AttentionForward(out, lse, qkv, a.host(), 0, B*NH)
}

// AttentionBackward writes dqkv from dout and the forward's qkv, out and
// lse: dV = P^T dO, dP = dO V^T, dS = P o (dP - D) with D = rowsum(dO o O),
// dQ = dS K scale, dK = dS^T Q scale, a key/value head's gradient summing
// its query heads in ascending order.
func AttentionBackward(dqkv, dout, qkv, out, lse []float32, pos []int32, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	a, _, err := checkHeads("attention backward", B, T, NH, KVH, HS, layout)
	if err != nil {
		return err
	}
	if a.pos, err = checkPositions("attention backward", pos, B, T); err != nil {
		return err
	}
	return host.AttentionBackward(dqkv, dout, qkv, out, lse, a.host(), 0, B*KVH)
}

// checkPositions returns pos after checking that it is nil or a valid
// packing of B rows of T tokens (backend.CheckPositions).
func checkPositions(op string, pos []int32, B, T int) ([]int32, error) {
	if pos == nil {
		return nil, nil
	}
	if err := backend.CheckPositions(pos, B, T); err != nil {
		return nil, fmt.Errorf("cpu: %s: %w", op, err)
	}
	return pos[:B*T], nil
}
