package train

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/comm"
)

// fakeRank is one rank of two that logs the calls rank0Only makes.
type fakeRank struct {
	*comm.Single
	rank int
	log  []string
}

func (f *fakeRank) Rank() int                    { return f.rank }
func (f *fakeRank) Size() int                    { return 2 }
func (f *fakeRank) SetTimeout(d time.Duration)   { f.log = append(f.log, "timeout "+d.String()) }
func (f *fakeRank) Barrier() error               { f.log = append(f.log, "barrier"); return nil }
func (f *fakeRank) AllReduceSum([]float32) error { return errors.New("unexpected") }

// TestRank0Only: rank 0 writes while the other ranks join its write
// (rank0Writes: the gathers of what it writes) or do nothing
// (rank0Only), all under Rank0Wait, then every rank waits at a barrier
// and gets its usual timeout back; a failed write (or join) is that
// rank's error after the barrier.
func TestRank0Only(t *testing.T) {
	for _, rank := range []int{0, 1} {
		for _, join := range []bool{false, true} {
			for _, fail := range []bool{false, true} {
				f := &fakeRank{Single: comm.NewSingle(), rank: rank}
				r := &world{comm: f, timeout: 45 * time.Second}
				step := func(name string) func() error {
					return func() error {
						f.log = append(f.log, name)
						if fail {
							return errors.New("disk full")
						}
						return nil
					}
				}
				var err error
				if join {
					err = r.rank0Writes(step("write"), step("join"))
				} else {
					err = r.rank0Only(step("write"))
				}
				part := ""
				switch {
				case rank == 0:
					part = "write,"
				case join:
					part = "join,"
				}
				want := fmt.Sprintf("timeout %v,%sbarrier,timeout 45s", Rank0Wait, part)
				if got := strings.Join(f.log, ","); got != want {
					t.Errorf("rank %d, join %v: calls %s, want %s", rank, join, got, want)
				}
				if wantErr := fail && part != ""; (err != nil) != wantErr {
					t.Errorf("rank %d, join %v, write fails %v: error %v", rank, join, fail, err)
				}
			}
		}
	}
}

// TestResumeRanks: a checkpoint records a data-parallel run's world size
// (nothing for one process) and a resume with another is refused.
func TestResumeRanks(t *testing.T) {
	for _, saved := range []int{1, 2} {
		st := checkpoint.State{Settings: map[string]string{}}
		saveRanks(&st, saved)
		if _, ok := st.Settings[ranksSetting]; ok != (saved > 1) {
			t.Errorf("%d ranks: settings %v", saved, st.Settings)
		}
		for _, now := range []int{1, 2, 3} {
			err := checkResumeRanks(st, now, "ck")
			if (err == nil) != (now == saved) {
				t.Errorf("saved by %d ranks, resumed by %d: %v", saved, now, err)
			}
			if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("resume with %s", map[int]string{1: "one process", 2: "2 ranks (mpirun -np 2)"}[saved])) {
				t.Errorf("saved by %d ranks, resumed by %d: %v does not say how to resume", saved, now, err)
			}
		}
	}
}
