// Tests of the gains, the projected gradient and the capture against
// dense references.

package lsp

import (
	"math"
	"testing"
)

func TestGainsMatchColumnNorms(t *testing.T) {
	const m, d, r = 300, 24, 6
	rng := newRNG(3)
	P := mustProjector(t, m, d, r, rng)
	g := P.Gains()
	Pd := P.dense()
	var mean float64
	for a := range d {
		var n2 float64
		for i := range m {
			n2 += Pd[i*d+a] * Pd[i*d+a]
		}
		// The gain brings the column's squared norm to m/d.
		if got := float64(g[a]) * float64(g[a]) * n2; math.Abs(got-float64(m)/d) > 1e-4*float64(m)/d {
			t.Errorf("column %d: gain^2 ||P[:,a]||^2 = %v, want m/d = %v", a, got, float64(m)/d)
		}
		mean += float64(g[a]) / d
	}
	// A fresh random projector's columns already have about that norm.
	if math.Abs(mean-1) > 0.1 {
		t.Errorf("mean gain of a random projector %v, want about 1", mean)
	}
	// Scaling a column by c divides its gain by c.
	for s, a := range P.Idx {
		if a == 5 {
			P.Val[s] *= 0.25
		}
	}
	if g2 := P.Gains(); math.Abs(float64(g2[5])/float64(g[5])-4) > 1e-5 || g2[4] != g[4] {
		t.Errorf("after scaling column 5 by 1/4: gains %v, %v -> %v, %v; want column 5's x4 and column 4's unchanged", g[4], g[5], g2[4], g2[5])
	}
}

// denseCapture is ||Pi_P G Pi_Q||^2 / ||G||^2 with the projections formed
// densely from Gauss-Jordan inverses.
func denseCapture(t *testing.T, P, Q *Projector, G []float32) float64 {
	m, n, d := P.M, Q.M, P.D
	Pd, Qd := P.dense(), Q.dense()
	proj := func(X []float64, rows int) []float64 {
		inv := dInverse(t, dMul(transpose(X, rows, d), X, d, rows, d), d)
		return dMul(dMul(X, inv, rows, d, d), transpose(X, rows, d), rows, d, rows)
	}
	R := dMul(dMul(proj(Pd, m), to64(G), m, m, n), proj(Qd, n), m, n, n)
	var num, den float64
	for i, g := range G {
		num += R[i] * R[i]
		den += float64(g) * float64(g)
	}
	return num / den
}

func TestCaptureMatchesDense(t *testing.T) {
	const m, n, d, r = 60, 44, 8, 3
	rng := newRNG(11)
	P, Q := mustProjector(t, m, d, r, rng), mustProjector(t, n, d, r, rng)
	for _, tc := range []struct {
		name string
		G    []float32
	}{
		{"noise", randMat(rng, m, n)},
		{"rank 3", lowRank(rng, m, n, 3, 0.01)},
	} {
		got, err := Capture(P, Q, tc.G)
		if err != nil {
			t.Fatal(err)
		}
		want := denseCapture(t, P, Q, tc.G)
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: capture %.12g, dense %.12g", tc.name, got, want)
		}
		S, err := Project(P, Q, tc.G)
		if err != nil {
			t.Fatal(err)
		}
		if e := maxRelDiff(S, denseS(P, Q, tc.G)); e > 1e-12 {
			t.Errorf("%s: Project differs from the dense P^T G Q by %g", tc.name, e)
		}
	}
	// Noise: about d^2/(m n) is captured.
	if got, _ := Capture(P, Q, randMat(rng, m, n)); got < 0.5*d*d/(m*n) || got > 2.0*d*d/(m*n) {
		t.Errorf("capture of noise %v, want about d^2/(m n) = %v", got, float64(d*d)/(m*n))
	}
}

func TestCaptureIgnoresScale(t *testing.T) {
	P, Q, G := fitCase(t, 4)
	before, err := Capture(P, Q, G)
	if err != nil {
		t.Fatal(err)
	}
	ratio := biasRatio(P, Q, G)
	for s := range P.Val {
		P.Val[s] *= 1 + float32(P.Idx[s])/8 // a per-column scale
	}
	if err := P.SyncValues(); err != nil {
		t.Fatal(err)
	}
	after, err := Capture(P, Q, G)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(after-before) > 1e-6*before { // the scaled values are rounded to float32
		t.Errorf("capture %v after a per-column scale of P, %v before", after, before)
	}
	if r := biasRatio(P, Q, G); math.Abs(r-ratio) < 1e-3 {
		t.Errorf("the bias ratio did not move (%v, %v): the scale did not reach the test", ratio, r)
	}
}

func TestCaptureErrors(t *testing.T) {
	P, Q, G := fitCase(t, 5)
	if _, err := Capture(P, Q, make([]float32, len(G))); err == nil {
		t.Error("a zero gradient was accepted")
	}
	if _, err := Capture(P, Q, G[1:]); err == nil {
		t.Error("a gradient of the wrong size was accepted")
	}
}

func TestFitSamples(t *testing.T) {
	P, Q, G1 := fitCase(t, 6)
	_, _, G2 := fitCase(t, 7)
	one := func(Gs ...[]float32) ([]FitResult, *Projector, *Projector) {
		p, q := P.Clone(), Q.Clone()
		var samples [][][]float32
		for _, G := range Gs {
			samples = append(samples, [][]float32{G})
		}
		res, err := FitSamples(p, []*Projector{q}, samples, 0.3, FitOptions{LR: 0.1, MaxIters: 150, Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		return res, p, q
	}
	// One sample is FitShared.
	res1, p1, q1 := one(G1)
	p, q := P.Clone(), Q.Clone()
	res, err := FitShared(p, []*Projector{q}, [][]float32{G1}, 0.3, FitOptions{LR: 0.1, MaxIters: 150, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != res1[0] || !p.Equal(p1) || !q.Equal(q1) {
		t.Errorf("FitSamples with one sample %+v, FitShared %+v", res1[0], res[0])
	}
	// Two samples of different rank-4 subspaces: the reported ratio is the
	// root mean square of the two, and the pair fitted on both serves both
	// better than the pair fitted on the first serves the second.
	res2, p2, q2 := one(G1, G2)
	r1, r2 := biasRatio(p2, q2, G1), biasRatio(p2, q2, G2)
	if want := math.Sqrt((r1*r1 + r2*r2) / 2); math.Abs(res2[0].RatioAfter-want) > 1e-9 {
		t.Errorf("reported ratio %v, root mean square of the samples' %v", res2[0].RatioAfter, want)
	}
	c12, _ := Capture(p2, q2, G2)
	c1, _ := Capture(p1, q1, G2)
	if !(c12 > c1) {
		t.Errorf("capture of the second gradient: %v fitted on both, %v fitted on the first only", c12, c1)
	}
	if _, err := FitSamples(P, []*Projector{Q}, nil, 0.3, FitOptions{LR: 0.1}); err == nil {
		t.Error("no samples accepted")
	}
}
