// The projector check (docs/DESIGN.md, "Learning the projectors"): every
// --check-every steps
// (and before step 1 with --check-at-start), a calibration pass forms the
// full gradient G of one layer's matrices at a time, per micro-batch (that
// layer's forward keeps its inputs X; G = X^T dY). The host measures each
// matrix's bias ratio and refits the projectors that exceed alpha (the
// matrices that share an input, and so P, together; with --share-layers
// that input of every layer) on the first half of the micro-batches
// (--refit: their summed gradient, or each at once); the second half
// decides whether the new projectors are kept (--accept heldout: they must
// capture AcceptMargin more of its gradient). Kept projectors get the
// subspace Adam moments carried over and, by --rewarm, the second moment
// raised to the new subspace's or the learning rate re-warmed.
//
// Limits: the calibration runs L forward and backward passes per
// micro-batch (one per layer) so that only one layer's G (the sum of m n
// over its matrices, fp32; 12 C^2 for GPT-2) and inputs (the sum of m over
// its inputs per token; 7 C for GPT-2) are on the device at a time; the
// host keeps at most maxFitGroups + 1 such G per layer (all layers' with
// --share-layers); the fit itself runs on the backend's ops
// (devicefit.go: the host float64 fit of fit.go within fp32 rounding),
// its buffers allocated for the fit and freed after it (memory.go's
// reservation, the plan's "projector fit"). --projector svd replaces the
// fit by the refresh of svd.go, from the same calibration gradients.

package lsp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// carryRidge regularises the d x d solves of the moment carry-over; the
// Gram diagonals it is added to are about m/d >= 1.
const carryRidge = 1e-6

// CheckReport is one matrix's projector check, for metrics.jsonl.
type CheckReport struct {
	Matrix      string  // the parameter name
	RatioBefore float64 // bias ratio of the projectors in use
	RatioAfter  float64 // bias ratio of the projectors kept
	Iters       int     // Adam steps of the fit
	Resampled   bool    // new projectors were drawn and fitted
	Reached     bool    // RatioAfter <= alpha
	Change      float64 // subspace change of the moment carry-over (0: unchanged)
	Rewarm      bool    // the learning rate of the matrix is re-warmed
	Rejected    bool    // a refit was made and rejected by the held-out micro-batches
	// CaptureBefore and CaptureAfter are the shares of the held-out
	// gradient captured by the projectors in use and those kept (0 without
	// held-out acceptance).
	CaptureBefore, CaptureAfter float64
	Seconds                     float64 // wall time of the fit (of the whole group when matrices share P)
}

// calibration holds one layer's inputs (by input) and full gradients (by
// matrix).
type calibration struct {
	st   *State
	x, g []backend.Tensor
	bufs []backend.Tensor
}

// calibrationBytes is the device memory of the calibration buffers.
func calibrationBytes(x *model.Index, BT int, dt backend.DType) int64 {
	var b int64
	for _, m := range x.InputM {
		b += int64(BT*m) * int64(dt.Size())
	}
	for _, mt := range x.Mats {
		b += int64(mt.M*mt.N) * 4
	}
	return b
}

func newCalibration(st *State) (*calibration, error) {
	env := st.env
	x := env.Index
	c := &calibration{st: st, x: make([]backend.Tensor, x.Inputs), g: make([]backend.Tensor, len(x.Mats))}
	BT := env.B * env.T
	alloc := func(name string, n int, dt backend.DType) (backend.Tensor, error) {
		t, err := env.Backend.Alloc(name, n, dt)
		if err != nil {
			c.free()
			return t, fmt.Errorf("lsp: %w", err)
		}
		c.bufs = append(c.bufs, t)
		return t, nil
	}
	// In matrix order, each input with its first reader.
	for k, mt := range x.Mats {
		if x.Readers[mt.Input][0] == k {
			in, err := alloc("calibration input "+mt.Name, BT*mt.M, env.DType)
			if err != nil {
				return nil, err
			}
			c.x[mt.Input] = in.Reshape(BT, mt.M)
		}
		g, err := alloc("calibration gradient "+mt.Name, mt.M*mt.N, backend.F32)
		if err != nil {
			return nil, err
		}
		c.g[k] = g.Reshape(mt.M, mt.N)
	}
	return c, nil
}

func (c *calibration) free() {
	for _, t := range c.bufs {
		c.st.env.Backend.Free(t)
	}
	c.bufs = nil
}

func (c *calibration) input(s backend.Stream, l, in int, X backend.Tensor) error {
	if l != c.st.calibLayer {
		return nil
	}
	return c.st.env.Backend.CopyD2D(s, c.x[in], X)
}

func (c *calibration) outputGrad(s backend.Stream, l, k int, dY backend.Tensor) error {
	if l != c.st.calibLayer {
		return nil
	}
	env := c.st.env
	mt := env.Index.Mats[k]
	return env.Backend.Gemm(s, true, false, mt.M, mt.N, env.B*env.T, 1, c.x[mt.Input], dY, 1, c.g[k])
}

// Checks reports whether the state runs projector checks (it has a
// calibration: not with NoFit).
func (st *State) Checks() bool { return st.calib != nil }

// CalibBatches is the number of micro-batches of B rows Check wants: the
// calibration rows in whole micro-batches, and at least two when held-out
// micro-batches decide whether a refit is kept (one fits, one decides).
func (c Config) CalibBatches(B int) int {
	n := (c.CalibSamples + B - 1) / B
	if c.WithDefaults().Accept == AcceptHeldOut {
		n = max(n, 2)
	}
	return n
}

// Check runs the projector check on the calibration micro-batches and
// returns one report per matrix. The pipeline must be drained (it is
// between steps). Gradients left in Grads are cleared by the next step.
//
// Each micro-batch's gradient is formed on its own (the mean over its
// target tokens): with held-out acceptance the first half of the
// micro-batches fit and the rest decide; otherwise all of them fit.
func (st *State) Check(batches []data.Batch, step int) ([]CheckReport, error) {
	if st.calib == nil {
		return nil, fmt.Errorf("lsp: no projector check without --fit")
	}
	nFit := len(batches)
	if st.Config.Accept == AcceptHeldOut {
		if len(batches) < 2 {
			return nil, fmt.Errorf("lsp: projector check: %d calibration micro-batches, held-out acceptance needs at least 2", len(batches))
		}
		nFit = len(batches) / 2
	}
	weights := make([]float64, len(batches))
	for j, b := range batches {
		if b.NumTargets == 0 {
			return nil, fmt.Errorf("lsp: projector check: no target tokens in calibration micro-batch %d", j)
		}
		weights[j] = float64(b.NumTargets)
	}
	// Fitting micro-batch j goes to group j*groups/nFit: at most
	// maxFitGroups gradients per matrix on the host, whatever the
	// calibration size.
	groups := min(nFit, maxFitGroups)
	group := func(j int) int { return j * groups / nFit }
	defer func() { st.calibLayer = -1 }()
	m, be, s := st.env.Model, st.env.Backend, st.env.Stream
	bufs := m.Buffers()
	var reports []CheckReport
	shared := map[int][]member{} // --share-layers: by the input's first reader's index k
	for l := range st.Mats {
		st.calibLayer = l
		// Target-weighted sums of the layer's gradients, per group (then
		// the held-out micro-batches, as one) and matrix.
		sums := make([]gradSum, groups+1)
		for j, b := range batches {
			for _, g := range st.calib.g {
				if err := be.Fill(s, g, 0); err != nil {
					return nil, err
				}
			}
			if err := model.UploadBatch(be, s, bufs, b.T, b.Inputs, b.Targets, b.Positions); err != nil {
				return nil, err
			}
			if err := model.ForwardBackward(m, s, len(st.Mats), 1/float32(b.NumTargets)); err != nil {
				return nil, fmt.Errorf("lsp: calibration pass of layer %d: %w", l, err)
			}
			sum := &sums[groups]
			if j < nFit {
				sum = &sums[group(j)]
			}
			for k := range st.Mats[l] {
				G, err := backend.Download(be, s, st.calib.g[k])
				if err != nil {
					return nil, err
				}
				sum.add(k, len(st.Mats[l]), G, float64(b.NumTargets))
			}
		}
		if st.Config.Projector == KindSVD {
			rs, err := st.svdRefresh(l, sums, step)
			if err != nil {
				return nil, fmt.Errorf("lsp: layer %d: %w", l, err)
			}
			reports = append(reports, rs...)
			continue
		}
		// In matrix order, each input's readers together with its first.
		for k, x := range st.Mats[l] {
			if x.In.Mats[0] != x {
				continue
			}
			var cs calibSet
			for gi := range sums {
				if sums[gi].w == 0 {
					continue // no held-out micro-batches
				}
				mine := make([][]float32, len(x.In.Mats))
				for i, y := range x.In.Mats {
					mine[i] = sums[gi].mean(y.K)
				}
				if gi < groups {
					cs.fit, cs.fitW = append(cs.fit, mine), append(cs.fitW, sums[gi].w)
				} else {
					cs.held = mine
				}
			}
			if st.Config.ShareLayers {
				shared[k] = append(shared[k], member{x.In, cs})
				continue
			}
			rs, err := st.fit([]member{{x.In, cs}}, step)
			if err != nil {
				return nil, fmt.Errorf("lsp: layer %d, matrix %d: %w", l, k, err)
			}
			reports = append(reports, rs...)
		}
	}
	if st.Config.ShareLayers {
		// One fit per input kind over every layer's gradients; the
		// reports come in the usual order, layer by layer.
		byMember := map[*Input][]CheckReport{}
		for k := range len(st.Mats[0]) {
			if len(shared[k]) == 0 {
				continue
			}
			rs, err := st.fit(shared[k], step)
			if err != nil {
				return nil, fmt.Errorf("lsp: matrix %d of every layer: %w", k, err)
			}
			for _, mb := range shared[k] {
				byMember[mb.in], rs = rs[:len(mb.in.Mats)], rs[len(mb.in.Mats):]
			}
		}
		for l := range st.Mats {
			for _, x := range st.Mats[l] {
				if x.In.Mats[0] == x {
					reports = append(reports, byMember[x.In]...)
				}
			}
		}
	}
	return reports, nil
}

// member is one input (its P and readers) and its calibration gradients,
// a member of a fit: alone, or with the same input of every layer
// (--share-layers).
type member struct {
	in *Input
	cs calibSet
}

// maxFitGroups bounds the gradients per matrix a check keeps on the host
// (and the samples of --refit split): the fitting micro-batches beyond it
// are averaged in groups of consecutive ones.
const maxFitGroups = 8

// gradSum is a target-weighted sum of micro-batch gradients, per matrix.
type gradSum struct {
	g [][]float32
	w float64
}

// add adds w times G to matrix k's sum (of n matrices); the weight is
// counted once per micro-batch, with matrix 0, which every micro-batch adds.
func (s *gradSum) add(k, n int, G []float32, w float64) {
	if s.g == nil {
		s.g = make([][]float32, n)
	}
	if s.g[k] == nil {
		s.g[k] = make([]float32, len(G))
	}
	for e, v := range G {
		s.g[k][e] += float32(w) * v
	}
	if k == 0 {
		s.w += w
	}
}

// mean is matrix k's weighted mean: the gradient of all the summed
// micro-batches' tokens together.
func (s *gradSum) mean(k int) []float32 {
	out := make([]float32, len(s.g[k]))
	for e, v := range s.g[k] {
		out[e] = v / float32(s.w)
	}
	return out
}

// calibSet is one input's calibration gradients, one per reader (in the
// order of Input.mats): per fitting group, with the group's target
// count as its weight, and the held-out micro-batches' mean (nil unless
// held-out micro-batches decide).
type calibSet struct {
	fit  [][][]float32
	fitW []float64
	held [][]float32
}

// mean is the weighted mean of the groups' gradients, per reader.
func mean(gs [][][]float32, w []float64) [][]float32 {
	var total float64
	for _, v := range w {
		total += v
	}
	out := make([][]float32, len(gs[0]))
	for i := range out {
		acc := make([]float64, len(gs[0][i]))
		for j, g := range gs {
			c := w[j] / total
			for e, v := range g[i] {
				acc[e] += c * float64(v)
			}
		}
		out[i] = make([]float32, len(acc))
		for e, v := range acc {
			out[i][e] = float32(v)
		}
	}
	return out
}

// AcceptMargin is how much more of the held-out gradient candidate
// projectors must capture than the ones in use to replace them: a switch
// of subspace costs progress (the moments carried over are only an
// estimate), so a marginal gain is not worth it.
const AcceptMargin = 0.1

// rewarmUnder: a carried second moment below this share of what the new
// subspace's gradients measure is underestimated enough that Adam's first
// steps there would be too large (RewarmMeasured).
const rewarmUnder = 0.25

// fit checks the projectors of the matrices that read one input (they
// share P) against their calibration gradients and returns one report
// per matrix, in the order of in.Mats. With several members (the same
// input of every layer, --share-layers) one candidate pair is fitted on
// all their gradients and replaces every member's projectors, or none.
func (st *State) fit(members []member, step int) ([]CheckReport, error) {
	t0 := time.Now()
	in := members[0].in
	first := in.Mats[0]
	// The candidates start as copies of the first member's projectors
	// (their shapes and, for a fit that keeps them, their values).
	P := in.P.Clone()
	Qs := make([]*Projector, len(in.Mats))
	for i, x := range in.Mats {
		Qs[i] = x.Q.Clone()
	}
	var samples [][][]float32
	var weights []float64
	for _, mb := range members {
		samples, weights = append(samples, mb.cs.fit...), append(weights, mb.cs.fitW...)
	}
	seed := st.env.Seed ^ uint64(step)<<20 ^ uint64(first.ID)<<8
	var res []FitResult
	var err error
	// The fit allocates in the bytes held for it, and frees them before
	// they are taken back.
	st.releaseFit()
	switch st.Config.Refit {
	case RefitRandom:
		res, err = redraw(P, Qs, mean(samples, weights), st.Config.Alpha, seed)
	case RefitSplit:
		opts := FitOptions{LR: st.Config.ProjLR, MaxIters: st.Config.FitIters, Seed: seed, Ortho: st.Config.Ortho}
		res, err = FitSamplesStaged(st.env.Backend, st.env.Stream, st.fitStaging, P, Qs, samples, st.Config.Alpha, opts)
	default:
		opts := FitOptions{LR: st.Config.ProjLR, MaxIters: st.Config.FitIters, Seed: seed, Ortho: st.Config.Ortho}
		res, err = FitSamplesStaged(st.env.Backend, st.env.Stream, st.fitStaging, P, Qs, [][][]float32{mean(samples, weights)}, st.Config.Alpha, opts)
	}
	if rerr := st.reserveFit(); rerr != nil {
		return nil, rerr
	}
	if err != nil {
		return nil, fmt.Errorf("lsp: fitting the projectors of %s: %w", first.Name, err)
	}
	resampled := false
	for _, r := range res {
		resampled = resampled || r.Resampled
	}
	reps := make([][]CheckReport, len(members))
	for j, mb := range members {
		reps[j] = make([]CheckReport, len(mb.in.Mats))
		for i, x := range mb.in.Mats {
			r := res[i]
			reps[j][i] = CheckReport{Matrix: x.Name, RatioBefore: r.RatioBefore, RatioAfter: r.RatioAfter,
				Iters: r.Iters, Resampled: r.Resampled, Reached: r.Reached}
		}
	}
	// The held-out micro-batches decide, on the share of their gradient
	// each pair captures (the sum over the readers and members).
	if members[0].cs.held != nil {
		var before, after float64
		for j, mb := range members {
			if mb.cs.held == nil {
				continue
			}
			for i, x := range mb.in.Mats {
				rp := &reps[j][i]
				if rp.CaptureBefore, err = Capture(mb.in.P, x.Q, mb.cs.held[i]); err != nil {
					return nil, fmt.Errorf("lsp: held-out capture of %s: %w", x.Name, err)
				}
				rp.CaptureAfter = rp.CaptureBefore
				if resampled {
					if rp.CaptureAfter, err = Capture(P, Qs[i], mb.cs.held[i]); err != nil {
						return nil, fmt.Errorf("lsp: held-out capture of %s: %w", x.Name, err)
					}
				}
				before, after = before+rp.CaptureBefore, after+rp.CaptureAfter
			}
		}
		if resampled && members[0].cs.held != nil && !(after > before*(1+AcceptMargin)) {
			// Not enough better on data the fit did not see: keep the
			// projectors in use, and their moments.
			for j := range members {
				for i := range reps[j] {
					rp := &reps[j][i]
					rp.Rejected, rp.Resampled = true, false
					rp.RatioAfter, rp.CaptureAfter = rp.RatioBefore, rp.CaptureBefore
					rp.Reached = rp.RatioBefore <= st.Config.Alpha
				}
			}
			resampled = false
		}
	}
	if resampled {
		for j, mb := range members {
			if err := st.replace(mb, P, Qs, reps[j], step); err != nil {
				return nil, err
			}
		}
	}
	secs := time.Since(t0).Seconds()
	var out []CheckReport
	for j := range reps {
		for i := range reps[j] {
			reps[j][i].Seconds = secs
		}
		out = append(out, reps[j]...)
	}
	return out, nil
}

// replace gives one member copies of the kept candidates P and Qs, carries
// each matrix's moments from its old projectors into them, re-warms by
// --rewarm, and uploads the projectors.
func (st *State) replace(mb member, P *Projector, Qs []*Projector, reps []CheckReport, step int) error {
	in := mb.in
	pOld := in.P
	in.P = P.Clone()
	for i, x := range in.Mats {
		if !reps[i].Resampled {
			continue
		}
		qOld := x.Q
		x.Q = Qs[i].Clone()
		c, err := CarryMoments(pOld, in.P, qOld, x.Q, x.Adam.M, x.Adam.V, carryRidge)
		if err != nil {
			return fmt.Errorf("lsp: carrying the moments of %s: %w", x.Name, err)
		}
		reps[i].Change = c.Change
		if x.Adam.Step == 0 {
			continue
		}
		switch st.Config.Rewarm {
		case RewarmChange:
			reps[i].Rewarm = st.ramp.Large(c)
		case RewarmMeasured:
			if reps[i].Rewarm, err = st.underestimated(x, mb.cs, i); err != nil {
				return err
			}
		case RewarmFloor:
			if err := st.floorV(x, mb.cs, i); err != nil {
				return err
			}
		}
		if reps[i].Rewarm {
			x.RewarmFrom = step + 1
		}
	}
	if err := st.uploadP(in); err != nil {
		return err
	}
	for _, x := range in.Mats {
		if err := st.uploadQ(x); err != nil {
			return err
		}
	}
	return nil
}

// newS2 is the mean over the fitting groups of S^2, entry by entry, of
// matrix x's compressed gradients in its (new) subspace; i is x's place
// among its input's readers.
func newS2(x *Matrix, cs calibSet, i int) ([]float64, error) {
	s2 := make([]float64, x.D*x.D)
	for _, g := range cs.fit {
		S, err := Project(x.In.P, x.Q, g[i])
		if err != nil {
			return nil, fmt.Errorf("lsp: %s: %w", x.Name, err)
		}
		for e, v := range S {
			s2[e] += v * v / float64(len(cs.fit))
		}
	}
	return s2, nil
}

// biasCorrection is Adam's 1 - beta2^step of matrix x, which the step
// divides the second moment by.
func (st *State) biasCorrection(x *Matrix) float64 {
	return 1 - math.Pow(float64(st.env.Hyper.Beta2), float64(x.Adam.Step))
}

// underestimated reports whether matrix x's carried second moment (bias
// corrected, summed over the d x d entries) is below rewarmUnder times
// the new subspace's (newS2, summed).
func (st *State) underestimated(x *Matrix, cs calibSet, i int) (bool, error) {
	s2, err := newS2(x, cs, i)
	if err != nil {
		return false, err
	}
	var want, v float64
	for e := range s2 {
		want, v = want+s2[e], v+float64(x.Adam.V[e])
	}
	return v/st.biasCorrection(x) < rewarmUnder*want, nil
}

// floorV raises matrix x's carried second moment to the new subspace's
// (newS2), entry by entry, stored times Adam's bias correction.
func (st *State) floorV(x *Matrix, cs calibSet, i int) error {
	s2, err := newS2(x, cs, i)
	if err != nil {
		return err
	}
	corr := st.biasCorrection(x)
	for e, v := range s2 {
		x.Adam.V[e] = max(x.Adam.V[e], float32(v*corr))
	}
	return nil
}

// redraw replaces the candidates P and Qs by fresh random projectors of
// their shapes (RefitRandom) and reports the bias ratios on g (per reader).
func redraw(P *Projector, Qs []*Projector, g [][]float32, alpha float64, seed uint64) ([]FitResult, error) {
	rng := rand.New(rand.NewPCG(seed, 0x7265647261770000)) // "redraw"
	res := make([]FitResult, len(Qs))
	for i, Q := range Qs {
		var err error
		if res[i].RatioBefore, err = BiasRatio(P, Q, g[i]); err != nil {
			return nil, err
		}
	}
	nP, err := NewProjector(P.M, P.D, P.R, rng)
	if err != nil {
		return nil, err
	}
	*P = *nP
	for i, Q := range Qs {
		nQ, err := NewProjector(Q.M, Q.D, Q.R, rng)
		if err != nil {
			return nil, err
		}
		*Q = *nQ
		if res[i].RatioAfter, err = BiasRatio(P, Q, g[i]); err != nil {
			return nil, err
		}
		res[i].Resampled, res[i].Reached = true, res[i].RatioAfter <= alpha
	}
	return res, nil
}
