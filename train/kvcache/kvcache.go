// Package kvcache keeps the keys and values of the positions a model has
// already run, and attends a new position's query over them, so that
// generation runs one token a step instead of the whole sequence again
// (train/gpt2 and train/llama's Decoder).
//
// It is built from the Backend's existing ops, so it runs on every
// backend unchanged: for query head h of position t (key/value head g =
// h/(NH/KVH)),
//
//	s  = q_h K_g[0..t]^T / sqrt(HS)          Gemm 1 x (t+1) x HS
//	p  = softmax(s)                           CrossEntropyForwardBackward
//	o_h = p V_g[0..t]                         Gemm 1 x HS x (t+1)
//
// The softmax is the fused cross-entropy op run with scale 1, which leaves
// softmax(z) - onehot(target) in z: each score row gets one extra column
// of -Inf and the target points at it, so the one-hot lands on a column
// whose probability is exactly 0 and that nothing reads. The loss of that
// row (+Inf) goes to a scratch vector that nothing reads either.
//
// Layout: the cache is head-major, [L][K|V][KVH][MaxT][HS], so one head's
// keys (or values) for positions 0..t are one contiguous [t+1, HS] matrix,
// the operand a Gemm takes. Storing a position costs 2*KVH copies of HS
// elements a layer.
//
// Limits: one sequence (batch 1); 2*NH+KVH*2+2 ops a layer a step (the
// per-head GEMMs are launches of their own, which a batched-GEMM op would
// fold); the scores are stored in the model dtype, so at bf16 the softmax
// reads scores rounded to bf16 and the probabilities are rounded before
// they weight the values, where the fused attention kernel keeps both in
// fp32: at bf16 cached and uncached logits agree to bf16 rounding, not
// bitwise. At fp32 on the CPU backend they agree to float rounding (the
// sums run in another order).
package kvcache

import (
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Shape is the attention shape a cache is for.
type Shape struct {
	L, NH, KVH, HS int // layers, query heads, key/value heads, head size
	MaxT           int // positions
}

// Cache is the key/value cache of one sequence on a backend.
type Cache struct {
	Shape
	be      backend.Backend
	kv      backend.Tensor // [L][2][KVH][MaxT][HS], the model dtype
	scores  backend.Tensor // [NH][MaxT+1]: position t uses NH rows of t+2
	targets backend.Tensor // I32 [MaxT][NH]: row t is NH copies of t+1
	losses  backend.Tensor // F32 [NH], written and never read
}

// New allocates a cache for sh in dtype dt on be and uploads its targets
// (a blocking transfer on the default stream).
func New(be backend.Backend, sh Shape, dt backend.DType) (*Cache, error) {
	switch {
	case sh.L < 1 || sh.NH < 1 || sh.KVH < 1 || sh.HS < 1 || sh.MaxT < 1:
		return nil, fmt.Errorf("kvcache: shape %+v must be positive", sh)
	case sh.NH%sh.KVH != 0:
		return nil, fmt.Errorf("kvcache: %d query heads not a multiple of %d key/value heads", sh.NH, sh.KVH)
	}
	c := &Cache{Shape: sh, be: be}
	var err error
	fail := func(what string, err error) (*Cache, error) {
		c.Free()
		return nil, fmt.Errorf("kvcache: %s: %w", what, err)
	}
	if c.kv, err = be.Alloc("kv cache", sh.L*2*sh.KVH*sh.MaxT*sh.HS, dt); err != nil {
		return fail("keys and values", err)
	}
	if c.scores, err = be.Alloc("kv cache scores", sh.NH*(sh.MaxT+1), dt); err != nil {
		return fail("scores", err)
	}
	if c.targets, err = be.Alloc("kv cache targets", sh.MaxT*sh.NH, backend.I32); err != nil {
		return fail("targets", err)
	}
	if c.losses, err = be.Alloc("kv cache losses", sh.NH, backend.F32); err != nil {
		return fail("losses", err)
	}
	tg := make([]int32, sh.MaxT*sh.NH)
	for i := range tg {
		tg[i] = int32(i/sh.NH + 1)
	}
	if err := backend.UploadInt32(be, be.DefaultStream(), c.targets, tg); err != nil {
		return fail("targets", err)
	}
	return c, nil
}

// Bytes is the device memory a cache of sh in dt takes.
func Bytes(sh Shape, dt backend.DType) int64 {
	return int64(sh.L*2*sh.KVH*sh.MaxT*sh.HS+sh.NH*(sh.MaxT+1))*int64(dt.Size()) + int64(sh.MaxT*sh.NH+sh.NH)*4
}

// Free releases the cache's buffers.
func (c *Cache) Free() {
	for _, t := range []backend.Tensor{c.kv, c.scores, c.targets, c.losses} {
		if t.Buf != nil {
			c.be.Free(t)
		}
	}
	c.kv, c.scores, c.targets, c.losses = backend.Tensor{}, backend.Tensor{}, backend.Tensor{}, backend.Tensor{}
}

// head is the [MaxT, HS] keys (kind 0) or values (kind 1) of key/value
// head g of layer l.
func (c *Cache) head(l, kind, g int) backend.Tensor {
	n := c.MaxT * c.HS
	return c.kv.Slice(((l*2+kind)*c.KVH+g)*n, n, c.MaxT, c.HS)
}

func (c *Cache) check(op string, l, t int) error {
	if l < 0 || l >= c.L || t < 0 || t >= c.MaxT {
		return fmt.Errorf("kvcache %s: layer %d, position %d outside %d layers of %d positions", op, l, t, c.L, c.MaxT)
	}
	return nil
}

// Store enqueues the copy of position t's keys and values of layer l, k
// and v [KVH*HS] each, into the cache.
func (c *Cache) Store(s backend.Stream, l, t int, k, v backend.Tensor) error {
	if err := c.check("store", l, t); err != nil {
		return err
	}
	for kind, src := range []backend.Tensor{k, v} {
		for g := range c.KVH {
			if err := c.be.CopyD2D(s, c.head(l, kind, g).Slice(t*c.HS, c.HS), src.Slice(g*c.HS, c.HS)); err != nil {
				return fmt.Errorf("kvcache store, layer %d: %w", l, err)
			}
		}
	}
	return nil
}

// Attend enqueues causal attention for position t of layer l: q [NH*HS]
// (after any rotary embedding) over the cached keys and values of
// positions 0..t (Store them first), into out [NH*HS].
func (c *Cache) Attend(s backend.Stream, l, t int, q, out backend.Tensor) error {
	if err := c.check("attend", l, t); err != nil {
		return err
	}
	be, HS, W := c.be, c.HS, t+2
	scale := float32(1 / math.Sqrt(float64(HS))) // as the attention op's
	per := c.NH / c.KVH
	rows := c.scores.Slice(0, c.NH*W, c.NH, W)
	err := be.Fill(s, rows, float32(math.Inf(-1)))
	for h := 0; h < c.NH && err == nil; h++ {
		keys := c.head(l, 0, h/per).Slice(0, (t+1)*HS, t+1, HS)
		err = be.Gemm(s, false, true, 1, t+1, HS, scale, q.Slice(h*HS, HS, 1, HS), keys, 0, c.scores.Slice(h*W, t+1, 1, t+1))
	}
	if err == nil {
		err = be.CrossEntropyForwardBackward(s, c.losses, rows, c.targets.Slice(t*c.NH, c.NH), c.NH, W, 1)
	}
	for h := 0; h < c.NH && err == nil; h++ {
		vals := c.head(l, 1, h/per).Slice(0, (t+1)*HS, t+1, HS)
		err = be.Gemm(s, false, false, 1, HS, t+1, 1, c.scores.Slice(h*W, t+1, 1, t+1), vals, 0, out.Slice(h*HS, HS, 1, HS))
	}
	if err != nil {
		return fmt.Errorf("kvcache attend, layer %d: %w", l, err)
	}
	return nil
}
