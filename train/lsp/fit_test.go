// Tests of the projector fit on synthetic low-rank-plus-noise gradients.

package lsp

import (
	"fmt"
	"strings"
	"testing"
)

// fitCase is the synthetic problem of the tests: a rank-4 gradient plus
// small noise, m=96, n=80, d=16, r=4, with fresh projectors.
func fitCase(t *testing.T, seed uint64) (P, Q *Projector, G []float32) {
	t.Helper()
	const m, n, d, r = 96, 80, 16, 4
	rng := newRNG(seed)
	G = lowRank(rng, m, n, 4, 0.05)
	return mustProjector(t, m, d, r, rng), mustProjector(t, n, d, r, rng), G
}

// checkStored fails unless the projectors are valid and their bias ratio is
// the reported one.
func checkStored(t *testing.T, P, Q *Projector, G []float32, want float64) {
	t.Helper()
	for _, p := range []*Projector{P, Q} {
		if err := p.Validate(); err != nil {
			t.Fatalf("after fit: %v", err)
		}
	}
	if got := biasRatio(P, Q, G); got != want {
		t.Errorf("stored projectors have ratio %.9g, result says %.9g", got, want)
	}
}

func TestFitLowersAndStopsAtAlpha(t *testing.T) {
	for _, tc := range []struct {
		lr, alpha float64
		long      bool
	}{
		{lr: 0.1, alpha: 0.5},
		{lr: 0.05, alpha: 0.8, long: true},
	} {
		t.Run(fmt.Sprintf("lr%v_alpha%v", tc.lr, tc.alpha), func(t *testing.T) {
			if tc.long && testing.Short() {
				t.Skip("one learning rate under -short")
			}
			P, Q, G := fitCase(t, 1)
			P0, Q0 := P.Clone(), Q.Clone()
			opts := FitOptions{LR: tc.lr, MaxIters: 1000, Seed: 9}
			res, err := Fit(P, Q, G, tc.alpha, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", res)
			if !res.Reached || !res.Resampled || res.RatioAfter > tc.alpha || res.Iters >= opts.MaxIters || res.RatioBefore <= tc.alpha {
				t.Fatalf("result %+v: want the ratio above alpha before, at most %v after, within the budget", res, tc.alpha)
			}
			checkStored(t, P, Q, G, res.RatioAfter)
			// It stopped at the first step within alpha: one step less of
			// the same (seeded) fit ends above alpha.
			opts.MaxIters = res.Iters - 1
			short, err := Fit(P0.Clone(), Q0.Clone(), G, tc.alpha, opts)
			if err != nil {
				t.Fatal(err)
			}
			if short.Reached || short.RatioAfter <= tc.alpha || short.Iters != res.Iters-1 {
				t.Errorf("with %d steps: %+v, want alpha not yet reached", opts.MaxIters, short)
			}
			// Reproducible for a fixed seed.
			opts.MaxIters = 1000
			again, err := Fit(P0, Q0, G, tc.alpha, opts)
			if err != nil || again != res || !P0.Equal(P) || !Q0.Equal(Q) {
				t.Errorf("same seed: %+v, %v, equal projectors %v %v; want %+v", again, err, P0.Equal(P), Q0.Equal(Q), res)
			}
		})
	}
}

// An alpha the budget cannot reach is not an error: the fit returns its
// numbers with Reached false (the caller warns and trains on).
func TestFitUnreachable(t *testing.T) {
	P, Q, G := fitCase(t, 2)
	res, err := Fit(P, Q, G, 0.01, FitOptions{LR: 0.1, MaxIters: 40, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reached || res.Iters != 40 || !res.Resampled || !(res.RatioAfter < res.RatioBefore) || res.RatioAfter <= 0.01 {
		t.Errorf("result %+v: want 40 steps, a lower ratio, alpha not reached", res)
	}
	checkStored(t, P, Q, G, res.RatioAfter)
}

// Projectors already within alpha are left alone; a fresh fit that ends
// worse than the projectors in place leaves those in place.
func TestFitKeepsGoodProjectors(t *testing.T) {
	P, Q, G := fitCase(t, 3)
	first, err := Fit(P, Q, G, 0.5, FitOptions{LR: 0.1, MaxIters: 1000, Seed: 4})
	if err != nil || !first.Reached {
		t.Fatalf("first fit: %+v, %v", first, err)
	}
	P1, Q1 := P.Clone(), Q.Clone()
	for _, tc := range []struct {
		name    string
		alpha   float64
		iters   int
		reached bool
	}{
		{"within alpha", 0.6, 1000, true},
		{"fresh fit worse", 0.3, 0, false},
	} {
		res, err := Fit(P, Q, G, tc.alpha, FitOptions{LR: 0.1, MaxIters: tc.iters, Seed: 5})
		if err != nil {
			t.Fatal(err)
		}
		want := FitResult{RatioBefore: first.RatioAfter, RatioAfter: first.RatioAfter, Reached: tc.reached}
		if res != want || !P.Equal(P1) || !Q.Equal(Q1) {
			t.Errorf("%s: %+v (projectors unchanged: %v %v), want %+v and unchanged", tc.name, res, P.Equal(P1), Q.Equal(Q1), want)
		}
	}
}

// Matrices that read the same input share P: their gradients share a
// column space (G_k = U V_k^T + noise) and are fitted together.
func TestFitShared(t *testing.T) {
	const m, d, r = 96, 16, 4
	rng := newRNG(6)
	U := lowRank(rng, m, 4, 4, 0) // m x 4, the shared input directions
	P := mustProjector(t, m, d, r, rng)
	var Qs []*Projector
	var Gs [][]float32
	for _, n := range []int{80, 48} {
		V := randMat(rng, n, 4)
		G := make([]float32, m*n)
		for i := range m {
			for j := range n {
				var s float32
				for c := range 4 {
					s += U[i*4+c] * V[j*4+c]
				}
				G[i*n+j] = s + 0.05*float32(rng.NormFloat64())
			}
		}
		Qs, Gs = append(Qs, mustProjector(t, n, d, r, rng)), append(Gs, G)
	}
	const alpha = 0.6
	res, err := FitShared(P, Qs, Gs, alpha, FitOptions{LR: 0.1, MaxIters: 1000, Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(Qs) {
		t.Fatalf("%d results for %d matrices", len(res), len(Qs))
	}
	for k, rk := range res {
		t.Logf("matrix %d: %+v", k, rk)
		if !rk.Reached || !rk.Resampled || rk.RatioAfter > alpha || rk.Iters != res[0].Iters || rk.Iters >= 1000 {
			t.Errorf("matrix %d: %+v, want within %v in a shared number of steps", k, rk, alpha)
		}
		checkStored(t, P, Qs[k], Gs[k], rk.RatioAfter)
	}
}

func TestFitErrors(t *testing.T) {
	P, Q, G := fitCase(t, 7)
	Q2 := Q.Clone()
	Q5 := mustProjector(t, Q.M, P.D-1, Q.R, newRNG(3))
	broken := P.Clone()
	broken.Idx[0] = int32(P.D) + 3
	ok := FitOptions{LR: 0.05, MaxIters: 200, Seed: 1}
	for _, tc := range []struct {
		name  string
		P     *Projector
		Qs    []*Projector
		Gs    [][]float32
		alpha float64
		opts  FitOptions
		want  string
	}{
		{"alpha", P, []*Projector{Q}, [][]float32{G}, 1, ok, "--alpha"},
		{"lr", P, []*Projector{Q}, [][]float32{G}, 0.5, FitOptions{LR: 0, MaxIters: 5}, "learning rate"},
		{"iters", P, []*Projector{Q}, [][]float32{G}, 0.5, FitOptions{LR: 0.1, MaxIters: -1}, "MaxIters"},
		{"counts", P, []*Projector{Q, Q2}, [][]float32{G}, 0.5, ok, "2 Q projectors and 1 gradients"},
		{"shared Q", P, []*Projector{Q, Q}, [][]float32{G, G}, 0.5, ok, "share one Q"},
		{"d mismatch", P, []*Projector{Q5}, [][]float32{G}, 0.5, ok, "must share d"},
		{"broken P", broken, []*Projector{Q}, [][]float32{G}, 0.5, ok, "P: lsp projector"},
		{"G length", P, []*Projector{Q}, [][]float32{G[1:]}, 0.5, ok, "G has"},
		{"zero G", P, []*Projector{Q}, [][]float32{make([]float32, len(G))}, 0.5, ok, "||G||^2 = 0"},
		{"P is Q", P, []*Projector{P}, [][]float32{make([]float32, P.M*P.M)}, 0.5, ok, "same projector"},
	} {
		_, err := FitShared(tc.P, tc.Qs, tc.Gs, tc.alpha, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
