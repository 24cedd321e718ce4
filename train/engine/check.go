// The projector check of lsp mode (DESIGN.md section 2, "Learning the
// projectors"): before step 1 and every --check-every steps, a calibration
// pass forms the full gradient G of one layer's matrices at a time (that
// layer's forward keeps its inputs X; G = X^T dY), the host measures each
// matrix's bias ratio and refits the projectors that exceed alpha (the
// matrices that share an input, and so P, together), carries the subspace
// Adam moments into the new subspace and re-warms the learning rate after a
// large change.
//
// Limits: the calibration runs L forward and backward passes per
// micro-batch (one per layer) so that only one layer's G (the sum of m n
// over its matrices, fp32; 12 C^2 for GPT-2) and inputs (the sum of m over
// its inputs per token; 7 C for GPT-2) are on the device at a time; the fit
// itself runs in float64 on the host (train/lsp).

package engine

import (
	"fmt"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/lsp"
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
	Seconds     float64 // wall time of the fit (of the whole group when matrices share P)
}

// calibration holds one layer's inputs (by input) and full gradients (by
// matrix).
type calibration struct {
	e    *Engine
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

func newCalibration(e *Engine) (*calibration, error) {
	x := e.idx
	c := &calibration{e: e, x: make([]backend.Tensor, x.Inputs), g: make([]backend.Tensor, len(x.Mats))}
	BT := e.b * e.t
	alloc := func(name string, n int, dt backend.DType) (backend.Tensor, error) {
		t, err := e.be.Alloc(name, n, dt)
		if err != nil {
			c.free()
			return t, fmt.Errorf("engine: %w", err)
		}
		c.bufs = append(c.bufs, t)
		return t, nil
	}
	// In matrix order, each input with its first reader.
	for k, mt := range x.Mats {
		if x.Readers[mt.Input][0] == k {
			in, err := alloc("calibration input "+mt.Name, BT*mt.M, e.dt)
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
		c.e.be.Free(t)
	}
	c.bufs = nil
}

func (c *calibration) input(s backend.Stream, l, in int, X backend.Tensor) error {
	if l != c.e.lsp.calibLayer {
		return nil
	}
	return c.e.be.CopyD2D(s, c.x[in], X)
}

func (c *calibration) outputGrad(s backend.Stream, l, k int, dY backend.Tensor) error {
	if l != c.e.lsp.calibLayer {
		return nil
	}
	mt := c.e.idx.Mats[k]
	return c.e.be.Gemm(s, true, false, mt.M, mt.N, c.e.b*c.e.t, 1, c.x[mt.Input], dY, 1, c.g[k])
}

// CheckDue reports whether the projectors are checked before the next step.
// A step skipped for a non-finite loss does not advance the step count, so
// the attempt after it would be due again; one check per step count is
// enough (and a second would refit the projectors once more).
func (e *Engine) CheckDue() bool {
	if e.lsp == nil || e.lsp.calib == nil || e.checked == e.step {
		return false
	}
	return e.step == 0 || e.step%e.cfg.LSP.CheckEvery == 0
}

// CalibBatches is the number of micro-batches Check wants.
func (e *Engine) CalibBatches() int {
	return (e.cfg.LSP.CalibSamples + e.b - 1) / e.b
}

// Check runs the projector check on the calibration micro-batches and
// returns one report per matrix. The pipeline must be drained (it is
// between steps). Gradients left in Grads are cleared by the next step.
func (e *Engine) Check(batches []data.Batch) ([]CheckReport, error) {
	st := e.lsp
	if st == nil || st.calib == nil {
		return nil, fmt.Errorf("engine: no projector check in mode %s", e.cfg.Mode)
	}
	targets := 0
	for _, b := range batches {
		targets += b.NumTargets
	}
	if targets == 0 {
		return nil, fmt.Errorf("engine: projector check: no target tokens in the calibration batch")
	}
	defer func() { st.calibLayer = -1 }()
	e.checked = e.step
	m, be, s := e.Model, e.be, e.st.Compute
	bufs := m.Buffers()
	var reports []CheckReport
	for l := range st.mats {
		st.calibLayer = l
		for _, g := range st.calib.g {
			if err := be.Fill(s, g, 0); err != nil {
				return nil, err
			}
		}
		for _, b := range batches {
			if err := backend.UploadInt32(be, s, bufs.Inputs, b.Inputs); err != nil {
				return nil, err
			}
			if err := backend.UploadInt32(be, s, bufs.Targets, b.Targets); err != nil {
				return nil, err
			}
			if err := calibrationPass(m, s, len(st.mats), 1/float32(targets)); err != nil {
				return nil, fmt.Errorf("engine: calibration pass of layer %d: %w", l, err)
			}
		}
		// In matrix order, each input's readers together with its first.
		for k, x := range st.mats[l] {
			if x.in.mats[0] != x {
				continue
			}
			Gs := make([][]float32, len(x.in.mats))
			for i, y := range x.in.mats {
				var err error
				if Gs[i], err = backend.Download(be, s, st.calib.g[y.k]); err != nil {
					return nil, err
				}
			}
			rs, err := st.fit(x.in, Gs)
			if err != nil {
				return nil, fmt.Errorf("engine: layer %d, matrix %d: %w", l, k, err)
			}
			reports = append(reports, rs...)
		}
	}
	return reports, nil
}

// calibrationPass is one forward, loss and backward of the model.
func calibrationPass(m model.Model, s backend.Stream, L int, scale float32) error {
	if err := m.Forward(s); err != nil {
		return err
	}
	if err := m.CrossEntropy(s, scale); err != nil {
		return err
	}
	return model.Backward(m, s, L)
}

// fit checks the projectors of the matrices that read one input (they
// share P) against their calibration gradients Gs, in the order of
// in.mats, and returns one report per matrix.
func (st *lspState) fit(in *lspInput, Gs [][]float32) ([]CheckReport, error) {
	e := st.e
	t0 := time.Now()
	pOld := in.P.Clone()
	qOld := make([]*lsp.Projector, len(in.mats))
	Qs := make([]*lsp.Projector, len(in.mats))
	for i, x := range in.mats {
		qOld[i], Qs[i] = x.Q.Clone(), x.Q
	}
	first := in.mats[0]
	opts := lsp.FitOptions{LR: st.cfg.ProjLR, MaxIters: st.cfg.FitIters,
		Seed: e.cfg.Seed ^ uint64(e.step)<<20 ^ uint64(first.id)<<8}
	res, err := lsp.FitShared(in.P, Qs, Gs, st.cfg.Alpha, opts)
	if err != nil {
		return nil, fmt.Errorf("engine: fitting the projectors of %s: %w", first.name, err)
	}
	reps := make([]CheckReport, len(in.mats))
	resampled := false
	for i, x := range in.mats {
		r := res[i]
		reps[i] = CheckReport{Matrix: x.name, RatioBefore: r.RatioBefore, RatioAfter: r.RatioAfter,
			Iters: r.Iters, Resampled: r.Resampled, Reached: r.Reached}
		if !r.Resampled {
			continue
		}
		resampled = true
		c, err := lsp.CarryMoments(pOld, in.P, qOld[i], x.Q, x.state.M, x.state.V, carryRidge)
		if err != nil {
			return nil, fmt.Errorf("engine: carrying the moments of %s: %w", x.name, err)
		}
		reps[i].Change = c.Change
		if x.state.Step > 0 && st.rewarm.Large(c) {
			x.rewarmFrom, reps[i].Rewarm = e.step+1, true
		}
	}
	if resampled {
		if err := st.uploadP(in); err != nil {
			return nil, err
		}
		for _, x := range in.mats {
			if err := st.uploadQ(x); err != nil {
				return nil, err
			}
		}
	}
	secs := time.Since(t0).Seconds()
	for i := range reps {
		reps[i].Seconds = secs
	}
	return reps, nil
}
