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
// byte, for every rank of 2 and 3, and less than one process's; a
// checkpoint write gathers every sharded array into the pinned gradients,
// group by group, adding nothing.
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
				// A checkpoint write reads every array whole, every
				// rank gathering the sharded ones into its pinned
				// gradients: nothing is allocated beyond the plan's
				// step counts, and each array is the whole of it.
				arrays, finish, err := e.StateArrays()
				if err != nil {
					t.Fatal(err)
				}
				pinned := o.grads.Float32()
				for _, a := range arrays {
					if !a.collective {
						continue
					}
					got := 0
					if err := a.Read(func(v []float32) error {
						if &v[0] != &pinned[got] {
							t.Errorf("%v, rank %d of %d: %s's chunk at %d is not gathered into the pinned gradients", dt, rank, size, a.Name, got)
						}
						got += len(v)
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					if got != o.n || a.Len != o.n {
						t.Errorf("%v, rank %d of %d: %s read %d elements of %d, want %d", dt, rank, size, a.Name, got, a.Len, o.n)
					}
				}
				if err := finish(); err != nil {
					t.Fatal(err)
				}
				if w := plan.StateWrite; w != savedHostState(len(e.idx.Layout)) {
					t.Errorf("%v, rank %d of %d: planned state write %d bytes, want the step counts' %d", dt, rank, size, w, savedHostState(len(e.idx.Layout)))
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
