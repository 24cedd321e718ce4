// Tests of the sparse compression against dense float64 products.

package lsp

import (
	"fmt"
	"testing"
)

var compressShapes = []struct{ m, n, d, r int }{
	{70, 45, 12, 3}, // ragged
	{64, 64, 16, 4},
	{33, 100, 7, 7}, // r = d: dense rows
	{9, 5, 5, 1},    // d capped to the short side
}

func TestCompressMatchesDense(t *testing.T) {
	for _, sh := range compressShapes {
		t.Run(fmt.Sprintf("%dx%d_d%d_r%d", sh.m, sh.n, sh.d, sh.r), func(t *testing.T) {
			rng := newRNG(uint64(sh.m*1000 + sh.n))
			P := mustProjector(t, sh.m, sh.d, sh.r, rng)
			Q := mustProjector(t, sh.n, sh.d, sh.r, rng)
			G := randMat(rng, sh.m, sh.n)
			S, err := Compress(P, Q, G)
			if err != nil {
				t.Fatal(err)
			}
			if e := maxRelDiff(S, denseS(P, Q, G)); e > 1e-12 {
				t.Errorf("Compress vs dense: max relative difference %.3g", e)
			}
		})
	}
}

// Matrices reading the same input share P; each has its own Q and width n.
// CompressActs with the shared P equals the dense P^T (X^T dY_k) Q_k, and
// equals Compress of the formed gradient.
func TestCompressActsSharedP(t *testing.T) {
	const m, d, r, bt = 70, 12, 3, 29
	rng := newRNG(11)
	P := mustProjector(t, m, d, r, rng)
	X := randMat(rng, bt, m)
	for _, n := range []int{45, 70, 140} {
		Q := mustProjector(t, n, d, r, rng)
		dY := randMat(rng, bt, n)
		G64 := dMul(dT(to64(X), bt, m), to64(dY), m, bt, n)
		G := make([]float32, len(G64))
		for i, v := range G64 {
			G[i] = float32(v)
		}
		SA, err := CompressActs(P, Q, X, dY, bt)
		if err != nil {
			t.Fatal(err)
		}
		// Dense reference from the unrounded G.
		want := dMul(dMul(dT(P.Dense(), m, d), G64, d, m, n), Q.Dense(), d, n, d)
		if e := maxRelDiff(SA, want); e > 1e-12 {
			t.Errorf("n=%d: CompressActs vs dense: %.3g", n, e)
		}
		// Compress of float32(G) differs only by G's rounding.
		SG, err := Compress(P, Q, G)
		if err != nil {
			t.Fatal(err)
		}
		if e := maxRelDiff(SA, SG); e > 1e-5 {
			t.Errorf("n=%d: CompressActs vs Compress(X^T dY): %.3g", n, e)
		}
	}
}

func TestCompressErrors(t *testing.T) {
	rng := newRNG(5)
	P := mustProjector(t, 20, 6, 2, rng)
	Q := mustProjector(t, 10, 6, 2, rng)
	Q5 := mustProjector(t, 10, 5, 2, rng)
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"d mismatch", func() error { _, err := Compress(P, Q5, make([]float32, 200)); return err }},
		{"G length", func() error { _, err := Compress(P, Q, make([]float32, 199)); return err }},
		{"X length", func() error { _, err := CompressActs(P, Q, make([]float32, 59), make([]float32, 30), 3); return err }},
		{"dY length", func() error { _, err := CompressActs(P, Q, make([]float32, 60), make([]float32, 31), 3); return err }},
		{"bt zero", func() error { _, err := ProjectActs(P, nil, 0); return err }},
		{"broken P", func() error {
			bad := P.Clone()
			bad.Idx[0] = 99
			_, err := Compress(bad, Q, make([]float32, 200))
			return err
		}},
	} {
		if tc.fn() == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}
