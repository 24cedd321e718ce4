// Tests of the cache's attention against the attention op: for every
// position, Attend over the stored keys and values equals that position's
// row of the causal AttentionForward over the whole sequence, with
// grouped-query heads, in fp32 and bf16, with the CPU backend's hazard
// check on.

package kvcache

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

func TestAttendMatchesAttentionForward(t *testing.T) {
	for _, tc := range []struct {
		NH, KVH, HS, T int
		dt             backend.DType
		tol            float64
	}{
		{4, 4, 8, 9, backend.F32, 1e-6},
		{6, 2, 5, 13, backend.F32, 1e-6}, // grouped, ragged sizes
		{4, 1, 16, 7, backend.F32, 1e-6}, // multi-query
		{4, 2, 8, 11, backend.BF16, 2e-2},
	} {
		be := cpu.New(cpu.Config{Threads: 1, HazardCheck: true})
		s := be.DefaultStream()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%+v: %v", tc, err)
			}
		}
		NH, KVH, HS, T := tc.NH, tc.KVH, tc.HS, tc.T
		row := (NH + 2*KVH) * HS
		rng := rand.New(rand.NewPCG(uint64(NH), uint64(T)))
		vals := make([]float32, T*row)
		for i := range vals {
			vals[i] = float32(rng.NormFloat64())
		}
		// The whole sequence through the attention op (fused layout).
		qkv, err := be.Alloc("qkv", T*row, tc.dt)
		must(err)
		out, err := be.Alloc("out", T*NH*HS, tc.dt)
		must(err)
		lse, err := be.Alloc("lse", NH*T, backend.F32)
		must(err)
		must(backend.Upload(be, s, qkv, vals))
		must(be.AttentionForward(s, out, lse, qkv, backend.Tensor{}, 1, T, NH, KVH, HS, backend.QKVFused))
		want, err := backend.Download(be, s, out)
		must(err)

		c, err := New(be, Shape{L: 2, NH: NH, KVH: KVH, HS: HS, MaxT: T}, tc.dt)
		must(err)
		got, err := be.Alloc("got", NH*HS, tc.dt)
		must(err)
		for pos := range T {
			r := qkv.Slice(pos*row, row)
			q, k, v := r.Slice(0, NH*HS), r.Slice(NH*HS, KVH*HS), r.Slice((NH+KVH)*HS, KVH*HS)
			// Layer 1 only: layer 0's cache stays empty and unread.
			must(c.Store(s, 1, pos, k, v))
			must(c.Attend(s, 1, pos, q, got))
			g, err := backend.Download(be, s, got)
			must(err)
			var worst float64
			for i, x := range g {
				worst = max(worst, math.Abs(float64(x-want[pos*NH*HS+i])))
			}
			if worst > tc.tol {
				t.Errorf("%+v position %d: Attend differs from the attention op by %.3g", tc, pos, worst)
			}
		}
		if err := c.Attend(s, 1, T, got, got); err == nil {
			t.Errorf("%+v: Attend at position %d of %d: no error", tc, T, T)
		}
		must(be.Synchronize(s))
		if hz := be.Hazards(); len(hz) > 0 {
			t.Errorf("%+v: hazards %v", tc, hz)
		}
		c.Free()
		must(be.Close())
	}
}

func TestNewRefusesShapes(t *testing.T) {
	be := cpu.New(cpu.Config{Threads: 1})
	defer be.Close()
	for _, sh := range []Shape{{L: 1, NH: 4, KVH: 3, HS: 8, MaxT: 4}, {L: 0, NH: 4, KVH: 4, HS: 8, MaxT: 4}, {L: 1, NH: 4, KVH: 4, HS: 8}} {
		if c, err := New(be, sh, backend.F32); err == nil {
			c.Free()
			t.Errorf("New(%+v): no error", sh)
		}
	}
	sh := Shape{L: 2, NH: 4, KVH: 2, HS: 8, MaxT: 16}
	before := be.MemStats().InUse
	c, err := New(be, sh, backend.BF16)
	if err != nil {
		t.Fatal(err)
	}
	if got := be.MemStats().InUse - before; got != Bytes(sh, backend.BF16) {
		t.Errorf("cache takes %d bytes, Bytes says %d", got, Bytes(sh, backend.BF16))
	}
	c.Free()
}
