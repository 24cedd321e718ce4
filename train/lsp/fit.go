// Fitting the projectors (docs/DESIGN.md, "Learning the projectors"):
// when a matrix's bias ratio exceeds alpha, draw fresh positions, scale
// the draw to its best size along the objective, and fit the non-zero
// values by Adam on ratio^2 = ||P P^T G Q Q^T - G||^2 / ||G||^2 with the
// analytic gradient of bias.go, averaged over gradient samples
// (FitSamples), optionally with a penalty on non-orthogonal columns.
// Matrices that read the same input share P and are fitted together on
// the sum of their ratio^2.
//
// Limits: float64 on the host, single-threaded, O(samples (m n r + d^3))
// per iteration per matrix (the engine runs it between steps); the fitted
// values are rounded to float32 after every Adam step, so the reported
// ratios are those of the stored projectors exactly.

package lsp

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Adam's fixed constants for the value fit: the usual moments and an eps
// far below the values' scale (about 1/sqrt(r)).
const (
	FitBeta1 = 0.9
	FitBeta2 = 0.999
	FitEps   = 1e-8
)

// FitOptions configures a fit.
type FitOptions struct {
	// LR is Adam's step size on the projector values (the paper's runs use
	// 0.05 to 0.1).
	LR float64
	// MaxIters is the budget of Adam steps; 0 only measures and, when the
	// ratio exceeds alpha, tries fresh random positions without fitting.
	MaxIters int
	// Ortho weighs orthoPenalty of P and of every Q (their mean over the
	// Qs) in the objective: 0 fits the bias ratio alone.
	Ortho float64
	// Seed keys the draw of the fresh positions and values, so a fit is
	// reproducible; give each matrix (or shared-P group) and each check its
	// own seed, or they all draw the same positions.
	Seed uint64
}

// FitResult reports one matrix's fit; the caller logs it (metrics.jsonl)
// and warns when Reached is false.
type FitResult struct {
	// RatioBefore is the bias ratio of the projectors passed in; RatioAfter
	// that of the projectors left in place (equal when not Resampled).
	RatioBefore, RatioAfter float64
	// Iters is the number of Adam steps taken (shared by a FitShared group).
	Iters int
	// Resampled reports that the projectors were replaced by fitted fresh
	// ones. The old ones are kept when they were already within alpha or
	// when the fit ended worse than they were.
	Resampled bool
	// Reached reports RatioAfter <= alpha.
	Reached bool
}

// Fit checks one matrix's projectors against its gradient G (m x n,
// row-major) and, when the bias ratio exceeds alpha, replaces them in place
// with fresh positions and values fitted by Adam until the ratio is at most
// alpha or opts.MaxIters steps are spent. Clone P and Q first when the old
// ones are needed afterwards (CarryMoments).
func Fit(P, Q *Projector, G []float32, alpha float64, opts FitOptions) (FitResult, error) {
	res, err := FitShared(P, []*Projector{Q}, [][]float32{G}, alpha, opts)
	if err != nil {
		return FitResult{}, err
	}
	return res[0], nil
}

// FitShared is Fit for matrices that read the same input and so share P:
// Qs[k] and Gs[k] (m x n_k) belong to matrix k. The objective is the sum of
// the matrices' ratio^2 (each normalised by its ||G_k||^2, so every matrix
// weighs the same whatever its gradient's scale). When any ratio exceeds
// alpha, P and every Q are redrawn and fitted together until all ratios are
// at most alpha or the budget ends; the whole group is then kept or
// replaced together, by which has the lower objective. One result per
// matrix, in the order of Qs.
func FitShared(P *Projector, Qs []*Projector, Gs [][]float32, alpha float64, opts FitOptions) ([]FitResult, error) {
	return FitSamples(P, Qs, [][][]float32{Gs}, alpha, opts)
}

// FitSamples is FitShared on several gradients of each matrix:
// samples[j][k] is the j-th gradient of matrix k (micro-batch or step
// gradients, say). The objective is the mean over samples of the sum over
// matrices of ratio^2, so the fit looks for a subspace that serves every
// sample rather than their sum, whose few top directions need not be those
// of the next gradient; a matrix's reported ratio is the root mean square
// of its ratios over the samples. With one sample it is FitShared.
func FitSamples(P *Projector, Qs []*Projector, samples [][][]float32, alpha float64, opts FitOptions) ([]FitResult, error) {
	g2s, err := CheckFitSamples(P, Qs, samples, alpha, opts)
	if err != nil {
		return nil, err
	}
	qviews := func(qs []*Projector) []sparse {
		out := make([]sparse, len(qs))
		for k, q := range qs {
			out[k] = q.view()
		}
		return out
	}
	evaluate := func(p sparse, qs []sparse, grad bool) evaluation {
		ev := evaluateSamples(samples, g2s, p, qs, grad)
		if opts.Ortho > 0 {
			addOrtho(&ev, p, qs, opts.Ortho, grad)
		}
		return ev
	}
	before := evaluate(P.view(), qviews(Qs), false)
	res, nP, nQs, err := startFit(P, Qs, before.ratios, alpha, opts.Seed)
	if err != nil || nP == nil {
		return res, err
	}

	// Start the fit at the best scale of the fresh pairs: R_k = c R_k
	// with c = ||S_k||^2 / ||R_k||^2 minimises the objective along the
	// scale (f(c) = c^2 ||R||^2 - 2 c ||S||^2 + ||G||^2). Fresh random
	// projectors overshoot by about (m/d)(n/d), and from there Adam spends
	// its budget shrinking the values toward the trivial R = 0 (ratio 1)
	// instead of turning the subspace toward G.
	ev := evaluate(nP.view(), qviews(nQs), false)
	if err := MatchScale(nP, nQs, ev.s2, ev.r2); err != nil {
		return nil, err
	}

	// Parameters: P's values then each Q's, float64 masters for Adam; the
	// evaluated point is always their float32 rounding.
	var master []float64
	master = append(master, nP.values()...)
	for _, q := range nQs {
		master = append(master, q.values()...)
	}
	store := func() (sparse, []sparse) {
		off := 0
		for _, pr := range append([]*Projector{nP}, nQs...) {
			for s := range pr.Val {
				pr.Val[s] = float32(master[off+s])
			}
			off += len(pr.Val)
		}
		return nP.view(), qviews(nQs)
	}
	mom1 := make([]float64, len(master))
	mom2 := make([]float64, len(master))
	best := evaluation{obj: math.Inf(1)}
	var bestVals []float32
	iters := 0
	for {
		pv, qv := store()
		ev := evaluate(pv, qv, iters < opts.MaxIters)
		if ev.obj < best.obj {
			best = ev
			bestVals = bestVals[:0]
			for _, pr := range append([]*Projector{nP}, nQs...) {
				bestVals = append(bestVals, pr.Val...)
			}
		}
		if AllWithin(ev.ratios, alpha) || iters == opts.MaxIters {
			break
		}
		if math.IsNaN(ev.obj) || math.IsInf(ev.obj, 0) {
			return nil, fmt.Errorf("lsp fit: objective %v after %d steps (lower the projector learning rate)", ev.obj, iters)
		}
		iters++
		grad := append([]float64(nil), ev.gp...)
		for _, g := range ev.gqs {
			grad = append(grad, g...)
		}
		c1 := 1 - math.Pow(FitBeta1, float64(iters))
		c2 := 1 - math.Pow(FitBeta2, float64(iters))
		for e, g := range grad {
			mom1[e] = FitBeta1*mom1[e] + (1-FitBeta1)*g
			mom2[e] = FitBeta2*mom2[e] + (1-FitBeta2)*g*g
			master[e] -= opts.LR * (mom1[e] / c1) / (math.Sqrt(mom2[e]/c2) + FitEps)
		}
	}

	for k := range res {
		res[k].Iters = iters
	}
	if !(best.obj < before.obj) {
		// The fresh fit ended no better than the projectors in place: keep
		// those (their subspace, and the moments living in it, are better).
		for k := range res {
			res[k].Reached = before.ratios[k] <= alpha
		}
		return res, nil
	}
	off := 0
	for _, pr := range append([]*Projector{nP}, nQs...) {
		copy(pr.Val, bestVals[off:off+len(pr.Val)])
		off += len(pr.Val)
		if err := pr.SyncValues(); err != nil {
			return nil, fmt.Errorf("lsp fit: %w", err)
		}
	}
	*P = *nP
	for k, q := range nQs {
		*Qs[k] = *q
		res[k].Resampled = true
		res[k].RatioAfter = best.ratios[k]
		res[k].Reached = best.ratios[k] <= alpha
	}
	return res, nil
}

// addOrtho adds w times the orthogonality penalty of P and the mean of
// the Qs' to the objective and, with grad, to its gradient.
func addOrtho(ev *evaluation, p sparse, qs []sparse, w float64, grad bool) {
	pen, g := orthoPenalty(p)
	ev.obj += w * pen
	if grad {
		axpy(ev.gp, g, w)
	}
	wq := w / float64(len(qs))
	for k, q := range qs {
		pen, g := orthoPenalty(q)
		ev.obj += wq * pen
		if grad {
			axpy(ev.gqs[k], g, wq)
		}
	}
}

// FreshDraw returns copies of P and the Qs with the fresh positions and
// values a fit keyed by seed starts from (FitSamples's draw, which a fit
// on a backend, devicefit.go, repeats so that both fit the same draw).
func FreshDraw(P *Projector, Qs []*Projector, seed uint64) (*Projector, []*Projector, error) {
	rng := rand.New(rand.NewPCG(seed, 0x6c73702d666974)) // "lsp-fit"
	nP := P.Clone()
	if err := nP.redraw(rng); err != nil {
		return nil, nil, fmt.Errorf("lsp fit: P: %w", err)
	}
	nQs := make([]*Projector, len(Qs))
	for k, q := range Qs {
		nQs[k] = q.Clone()
		if err := nQs[k].redraw(rng); err != nil {
			return nil, nil, fmt.Errorf("lsp fit: Q %d: %w", k, err)
		}
	}
	return nP, nQs, nil
}

// CheckFitSamples validates a FitSamples call (shapes, alpha, options)
// without fitting, and returns ||G||^2 of every sample's matrices.
func CheckFitSamples(P *Projector, Qs []*Projector, samples [][][]float32, alpha float64, opts FitOptions) ([][]float64, error) {
	if len(samples) == 0 {
		return nil, fmt.Errorf("lsp fit: no gradient samples")
	}
	g2s := make([][]float64, len(samples))
	for j, Gs := range samples {
		if err := checkFit(P, Qs, Gs, alpha, opts); err != nil {
			if len(samples) > 1 {
				return nil, fmt.Errorf("sample %d: %w", j, err)
			}
			return nil, err
		}
		g2s[j] = make([]float64, len(Gs))
		for k, G := range Gs {
			g2s[j][k] = sqNorm32(G)
			if !(g2s[j][k] > 0) || math.IsInf(g2s[j][k], 0) {
				return nil, fmt.Errorf("lsp fit: matrix %d: ||G||^2 = %v, want finite and positive", k, g2s[j][k])
			}
		}
	}
	return g2s, nil
}

// MatchScale scales P by c_P and each Q_k by sqrt(c_k) / c_P, so that
// every reconstruction R_k (quadratic in P and in Q) is scaled by its best
// c_k = s2[k] / r2[k] (||S_k||^2 / ||R_k||^2, each over ||G_k||^2 and
// averaged over the samples), with c_P the fourth root of their geometric
// mean so that P and the Qs move about equally.
func MatchScale(P *Projector, Qs []*Projector, s2, r2 []float64) error {
	cs := make([]float64, len(Qs))
	var logSum float64
	for k := range Qs {
		if !(r2[k] > 0) || !(s2[k] > 0) {
			return nil // nothing to match: leave the draw as it is
		}
		cs[k] = s2[k] / r2[k]
		logSum += math.Log(cs[k])
	}
	cP := math.Exp(logSum / float64(len(Qs)) / 4)
	scale := func(p *Projector, c float64) error {
		for s := range p.Val {
			p.Val[s] = float32(float64(p.Val[s]) * c)
		}
		return p.SyncValues()
	}
	if err := scale(P, cP); err != nil {
		return fmt.Errorf("lsp fit: %w", err)
	}
	for k, q := range Qs {
		if err := scale(q, math.Sqrt(cs[k])/cP); err != nil {
			return fmt.Errorf("lsp fit: %w", err)
		}
	}
	return nil
}

// evaluateSamples is evaluate averaged over gradient samples: the mean
// objective and gradient, and per matrix the root mean square ratio.
func evaluateSamples(samples [][][]float32, g2s [][]float64, p sparse, qs []sparse, grad bool) evaluation {
	if len(samples) == 1 {
		return evaluate(samples[0], g2s[0], p, qs, grad)
	}
	w := 1 / float64(len(samples))
	var out evaluation
	for j, Gs := range samples {
		ev := evaluate(Gs, g2s[j], p, qs, grad)
		if j == 0 {
			out = evaluation{ratios: make([]float64, len(qs)), s2: make([]float64, len(qs)), r2: make([]float64, len(qs))}
			if grad {
				out.gp = make([]float64, len(ev.gp))
				out.gqs = make([][]float64, len(qs))
				for k := range qs {
					out.gqs[k] = make([]float64, len(ev.gqs[k]))
				}
			}
		}
		out.obj += w * ev.obj
		for k, r := range ev.ratios {
			out.ratios[k] += w * r * r
			out.s2[k] += w * ev.s2[k]
			out.r2[k] += w * ev.r2[k]
		}
		if grad {
			axpy(out.gp, ev.gp, w)
			for k := range qs {
				axpy(out.gqs[k], ev.gqs[k], w)
			}
		}
	}
	for k, r2 := range out.ratios {
		out.ratios[k] = math.Sqrt(r2)
	}
	return out
}

// axpy adds w x to y.
func axpy(y, x []float64, w float64) {
	for i, v := range x {
		y[i] += w * v
	}
}

// AllWithin reports whether every ratio is at most alpha.
func AllWithin(ratios []float64, alpha float64) bool {
	for _, r := range ratios {
		if !(r <= alpha) {
			return false
		}
	}
	return true
}

// StartResults are a fit's results before its first step, from the
// ratios of the projectors it starts from: each ratio before and after,
// and done (every result Reached) when all are already within alpha, so
// the fit has nothing to do. Every fit (the host one here and FitSamplesOn)
// starts with it.
func StartResults(ratios []float64, alpha float64) (res []FitResult, done bool) {
	res = make([]FitResult, len(ratios))
	for k := range res {
		res[k].RatioBefore, res[k].RatioAfter = ratios[k], ratios[k]
	}
	if !AllWithin(ratios, alpha) {
		return res, false
	}
	for k := range res {
		res[k].Reached = true
	}
	return res, true
}

// startFit is how every fit begins, from the ratios of the projectors it
// starts from: StartResults, and when those are not already done, the
// fresh copies of P and the Qs (FreshDraw) that it goes on to fit; nP is
// nil when there is nothing to fit.
func startFit(P *Projector, Qs []*Projector, ratios []float64, alpha float64, seed uint64) (res []FitResult, nP *Projector, nQs []*Projector, err error) {
	res, done := StartResults(ratios, alpha)
	if done {
		return res, nil, nil, nil
	}
	if nP, nQs, err = FreshDraw(P, Qs, seed); err != nil {
		return nil, nil, nil, err
	}
	return res, nP, nQs, nil
}

// checkFit validates a FitShared call.
func checkFit(P *Projector, Qs []*Projector, Gs [][]float32, alpha float64, opts FitOptions) error {
	if !(alpha > 0 && alpha < 1) {
		return fmt.Errorf("lsp fit: --alpha %v outside (0,1)", alpha)
	}
	if !(opts.LR > 0) || math.IsInf(opts.LR, 0) {
		return fmt.Errorf("lsp fit: projector learning rate %v, want finite and positive", opts.LR)
	}
	if !(opts.Ortho >= 0) || math.IsInf(opts.Ortho, 0) {
		return fmt.Errorf("lsp fit: orthogonality weight %v, want finite and >= 0", opts.Ortho)
	}
	if opts.MaxIters < 0 {
		return fmt.Errorf("lsp fit: MaxIters %d, want at least 0", opts.MaxIters)
	}
	if len(Qs) == 0 || len(Qs) != len(Gs) {
		return fmt.Errorf("lsp fit: %d Q projectors and %d gradients, want the same positive number", len(Qs), len(Gs))
	}
	for k, Q := range Qs {
		if err := checkPair(P, Q); err != nil {
			return fmt.Errorf("lsp fit: matrix %d: %w", k, err)
		}
		if Q == P {
			return fmt.Errorf("lsp fit: matrix %d: Q is the same projector as P", k)
		}
		for j := range k {
			if Qs[j] == Q {
				return fmt.Errorf("lsp fit: matrices %d and %d share one Q projector", j, k)
			}
		}
		if err := checkG(Gs[k], P.M, Q.M); err != nil {
			return fmt.Errorf("lsp fit: matrix %d: %w", k, err)
		}
	}
	return nil
}

// checkPair validates P (m x d) and Q (n x d) and that they share d.
func checkPair(P, Q *Projector) error {
	if err := P.Validate(); err != nil {
		return fmt.Errorf("P: %w", err)
	}
	if err := Q.Validate(); err != nil {
		return fmt.Errorf("Q: %w", err)
	}
	if P.D != Q.D {
		return fmt.Errorf("P is %dx%d and Q %dx%d: they must share d", P.M, P.D, Q.M, Q.D)
	}
	return nil
}

// checkG validates the length of an m x n gradient.
func checkG(G []float32, m, n int) error {
	if len(G) != m*n {
		return fmt.Errorf("G has %d entries, want m*n = %d*%d = %d", len(G), m, n, m*n)
	}
	return nil
}
