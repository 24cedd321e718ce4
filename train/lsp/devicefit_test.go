package lsp

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// Tolerances against the float64 host fit (the package doc says why they
// are not 0):
//   - at the same projectors, objective and ratios within evalTol absolute
//     and every gradient entry within gradTol of the largest;
//   - after a fit of a few Adam steps from the same draw, the reported
//     ratios within fitTol absolute and the values within valTol of the
//     largest.
const (
	evalTol = 1e-5
	gradTol = 2e-6
	fitTol  = 1e-5
	valTol  = 2e-5
)

// problem is a ragged fit: P m x d, Qs n_k x d, r per row, a rank-3
// gradient plus noise per sample and matrix.
type problem struct {
	m, d, r int
	ns      []int
	samples int
}

var problems = []problem{
	{m: 37, d: 11, r: 3, ns: []int{29}, samples: 1},
	{m: 45, d: 13, r: 5, ns: []int{23, 51}, samples: 2},
	{m: 19, d: 7, r: 7, ns: []int{33}, samples: 3},
}

func (pr problem) String() string {
	return fmt.Sprintf("m%d_d%d_r%d_n%v_s%d", pr.m, pr.d, pr.r, pr.ns, pr.samples)
}

// build draws the projectors and samples of pr.
func (pr problem) build(t *testing.T, seed uint64) (*Projector, []*Projector, [][][]float32) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 17))
	P, err := NewProjector(pr.m, pr.d, pr.r, rng)
	if err != nil {
		t.Fatal(err)
	}
	var Qs []*Projector
	for _, n := range pr.ns {
		q, err := NewProjector(n, pr.d, pr.r, rng)
		if err != nil {
			t.Fatal(err)
		}
		Qs = append(Qs, q)
	}
	samples := make([][][]float32, pr.samples)
	for j := range samples {
		for _, n := range pr.ns {
			samples[j] = append(samples[j], lowRank(rng, pr.m, n, 3, 0.1))
		}
	}
	return P, Qs, samples
}

// backends are the backends the tests run the fit on, each closed when
// the test that opened it ends: the CPU backend in
// its hazard-checking, kernel-dtype mode, and, in cudasim and cuda builds,
// the CUDA backend (devicefit_cuda_test.go).
var backends = []struct {
	name string
	open func(t *testing.T) backend.Backend
}{
	{"cpu", func(t *testing.T) backend.Backend {
		be := cpu.New(cpu.Config{Threads: 2, HazardCheck: true, KernelDTypes: true})
		t.Cleanup(func() { be.Close() })
		return be
	}},
}

// TestEvaluateMatchesHost compares one evaluation (objective, ratios and
// gradient, with and without the orthogonality penalty) with the host's
// float64 one at the same projectors.
func TestEvaluateMatchesHost(t *testing.T) {
	eachFitCase(t, func(t *testing.T, be backend.Backend, pr problem, ortho float64) {
		P, Qs, samples := pr.build(t, 3)
		obj, ratios, grads, err := FitObjective(P, Qs, samples, ortho)
		if err != nil {
			t.Fatal(err)
		}
		opts := FitOptions{LR: 0.05, MaxIters: 1, Ortho: ortho}
		g2s, err := CheckFitSamples(P, Qs, samples, 0.5, opts)
		if err != nil {
			t.Fatal(err)
		}
		f := &deviceFit{be: be, s: be.DefaultStream(), opts: opts, d: P.D, r: P.R, samples: samples, g2s: g2s}
		defer f.free()
		if err := f.setup(P, Qs); err != nil {
			t.Fatal(err)
		}
		if err := f.load(P, Qs); err != nil {
			t.Fatal(err)
		}
		ev, err := f.evaluate(true)
		if err != nil {
			t.Fatal(err)
		}
		if ortho > 0 {
			if err := f.orthoGrad(ev); err != nil {
				t.Fatal(err)
			}
		}
		if d := math.Abs(ev.obj - obj); d > evalTol {
			t.Errorf("objective %v, host %v (|diff| %.3g > %v)", ev.obj, obj, d, evalTol)
		}
		for k, r := range ratios {
			if d := math.Abs(ev.ratios[k] - r); d > evalTol {
				t.Errorf("matrix %d: ratio %v, host %v (|diff| %.3g > %v)", k, ev.ratios[k], r, d, evalTol)
			}
		}
		got := downloadF32(t, be, f.grads)
		var scale, worst float64
		for _, g := range grads {
			for _, v := range g {
				scale = max(scale, math.Abs(v))
			}
		}
		for k, g := range grads {
			x := f.ps[k]
			var wk float64
			for e, v := range g {
				wk = max(wk, math.Abs(float64(got[x.off+e])-v)/scale)
			}
			t.Logf("projector %d: worst gradient difference %.3g", k, wk)
			worst = max(worst, wk)
		}
		t.Logf("objective %v (host %v), worst gradient difference %.3g of the largest %.3g", ev.obj, obj, worst, scale)
		if worst > gradTol {
			t.Errorf("gradient differs from the host's by %.3g of its largest entry, want <= %v", worst, gradTol)
		}
	})
}

func downloadF32(t *testing.T, be backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	h, err := be.AllocHost("test", int(x.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	defer be.FreeHost(h)
	if err := be.CopyD2H(be.DefaultStream(), h, 0, x); err != nil {
		t.Fatal(err)
	}
	if err := be.Synchronize(be.DefaultStream()); err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), h.Float32()...)
}

// TestMatchesHostFit runs the whole fit on the CPU backend and on the
// host from the same projectors and seed: the same decisions (resampled,
// iterations), ratios within fitTol and fitted values within valTol.
func TestMatchesHostFit(t *testing.T) {
	eachFitCase(t, func(t *testing.T, be backend.Backend, pr problem, ortho float64) {
		P, Qs, samples := pr.build(t, 5)
		opts := FitOptions{LR: 0.05, MaxIters: 15, Seed: 11, Ortho: ortho}
		hP, hQs := P.Clone(), clones(Qs)
		want, err := FitSamples(hP, hQs, samples, 0.05, opts)
		if err != nil {
			t.Fatal(err)
		}
		dP, dQs := P.Clone(), clones(Qs)
		got, err := FitSamplesOn(be, be.DefaultStream(), dP, dQs, samples, 0.05, opts)
		if err != nil {
			t.Fatal(err)
		}
		for k := range want {
			g, w := got[k], want[k]
			t.Logf("matrix %d: device %+v host %+v", k, g, w)
			if g.Resampled != w.Resampled || g.Iters != w.Iters || g.Reached != w.Reached {
				t.Errorf("matrix %d: device %+v, host %+v: different decisions", k, g, w)
			}
			if math.Abs(g.RatioBefore-w.RatioBefore) > evalTol || math.Abs(g.RatioAfter-w.RatioAfter) > fitTol {
				t.Errorf("matrix %d: ratios %v -> %v, host %v -> %v", k, g.RatioBefore, g.RatioAfter, w.RatioBefore, w.RatioAfter)
			}
		}
		for i, pair := range [][2]*Projector{{dP, hP}} {
			checkClose(t, fmt.Sprintf("P %d", i), pair[0], pair[1])
		}
		for k := range dQs {
			checkClose(t, fmt.Sprintf("Q %d", k), dQs[k], hQs[k])
		}
	})
}

// eachFitCase runs f as a subtest for every backend, problem and
// orthogonality weight (0 and 0.3), on the backend opened for it and
// closed when the subtest ends.
func eachFitCase(t *testing.T, f func(t *testing.T, be backend.Backend, pr problem, ortho float64)) {
	for _, bk := range backends {
		for _, pr := range problems {
			for _, ortho := range []float64{0, 0.3} {
				t.Run(fmt.Sprintf("%s_%v_ortho%v", bk.name, pr, ortho), func(t *testing.T) {
					be := bk.open(t)
					f(t, be, pr, ortho)
				})
			}
		}
	}
}

func clones(ps []*Projector) []*Projector {
	out := make([]*Projector, len(ps))
	for i, p := range ps {
		out[i] = p.Clone()
	}
	return out
}

// checkClose fails unless got and want have the same positions and values
// within valTol of the largest, and got is valid.
func checkClose(t *testing.T, name string, got, want *Projector) {
	t.Helper()
	if err := got.Validate(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var scale, worst float64
	for e, v := range want.Val {
		if got.Idx[e] != want.Idx[e] {
			t.Fatalf("%s: entry %d at column %d, host %d", name, e, got.Idx[e], want.Idx[e])
		}
		scale = max(scale, math.Abs(float64(v)))
		worst = max(worst, math.Abs(float64(got.Val[e]-v)))
	}
	t.Logf("%s: worst value difference %.3g of the largest %.3g", name, worst/scale, scale)
	if worst > valTol*scale {
		t.Errorf("%s: values differ from the host's by %.3g of the largest, want <= %v", name, worst/scale, valTol)
	}
}

// TestTraceFitRecordsTheFit: TraceFit enqueues the ops a real fit that
// takes every step runs (counted by method; the copies of the best values
// aside, which a real fit makes only when the objective improves), so the
// planner costs the fit that runs.
func TestTraceFitRecordsTheFit(t *testing.T) {
	pr := problems[1]
	P, Qs, samples := pr.build(t, 5)
	opts := FitOptions{LR: 0.05, MaxIters: 4, Seed: 11, Ortho: 0.3}
	count := func(ops []trace.Op) map[string]int {
		n := map[string]int{}
		for _, o := range ops {
			if o.Method != "CopyD2D" {
				n[o.Method]++
			}
		}
		return n
	}
	real := trace.Wrap(cpu.New(cpu.Config{}))
	defer real.Close()
	res, err := FitSamplesOn(real, real.DefaultStream(), P.Clone(), clones(Qs), samples, 1e-6, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Iters != opts.MaxIters {
		t.Fatalf("the fit took %d steps, want all %d", res[0].Iters, opts.MaxIters)
	}
	traced := trace.New()
	if err := TraceFit(traced, traced.DefaultStream(), P, Qs, pr.samples, opts.MaxIters, opts); err != nil {
		t.Fatal(err)
	}
	want, got := count(real.Recorded()), count(traced.Recorded())
	if !maps.Equal(got, want) {
		t.Errorf("TraceFit recorded %v, the fit ran %v", got, want)
	}
}

// TestBytesCoversTheFit: the device memory a fit allocates stays within
// Bytes (what the engine's plan counts and reserves), and Bytes is not
// far above it.
func TestBytesCoversTheFit(t *testing.T) {
	for _, pr := range problems {
		t.Run(pr.String(), func(t *testing.T) {
			P, Qs, samples := pr.build(t, 5)
			be := cpu.New(cpu.Config{})
			defer be.Close()
			base := be.MemStats().InUse
			opts := FitOptions{LR: 0.05, MaxIters: 2, Seed: 11, Ortho: 0.3}
			if _, err := FitSamplesOn(be, be.DefaultStream(), P, Qs, samples, 1e-6, opts); err != nil {
				t.Fatal(err)
			}
			used := be.MemStats().HighWater - base
			want := FitBytes(pr.m, pr.ns, pr.d, pr.r, pr.samples)
			if used > want || float64(used) < 0.5*float64(want) {
				t.Errorf("the fit allocated %d bytes, Bytes says %d", used, want)
			}
			if in := be.MemStats().InUse; in != base {
				t.Errorf("%d bytes left allocated after the fit", in-base)
			}
		})
	}
}

// TestStagingIsReused: a fit through a caller's Staging (StagingBytes'
// sizes) allocates no host memory and gives the fit's own result bit for
// bit; a staging too small for the fit is refused by name.
func TestStagingIsReused(t *testing.T) {
	pr := problems[1]
	P, Qs, samples := pr.build(t, 5)
	opts := FitOptions{LR: 0.05, MaxIters: 3, Seed: 11, Ortho: 0.3}
	be := cpu.New(cpu.Config{})
	defer be.Close()
	wantP, wantQs := P.Clone(), clones(Qs)
	want, err := FitSamplesOn(be, be.DefaultStream(), wantP, wantQs, samples, 1e-6, opts)
	if err != nil {
		t.Fatal(err)
	}
	g, s := FitStagingBytes(pr.m, pr.ns, pr.d, pr.r, pr.samples)
	stg, err := NewFitStaging(be, g, s)
	if err != nil {
		t.Fatal(err)
	}
	defer stg.Free(be)
	allocs := be.HostAllocs()
	gotP, gotQs := P.Clone(), clones(Qs)
	got, err := FitSamplesStaged(be, be.DefaultStream(), stg, gotP, gotQs, samples, 1e-6, opts)
	if err != nil {
		t.Fatal(err)
	}
	if n := be.HostAllocs() - allocs; n != 0 {
		t.Errorf("a fit through a given staging made %d host allocations", n)
	}
	if !slices.Equal(gotP.Val, wantP.Val) || got[0].RatioAfter != want[0].RatioAfter {
		t.Errorf("staged fit: ratio %v, its own staging's %v (or P's values differ)", got[0].RatioAfter, want[0].RatioAfter)
	}
	small, err := NewFitStaging(be, g/2, s)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Free(be)
	if _, err := FitSamplesStaged(be, be.DefaultStream(), small, P.Clone(), clones(Qs), samples, 1e-6, opts); err == nil || !strings.Contains(err.Error(), "staging") {
		t.Errorf("a staging half the size: %v, want an error naming the staging", err)
	}
}
