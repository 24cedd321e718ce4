// attention.go: the CPU backend's causal attention (train/cpu) on the SIMD
// paths: attention.h states the arithmetic and why it is the same bits on
// every path and for any split of the heads.

package host

/*
#include "attention.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// AttentionShape is one attention op's shape: NH query heads in groups of
// NH/KVH sharing a key/value head, HS channels each. q of (b, t, h) starts
// at QBase + (b*T+t)*QRow + h*HS of qkv, k and v of (b, t, g) at KBase or
// VBase + (b*T+t)*KVRow + g*HS; out and dout are [B, T, NH, HS], lse
// [B, NH, T]. Pos, nil or [B, T], is each token's position within its
// document when a row packs several (backend.Positions): query t attends
// keys t-Pos[b*T+t]..t instead of 0..t.
type AttentionShape struct {
	B, T, NH, KVH, HS   int
	QBase, KBase, VBase int
	QRow, KVRow         int
	Pos                 []int32
}

// check validates the shape and the lengths of qkv, out and lse.
func (a AttentionShape) check(qkv, out, lse int) error {
	if a.B < 0 || a.T < 0 || a.NH <= 0 || a.KVH <= 0 || a.HS <= 0 || a.NH%a.KVH != 0 {
		return fmt.Errorf("bad shape %+v", a)
	}
	if a.B == 0 || a.T == 0 {
		return nil
	}
	last := (a.B*a.T - 1)
	need := max(a.QBase+last*a.QRow+a.NH*a.HS, a.KBase+last*a.KVRow+a.KVH*a.HS, a.VBase+last*a.KVRow+a.KVH*a.HS)
	if qkv < need || out < a.B*a.T*a.NH*a.HS || lse < a.B*a.NH*a.T {
		return fmt.Errorf("lengths qkv %d, out %d, lse %d, want at least %d, %d, %d", qkv, out, lse, need, a.B*a.T*a.NH*a.HS, a.B*a.NH*a.T)
	}
	if a.Pos != nil {
		// The C loops index keys t-pos..t: a position outside [0, t]
		// would read outside the sequence.
		if len(a.Pos) < a.B*a.T {
			return fmt.Errorf("positions %d, want %d", len(a.Pos), a.B*a.T)
		}
		for i, p := range a.Pos[:a.B*a.T] {
			if p < 0 || int(p) > i%a.T {
				return fmt.Errorf("position %d of token %d of row %d outside [0, %d]", p, i%a.T, i/a.T, i%a.T)
			}
		}
	}
	return nil
}

func (a AttentionShape) c() C.lsp_attn_shape {
	return C.lsp_attn_shape{B: C.long(a.B), T: C.long(a.T), NH: C.long(a.NH), KVH: C.long(a.KVH), HS: C.long(a.HS),
		qbase: C.long(a.QBase), kbase: C.long(a.KBase), vbase: C.long(a.VBase), qrow: C.long(a.QRow), kvrow: C.long(a.KVRow)}
}

var errAttnMemory = errors.New("no memory for the transposed keys")

func ptr(x []float32) *C.float { return (*C.float)(unsafe.Pointer(unsafe.SliceData(x))) }

// iptr is nil for a nil slice: C reads NULL as "no positions".
func iptr(x []int32) *C.int {
	if x == nil {
		return nil
	}
	return (*C.int)(unsafe.Pointer(unsafe.SliceData(x)))
}

// AttentionForward does query heads b*NH+h in [lo, hi) on the calling
// goroutine: for each query t, softmax over keys 0..t of q.k/sqrt(HS),
// out = P V, lse = log sum exp.
func AttentionForward(out, lse, qkv []float32, a AttentionShape, lo, hi int) error {
	if err := a.check(len(qkv), len(out), len(lse)); err != nil {
		return fmt.Errorf("host: attention forward: %w", err)
	}
	if lo < 0 || hi > a.B*a.NH {
		return fmt.Errorf("host: attention forward: heads [%d, %d) outside [0, %d)", lo, hi, a.B*a.NH)
	}
	if lo >= hi {
		return nil
	}
	sh := a.c()
	if C.lsp_host_attn_forward(C.int(ActiveSIMD()), &sh, ptr(out), ptr(lse), ptr(qkv), iptr(a.Pos), C.long(lo), C.long(hi)) != 0 {
		return fmt.Errorf("host: attention forward: %w", errAttnMemory)
	}
	return nil
}

// AttentionBackward does key/value heads b*KVH+g in [lo, hi) and their
// query heads on the calling goroutine, overwriting their parts of dqkv:
// dV = P^T dO, dP = dO V^T, dS = P o (dP - D) with D = rowsum(dO o O),
// dQ = dS K scale, dK = dS^T Q scale, P = exp(S - lse).
func AttentionBackward(dqkv, dout, qkv, out, lse []float32, a AttentionShape, lo, hi int) error {
	if err := a.check(len(qkv), len(out), len(lse)); err != nil {
		return fmt.Errorf("host: attention backward: %w", err)
	}
	if len(dqkv) < len(qkv) || len(dout) < len(out) {
		return fmt.Errorf("host: attention backward: dqkv %d, dout %d shorter than qkv %d, out %d", len(dqkv), len(dout), len(qkv), len(out))
	}
	if lo < 0 || hi > a.B*a.KVH {
		return fmt.Errorf("host: attention backward: heads [%d, %d) outside [0, %d)", lo, hi, a.B*a.KVH)
	}
	if lo >= hi {
		return nil
	}
	sh := a.c()
	if C.lsp_host_attn_backward(C.int(ActiveSIMD()), &sh, ptr(dqkv), ptr(dout), ptr(qkv), ptr(out), ptr(lse), iptr(a.Pos), C.long(lo), C.long(hi)) != 0 {
		return fmt.Errorf("host: attention backward: %w", errAttnMemory)
	}
	return nil
}
