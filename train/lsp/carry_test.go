// Tests of the moment carry-over and the re-warm rule.

package lsp

import (
	"math"
	"strings"
	"testing"
)

// randMoments is a d x d first moment (any sign) and second moment (>= 0).
func randMoments(d int, seed uint64) (M, V []float32) {
	rng := newRNG(seed)
	M, V = randMat(rng, d, d), randMat(rng, d, d)
	for i := range V {
		V[i] *= V[i]
	}
	return M, V
}

func TestCarryIdentityWhenUnchanged(t *testing.T) {
	rng := newRNG(1)
	P := mustProjector(t, 70, 12, 3, rng)
	Q := mustProjector(t, 45, 12, 3, rng)
	M, V := randMoments(12, 2)
	M[0], V[1] = float32(math.SmallestNonzeroFloat32), math.MaxFloat32 // any bits survive
	M0, V0 := append([]float32(nil), M...), append([]float32(nil), V...)
	for _, tc := range []struct {
		name   string
		pn, qn *Projector
	}{
		{"same pointers", P, Q},
		{"equal clones", P.Clone(), Q.Clone()},
	} {
		c, err := CarryMoments(P, tc.pn, Q, tc.qn, M, V, 1e-3)
		if err != nil {
			t.Fatal(err)
		}
		if !c.Identity || c.Change != 0 {
			t.Errorf("%s: %+v, want Identity", tc.name, c)
		}
		for e := range M {
			if math.Float32bits(M[e]) != math.Float32bits(M0[e]) || math.Float32bits(V[e]) != math.Float32bits(V0[e]) {
				t.Fatalf("%s: moments changed at %d", tc.name, e)
			}
		}
	}
	// One side unchanged: that side's matrix is exactly I.
	Qn := mustProjector(t, 45, 12, 3, rng)
	C, D, err := Transition(P, P.Clone(), Q, Qn, 1e-3)
	if err != nil {
		t.Fatal(err)
	}
	if distIdentity(C, 12) != 0 || distIdentity(D, 12) == 0 {
		t.Errorf("P unchanged, Q redrawn: ||C-I|| = %g (want 0), ||D-I|| = %g (want > 0)", distIdentity(C, 12), distIdentity(D, 12))
	}
}

// C M D and (C o C) V (D o D) against dense float64 with a Gauss-Jordan
// inverse, for redrawn positions and for changed values at fixed positions.
func TestCarryMatchesDense(t *testing.T) {
	const m, n, d, r = 70, 45, 12, 3
	rng := newRNG(3)
	Po, Qo := mustProjector(t, m, d, r, rng), mustProjector(t, n, d, r, rng)
	perturbed := func(p *Projector) *Projector {
		q := p.Clone()
		for k := range q.Val {
			q.Val[k] *= float32(1 + 0.2*rng.NormFloat64())
		}
		if err := q.SyncValues(); err != nil {
			t.Fatal(err)
		}
		return q
	}
	for _, tc := range []struct {
		name      string
		pn, qn    *Projector
		ridge     float64
		minChange float64
	}{
		{"redrawn", mustProjector(t, m, d, r, rng), mustProjector(t, n, d, r, rng), 1e-3, 0.5},
		{"values refitted", perturbed(Po), perturbed(Qo), 1e-2, 0},
		{"no ridge", mustProjector(t, m, d, r, rng), Qo, 0, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			M, V := randMoments(d, 4)
			m64, v64 := to64(M), to64(V)
			inv := func(p *Projector) []float64 {
				a := dMul(transpose(p.dense(), p.M, d), p.dense(), d, p.M, d)
				for i := range d {
					a[i*d+i] += tc.ridge
				}
				return dInverse(t, a, d)
			}
			C := dMul(dMul(transpose(tc.pn.dense(), m, d), Po.dense(), d, m, d), inv(Po), d, d, d)
			D := dMul(inv(Qo), dMul(transpose(Qo.dense(), n, d), tc.qn.dense(), d, n, d), d, d, d)
			if tc.qn == Qo {
				D = identity(d)
			}
			C2, D2 := make([]float64, d*d), make([]float64, d*d)
			for e := range C {
				C2[e], D2[e] = C[e]*C[e], D[e]*D[e]
			}
			wantM := dMul(dMul(C, m64, d, d, d), D, d, d, d)
			wantV := dMul(dMul(C2, v64, d, d, d), D2, d, d, d)

			gotC, gotD, err := Transition(Po, tc.pn, Qo, tc.qn, tc.ridge)
			if err != nil {
				t.Fatal(err)
			}
			if e := max(maxRelDiff(gotC, C), maxRelDiff(gotD, D)); e > 1e-9 {
				t.Errorf("C, D vs dense: %.3g", e)
			}
			c, err := CarryMoments(Po, tc.pn, Qo, tc.qn, M, V, tc.ridge)
			if err != nil {
				t.Fatal(err)
			}
			if c.Identity || c.Change < tc.minChange {
				t.Errorf("carry %+v: want a change of at least %v", c, tc.minChange)
			}
			for e := range M {
				if math.Abs(float64(M[e])-wantM[e]) > 1e-6*maxAbs(wantM) || math.Abs(float64(V[e])-wantV[e]) > 1e-6*maxAbs(wantV) {
					t.Fatalf("entry %d: M %v V %v, dense %v %v", e, M[e], V[e], wantM[e], wantV[e])
				}
				if V[e] < 0 {
					t.Fatalf("V[%d] = %v < 0", e, V[e])
				}
			}
			t.Logf("change %.3f", c.Change)
		})
	}
}

func maxAbs(a []float64) float64 {
	var s float64
	for _, v := range a {
		s = max(s, math.Abs(v))
	}
	return s
}

// Without a ridge, C and D map the compressed gradient of the old subspace
// to the new one exactly when G lies in the old subspace (G = P_old X
// Q_old^T): C S_old D = S_new.
func TestTransitionMapsSubspaceGradients(t *testing.T) {
	const m, n, d, r = 64, 40, 8, 2
	rng := newRNG(5)
	Po, Qo := mustProjector(t, m, d, r, rng), mustProjector(t, n, d, r, rng)
	Pn, Qn := mustProjector(t, m, d, r, rng), mustProjector(t, n, d, r, rng)
	X := to64(randMat(rng, d, d))
	G64 := dMul(dMul(Po.dense(), X, m, d, d), transpose(Qo.dense(), n, d), m, d, n)
	G := make([]float32, len(G64))
	for i, v := range G64 {
		G[i] = float32(v)
	}
	Sold, Snew := denseS(Po, Qo, G), denseS(Pn, Qn, G)
	C, D, err := Transition(Po, Pn, Qo, Qn, 0)
	if err != nil {
		t.Fatal(err)
	}
	if e := maxRelDiff(dMul(dMul(C, Sold, d, d, d), D, d, d, d), Snew); e > 1e-5 { // G rounded to float32
		t.Errorf("C S_old D vs S_new: %.3g", e)
	}
}

func TestCarryErrors(t *testing.T) {
	rng := newRNG(6)
	P, Q := mustProjector(t, 20, 4, 1, rng), mustProjector(t, 10, 4, 1, rng)
	// A column no row uses: P^T P is singular.
	hole := &Projector{M: 4, D: 4, R: 1, Idx: []int32{0, 1, 2, 2}, Val: []float32{1, 1, 1, 1}}
	if err := hole.RebuildColumns(); err != nil {
		t.Fatal(err)
	}
	hole2 := hole.Clone()
	hole2.Val[0] = 2
	if err := hole2.SyncValues(); err != nil {
		t.Fatal(err)
	}
	Qs := mustProjector(t, 4, 4, 1, rng)
	M, V := randMoments(4, 1)
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"singular without ridge", func() error { _, err := CarryMoments(hole, hole2, Qs, Qs, M, V, 0); return err }, "ridge"},
		{"negative ridge", func() error { _, err := CarryMoments(P, P, Q, Q, M, V, -1); return err }, "ridge"},
		{"moment size", func() error { _, err := CarryMoments(P, P, Q, Q, M[:15], V, 0); return err }, "moments"},
		{"shape change", func() error { _, err := CarryMoments(P, Q, Q, Q, M, V, 0); return err }, "must not change"},
	} {
		err := tc.err()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := CarryMoments(hole, hole2, Qs, Qs, M, V, 1e-6); err != nil {
		t.Errorf("singular with a ridge: %v", err)
	}
}

func TestRewarm(t *testing.T) {
	w := Ramp{Steps: 4, Threshold: 0.5}
	for k, want := range []float64{0.2, 0.4, 0.6, 0.8, 1, 1} {
		if got := w.Multiplier(k); math.Abs(got-want) > 1e-15 {
			t.Errorf("Multiplier(%d) = %v, want %v", k, got, want)
		}
	}
	if (Ramp{}).Multiplier(0) != 1 {
		t.Error("Steps 0 must not re-warm")
	}
	for _, tc := range []struct {
		c    Carry
		want bool
	}{
		{Carry{Identity: true}, false},
		{Carry{Change: 0.3}, false},
		{Carry{Change: 0.9}, true},
	} {
		if got := w.Large(tc.c); got != tc.want {
			t.Errorf("Large(%+v) = %v", tc.c, got)
		}
	}
}
