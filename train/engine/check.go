// The projector check of lsp mode (DESIGN.md section 2, "Learning the
// projectors"): before step 1 and every --check-every steps, a calibration
// pass forms the full gradient G of one layer's four matrices at a time
// (that layer's forward keeps its inputs X; G = X^T dY), the host measures
// each matrix's bias ratio and refits the projectors that exceed alpha,
// carries the subspace Adam moments into the new subspace and re-warms the
// learning rate after a large change.
//
// Limits: the calibration runs L forward and backward passes per
// micro-batch (one per layer) so that only one layer's G (12 C^2 fp32) and
// inputs (7 C per token) are on the device at a time; the fit itself runs
// in float64 on the host (train/lsp).

package engine

import (
	"fmt"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// carryRidge regularises the d x d solves of the moment carry-over; the
// Gram diagonals it is added to are about m/d >= 1.
const carryRidge = 1e-6

// CheckReport is one matrix's projector check, for metrics.jsonl.
type CheckReport struct {
	Step        int     // optimizer steps taken before the check
	Matrix      string  // the parameter name
	RatioBefore float64 // bias ratio of the projectors in use
	RatioAfter  float64 // bias ratio of the projectors kept
	Iters       int     // Adam steps of the fit
	Resampled   bool    // new projectors were drawn and fitted
	Reached     bool    // RatioAfter <= alpha
	Change      float64 // subspace change of the moment carry-over (0: unchanged)
	Rewarm      bool    // the learning rate of the matrix is re-warmed
	Seconds     float64 // wall time of the fit
}

// calibration holds one layer's inputs and full gradients.
type calibration struct {
	e    *Engine
	x, g [gpt2.NumMatrices]backend.Tensor
	bufs []backend.Tensor
}

// calibrationBytes is the device memory of the calibration buffers.
func calibrationBytes(mc gpt2.Config, BT int, dt backend.DType) int64 {
	var b int64
	for k := gpt2.Matrix(0); k < gpt2.NumMatrices; k++ {
		m, n := mc.MatrixShape(k)
		b += int64(BT*m)*int64(dt.Size()) + int64(m*n)*4
	}
	return b
}

func newCalibration(e *Engine) (*calibration, error) {
	m := e.Model
	c := &calibration{e: e}
	BT := m.B * m.T
	for k := gpt2.Matrix(0); k < gpt2.NumMatrices; k++ {
		mm, nn := m.Cfg.MatrixShape(k)
		x, err := e.be.Alloc("calibration input "+k.String(), BT*mm, m.DType)
		if err != nil {
			c.free()
			return nil, fmt.Errorf("engine: %w", err)
		}
		c.bufs = append(c.bufs, x)
		g, err := e.be.Alloc("calibration gradient "+k.String(), mm*nn, backend.F32)
		if err != nil {
			c.free()
			return nil, fmt.Errorf("engine: %w", err)
		}
		c.bufs = append(c.bufs, g)
		c.x[k], c.g[k] = x.Reshape(BT, mm), g.Reshape(mm, nn)
	}
	return c, nil
}

func (c *calibration) free() {
	for _, t := range c.bufs {
		c.e.be.Free(t)
	}
	c.bufs = nil
}

func (c *calibration) input(s backend.Stream, l int, k gpt2.Matrix, X backend.Tensor) error {
	if l != c.e.lsp.calibLayer {
		return nil
	}
	return c.e.be.CopyD2D(s, c.x[k], X)
}

func (c *calibration) outputGrad(s backend.Stream, l int, k gpt2.Matrix, dY backend.Tensor) error {
	if l != c.e.lsp.calibLayer {
		return nil
	}
	m := c.e.Model
	mm, nn := m.Cfg.MatrixShape(k)
	return c.e.be.Gemm(s, true, false, mm, nn, m.B*m.T, 1, c.x[k], dY, 1, c.g[k])
}

// CheckDue reports whether the projectors are checked before the next step.
func (e *Engine) CheckDue() bool {
	if e.lsp == nil || e.lsp.calib == nil {
		return false
	}
	return e.step == 0 || e.step%e.cfg.LSP.CheckEvery == 0
}

// CalibBatches is the number of micro-batches Check wants.
func (e *Engine) CalibBatches() int {
	return (e.cfg.LSP.CalibSamples + e.Model.B - 1) / e.Model.B
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
	m, be, s := e.Model, e.be, e.st.Compute
	var reports []CheckReport
	for l := 0; l < m.Cfg.L; l++ {
		st.calibLayer = l
		for _, g := range st.calib.g {
			if err := be.Fill(s, g, 0); err != nil {
				return nil, err
			}
		}
		for _, b := range batches {
			if err := backend.UploadInt32(be, s, m.Inputs, b.Inputs); err != nil {
				return nil, err
			}
			if err := backend.UploadInt32(be, s, m.Targets, b.Targets); err != nil {
				return nil, err
			}
			err := chain(
				func() error { return m.Forward(s) },
				func() error { return m.CrossEntropy(s, 1/float32(targets)) },
				func() error { return m.Backward(s) },
			)
			if err != nil {
				return nil, fmt.Errorf("engine: calibration pass of layer %d: %w", l, err)
			}
		}
		for k, x := range st.mats[l] {
			G, err := backend.Download(be, s, st.calib.g[k])
			if err != nil {
				return nil, err
			}
			r, err := st.fit(x, G)
			if err != nil {
				return nil, err
			}
			reports = append(reports, r)
		}
	}
	return reports, nil
}

// fit checks one matrix against its calibration gradient.
func (st *lspState) fit(x *lspMatrix, G []float32) (CheckReport, error) {
	e := st.e
	t0 := time.Now()
	pOld, qOld := x.P.Clone(), x.Q.Clone()
	opts := lsp.FitOptions{LR: st.cfg.ProjLR, MaxIters: st.cfg.FitIters,
		Seed: e.cfg.Seed ^ uint64(e.step)<<20 ^ uint64(x.id)<<8}
	res, err := lsp.Fit(x.P, x.Q, G, st.cfg.Alpha, opts)
	if err != nil {
		return CheckReport{}, fmt.Errorf("engine: fitting the projectors of %s: %w", x.name, err)
	}
	rep := CheckReport{Step: e.step, Matrix: x.name, RatioBefore: res.RatioBefore, RatioAfter: res.RatioAfter,
		Iters: res.Iters, Resampled: res.Resampled, Reached: res.Reached}
	if res.Resampled {
		c, err := lsp.CarryMoments(pOld, x.P, qOld, x.Q, x.state.M, x.state.V, carryRidge)
		if err != nil {
			return CheckReport{}, fmt.Errorf("engine: carrying the moments of %s: %w", x.name, err)
		}
		rep.Change = c.Change
		if x.state.Step > 0 && st.rewarm.Large(c) {
			x.rewarmFrom, rep.Rewarm = e.step+1, true
		}
		if err := st.upload(x); err != nil {
			return CheckReport{}, err
		}
	}
	rep.Seconds = time.Since(t0).Seconds()
	return rep, nil
}

// chain runs steps in order and stops at the first error.
func chain(steps ...func() error) error {
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
