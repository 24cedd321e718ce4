package engine

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// shardRank claims to be rank of size; its all-gather keeps only its own
// shard (the others' stay as they were), which is all New, Init and
// GatherState need to allocate what a real rank does.
type shardRank struct {
	*comm.Single
	size, rank int
}

func (s shardRank) Size() int { return s.size }
func (s shardRank) Rank() int { return s.rank }
func (s shardRank) AllGather(x, shard []float32) error {
	lo, _ := comm.Shard(len(x), s.size, s.rank)
	copy(x[lo:], shard)
	return nil
}

// TestPlanMatchesShardedHost: zero mode with several ranks holds, per
// rank, the whole pinned gradients and weights and its shard of the summed
// gradients, moments and (bf16) master: MemoryOf's part says so to the
// byte, for every rank of 2 and 3, and less than one process's; the
// checkpoint write adds rank 0's gathered state (less the moment it
// gathers into the pinned gradients).
func TestPlanMatchesShardedHost(t *testing.T) {
	for _, dt := range []backend.DType{backend.F32, backend.BF16} {
		one, err := MemoryOf(small, testB, testT, 1, dt, testConfig(Zero))
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{2, 3} {
			total := 0
			for rank := 0; rank < size; rank++ {
				cfg := testConfig(Zero)
				cfg.Comm = shardRank{comm.NewSingle(), size, rank}
				plan, err := MemoryOf(small, testB, testT, 1, dt, cfg)
				if err != nil {
					t.Fatal(err)
				}
				be := cpu.New(cpu.Config{Threads: 1})
				e, err := New(be, small, testB, testT, 1, dt, cfg)
				if err != nil {
					t.Fatal(err)
				}
				o := e.off
				if o == nil || o.shard == nil {
					t.Fatalf("%v, rank %d of %d: no sharded host optimizer", dt, rank, size)
				}
				sh := o.shard
				got := int64(len(o.grads.Bytes()) + len(o.out.Bytes()) + 4*(len(sh.grads)+len(sh.master)+len(sh.mom)))
				want, whole := part(plan.Host, "master, moments, pinned grads and weights"), part(one.Host, "master, moments, pinned grads and weights")
				if got != want || want >= whole {
					t.Errorf("%v, rank %d of %d: allocated %d bytes of host optimizer, planned %d (one process %d)", dt, rank, size, got, want, whole)
				}
				total += sh.n
				release, err := e.GatherState()
				if err != nil {
					t.Fatal(err)
				}
				// Rank 0's new arrays: the whole state less what lies in
				// the pinned gradients; the other ranks allocate nothing.
				var gathered int64
				if rank == 0 {
					pinned := o.grads.Float32()
					for name, v := range sh.gathered {
						if len(v) != o.n {
							t.Errorf("%v, rank 0 of %d: gathered %s has %d elements, want %d", dt, size, name, len(v), o.n)
						}
						if &v[0] != &pinned[0] {
							gathered += 4 * int64(len(v))
						}
					}
				}
				release()
				ckpt := part(plan.Transient, "checkpoint write")
				if base := 4*int64(small.NumParams()) + savedHostState(len(e.idx.Layout)); ckpt != base+gathered {
					t.Errorf("%v, rank %d of %d: planned checkpoint write %d bytes, the parameters, steps and gathered state hold %d", dt, rank, size, ckpt, base+gathered)
				}
				e.Free()
				be.Close()
			}
			if total != small.NumParams() {
				t.Errorf("%v, %d ranks: the shards hold %d elements, the model %d", dt, size, total, small.NumParams())
			}
		}
	}
}

func part(ps []Part, name string) int64 {
	for _, p := range ps {
		if p.Name == name {
			return p.Bytes
		}
	}
	return -1
}
