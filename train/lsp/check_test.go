package lsp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// TestRewarmMeasured checks the measured re-warm rule on one matrix (a
// GPT-2 block's 32 x 32 attention projection at d 8, r 2, three steps
// into training): a carried second moment far below the new subspace's
// calls for it, one far above does not.
func TestRewarmMeasured(t *testing.T) {
	const m, n, d, r = 32, 32, 8, 2
	rng := rand.New(rand.NewPCG(5, 5))
	P, Q := mustProjector(t, m, d, r, rng), mustProjector(t, n, d, r, rng)
	x := &Matrix{Name: "attn.c_proj", M: m, N: n, D: d, R: r, In: &Input{M: m, D: d, R: r, P: P}, Q: Q,
		Adam: host.NewAdamState(d * d)}
	x.Adam.Step = 3 // the bias correction 1 - beta2^3 is far from 1
	st := &State{env: Env{Hyper: optim.DefaultHyper()}}
	G := make([]float32, x.M*x.N)
	for i := range G {
		G[i] = float32(rng.NormFloat64())
	}
	cs := calibSet{fit: [][][]float32{{G}}, fitW: []float64{1}}
	for _, tc := range []struct {
		v    float32
		want bool
	}{{0, true}, {1e6, false}} {
		for e := range x.Adam.V {
			x.Adam.V[e] = tc.v
		}
		got, err := st.underestimated(x, cs, 0)
		if err != nil || got != tc.want {
			t.Errorf("V = %g: underestimated %v (%v), want %v", tc.v, got, err, tc.want)
		}
	}
}

// TestGradSum: a group's gradient is the target-weighted mean of its
// micro-batches' (each the mean over its own targets), i.e. the mean over
// all their targets.
func TestGradSum(t *testing.T) {
	var s gradSum
	s.add(0, 2, []float32{1, 2}, 3)
	s.add(1, 2, []float32{5}, 3)
	s.add(0, 2, []float32{5, 6}, 1)
	s.add(1, 2, []float32{1}, 1)
	if got := s.mean(0); !slices.Equal(got, []float32{2, 3}) || s.w != 4 {
		t.Errorf("matrix 0: mean %v over weight %v, want [2 3] over 4", got, s.w)
	}
	if got := s.mean(1); !slices.Equal(got, []float32{4}) {
		t.Errorf("matrix 1: mean %v, want [4]", got)
	}
}
