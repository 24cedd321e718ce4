// Tests of the bias ratio and its analytic gradient.

package lsp

import (
	"fmt"
	"math"
	"testing"
)

// biasRatio is BiasRatio for arguments the test knows are valid.
func biasRatio(P, Q *Projector, G []float32) float64 {
	r, err := BiasRatio(P, Q, G)
	if err != nil {
		panic(err)
	}
	return r
}

// expectedRandomRatio is the root of E[ratio^2] for freshly drawn
// projectors (NewProjector) of an m x n matrix, whatever G is (the
// expectation of ||R||^2 over independent P and Q over E<R,G> = ||G||^2):
//
//	E[ratio^2] = (1 + 2/r + (m-1)/d) (1 + 2/r + (n-1)/d) - 1
//
// since E[(P P^T)^2] = (1 + 2/r + (m-1)/d) I for N(0,1/r) values (the
// diagonal of P P^T has variance 2/r, each off-diagonal entry 1/d). It
// approaches its large-m/d limit sqrt(mn/d^2 - 1) (docs/DESIGN.md,
// "Learning the projectors") only for large m/d and n/d;
// sparse rows (small r) start higher. TestRandomStartRatio checks it by
// simulation.
func expectedRandomRatio(m, n, d, r int) float64 {
	fm := 1 + 2/float64(r) + float64(m-1)/float64(d)
	fn := 1 + 2/float64(r) + float64(n-1)/float64(d)
	return math.Sqrt(fm*fn - 1)
}

func TestBiasRatioMatchesDense(t *testing.T) {
	for _, sh := range compressShapes {
		for _, kind := range []string{"random", "rank-3"} {
			t.Run(fmt.Sprintf("%s_%dx%d_d%d_r%d", kind, sh.m, sh.n, sh.d, sh.r), func(t *testing.T) {
				rng := newRNG(uint64(sh.m + 7*sh.n))
				P := mustProjector(t, sh.m, sh.d, sh.r, rng)
				Q := mustProjector(t, sh.n, sh.d, sh.r, rng)
				G := randMat(rng, sh.m, sh.n)
				if kind != "random" {
					G = lowRank(rng, sh.m, sh.n, 3, 0.01)
				}
				got := biasRatio(P, Q, G)
				want := denseRatio(P, Q, G)
				if math.Abs(got-want) > 1e-10*max(want, 1) {
					t.Errorf("bias ratio = %.15g, dense %.15g", got, want)
				}
			})
		}
	}
	// A perfect projector: d = m = n with P = Q = I gives ratio 0, and the
	// formula's cancellation stays at rounding level.
	I := &Projector{M: 6, D: 6, R: 1, Idx: []int32{0, 1, 2, 3, 4, 5}, Val: []float32{1, 1, 1, 1, 1, 1}}
	if err := I.RebuildColumns(); err != nil {
		t.Fatal(err)
	}
	if r := biasRatio(I, I, randMat(newRNG(1), 6, 6)); r > 1e-7 {
		t.Errorf("identity projectors: ratio %v; want 0", r)
	}
}

// Fresh projectors start at expectedRandomRatio on average, for any G: the
// mean of ratio^2 over draws lies within 4 standard errors (from the
// sample's spread) of the formula, and that bound is under 20% of it.
// The large-m/d limit sqrt(mn/d^2 - 1) is logged for
// comparison: its square is 23-47% lower on the first three shapes, so
// this test tells the two apart.
func TestRandomStartRatio(t *testing.T) {
	draws := 300
	shapes := []struct{ m, n, d, r int }{{64, 64, 16, 4}, {96, 80, 16, 4}, {128, 96, 8, 2}, {256, 200, 16, 16}}
	if testing.Short() {
		draws, shapes = 150, shapes[:3]
	}
	for _, sh := range shapes {
		rng := newRNG(uint64(sh.m * sh.n))
		G := randMat(rng, sh.m, sh.n)
		var sum, sum2 float64
		for range draws {
			r := biasRatio(mustProjector(t, sh.m, sh.d, sh.r, rng), mustProjector(t, sh.n, sh.d, sh.r, rng), G)
			sum += r * r
			sum2 += r * r * r * r
		}
		mean := sum / float64(draws)
		se := math.Sqrt((sum2/float64(draws) - mean*mean) / float64(draws))
		got := math.Sqrt(sum / float64(draws))
		want := expectedRandomRatio(sh.m, sh.n, sh.d, sh.r)
		design := math.Sqrt(float64(sh.m*sh.n)/float64(sh.d*sh.d) - 1)
		t.Logf("%v: rms ratio %.3f (standard error of ratio^2 %.2f%%), expected %.3f, sqrt(mn/d^2-1) = %.3f",
			sh, got, 100*se/mean, want, design)
		if math.Abs(mean-want*want) > 4*se || 4*se > 0.2*want*want {
			t.Errorf("%v: mean ratio^2 %.3f +- %.3f, want %.3f within 4 standard errors, under 20%%", sh, mean, se, want*want)
		}
	}
}

// The analytic gradient of the objective (sum of ratio^2 over matrices
// sharing P) against central finite differences in float64, on every
// value of P and of two Qs.
func TestGradientFiniteDifferences(t *testing.T) {
	const m, d, r = 30, 6, 2
	rng := newRNG(21)
	p := mustProjector(t, m, d, r, rng).view()
	var qs []sparse
	var Gs [][]float32
	var g2s []float64
	for _, n := range []int{20, 37} {
		qs = append(qs, mustProjector(t, n, d, r, rng).view())
		G := lowRank(rng, m, n, 2, 0.3)
		Gs, g2s = append(Gs, G), append(g2s, sqNorm32(G))
	}
	ev := evaluate(Gs, g2s, p, qs, true)
	const h = 1e-5
	check := func(name string, vals []float64, grad []float64) {
		for s := range vals {
			v := vals[s]
			vals[s] = v + h
			fp := evaluate(Gs, g2s, p, qs, false).obj
			vals[s] = v - h
			fm := evaluate(Gs, g2s, p, qs, false).obj
			vals[s] = v
			fd := (fp - fm) / (2 * h)
			if math.Abs(fd-grad[s]) > 1e-6*max(1, math.Abs(fd)) {
				t.Errorf("%s value %d: analytic %.9g, finite difference %.9g", name, s, grad[s], fd)
			}
		}
	}
	check("P", p.val, ev.gp)
	for k := range qs {
		check(fmt.Sprintf("Q%d", k), qs[k].val, ev.gqs[k])
	}
	// The gradient is not trivially small: the check above has teeth.
	var norm float64
	for _, g := range ev.gp {
		norm = max(norm, math.Abs(g))
	}
	if norm < 1e-3 {
		t.Errorf("max |grad P| = %g: too small for the check to mean anything", norm)
	}
}

// The orthogonality penalty's gradient against central finite
// differences, and its zero on orthogonal columns of any scale.
func TestOrthoPenalty(t *testing.T) {
	p := mustProjector(t, 40, 8, 3, newRNG(5)).view()
	pen, grad := orthoPenalty(p)
	if !(pen > 0.01) {
		t.Fatalf("penalty of a random projector %v, want clearly positive", pen)
	}
	const h = 1e-6
	for s, v := range p.val {
		p.val[s] = v + h
		fp, _ := orthoPenalty(p)
		p.val[s] = v - h
		fm, _ := orthoPenalty(p)
		p.val[s] = v
		if fd := (fp - fm) / (2 * h); math.Abs(fd-grad[s]) > 1e-6*max(1, math.Abs(fd)) {
			t.Errorf("value %d: analytic %.9g, finite difference %.9g", s, grad[s], fd)
		}
	}
	// One non-zero per row, every column used, all values 3: orthogonal
	// columns of equal norm.
	o := sparse{rows: 16, d: 4, r: 1, idx: make([]int32, 16), val: make([]float64, 16)}
	for i := range o.idx {
		o.idx[i], o.val[i] = int32(i%4), 3
	}
	if pen, _ := orthoPenalty(o); math.Abs(pen) > 1e-15 {
		t.Errorf("penalty of orthogonal equal-norm columns %v, want 0", pen)
	}
}

// BenchmarkFitStep times one objective-and-gradient evaluation (one Adam
// step of Fit) on GPT-2 small's attention output projection (768 x 768)
// with d = 192 = min(m,n)/4 and r = 8.
func BenchmarkFitStep(b *testing.B) {
	const m, n, d, r = 768, 768, 192, 8
	rng := newRNG(1)
	p := mustProjector(b, m, d, r, rng).view()
	q := mustProjector(b, n, d, r, rng).view()
	G := randMat(rng, m, n)
	Gs, g2s := [][]float32{G}, []float64{sqNorm32(G)}
	for b.Loop() {
		evaluate(Gs, g2s, p, []sparse{q}, true)
	}
}
