// LSP-Offload's matrix path (DESIGN.md section 2) inside the engine: the
// model's four block matrices hand their input X and output gradient dY to
// this file's hooks instead of forming G = X^T dY.
//
//	forward:  A = P^T X^T          (d x BT, kept; X is not)
//	backward: B = dY Q; S (+)= A B (d x d, fp32, summed over micro-batches)
//	d2h S -> host subspace Adam (d x d moments) -> Delta -> h2d into S's buffer
//	apply:    W <- (1 - lr wd) W + P Delta Q^T, stochastically rounded (bf16)
//
// The projector check (check.go) uses the same hooks in a calibration mode
// that forms one layer's full G at a time.
//
// Device memory per matrix: projectors by row and by column (2 m r + 2 n r
// int32 and as many float32, plus 2 (d+1) int32), A (d BT fp32) and S (d^2
// fp32); shared: B (BT dmax) and the apply's T (dmax nmax) workspaces.

package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// lspMatrix is one block matrix W (m x n) and its projectors.
type lspMatrix struct {
	name       string
	l          int
	k          gpt2.Matrix
	id         uint32 // keys the stochastic rounding
	m, n, d, r int
	decay      bool
	w          backend.Tensor // the weight, a view of Params
	P, Q       *lsp.Projector // host copies, the truth after every fit

	// Device storage: P and Q by row (apply) and by column (compress).
	pIdx, pColPtr, pRowIdx, qIdx, qColPtr, qRowIdx backend.Tensor // I32
	pVal, pColVal, qVal, qColVal                   backend.Tensor // F32
	A, S                                           backend.Tensor // F32 [d,BT], [d,d]

	hostOff    int // byte offset of S / Delta in the pinned buffer
	state      *host.AdamState
	rewarmFrom int // the step after the latest large subspace change (0: none)
}

// lspSizes are the element counts of one matrix's device storage.
func lspSizes(m, n, d, r, BT int) (ints, floats int) {
	ints = 2*m*r + 2*n*r + 2*(d+1)
	floats = 2*m*r + 2*n*r + d*BT + d*d
	return ints, floats
}

type lspState struct {
	e      *Engine
	cfg    LSPConfig
	mats   [][gpt2.NumMatrices]*lspMatrix
	ints   backend.Tensor // every projector's int32 storage
	floats backend.Tensor // every projector's values, A and S
	bWork  backend.Tensor // B = dY Q, [BT, dmax]
	tWork  backend.Tensor // the apply's T = Delta Q^T, [dmax, nmax]
	hostS  backend.HostBuffer
	rewarm lsp.Rewarm

	micro      int // the micro-batch being run (0: S is written, not accumulated)
	calibLayer int // >= 0: calibration mode for that layer (check.go)
	calib      *calibration
	layerNorm  []float64 // squared norm of the layer's S in the latest step
}

// matrixDims is the capped d and r of every block matrix of mc.
func matrixDims(mc gpt2.Config, c LSPConfig, k gpt2.Matrix) (m, n, d, r int) {
	m, n = mc.MatrixShape(k)
	d = lsp.CapD(c.D, m, n)
	r = lsp.CapR(c.R, d)
	return m, n, d, r
}

// checkLSP validates the LSP flags.
func checkLSP(c LSPConfig) error {
	errs := []error{lsp.CheckFlags(c.D, c.R, c.Alpha, c.CheckEvery)}
	if c.CalibSamples < 1 {
		errs = append(errs, fmt.Errorf("--calib-samples: %d, want at least 1", c.CalibSamples))
	}
	if !(c.ProjLR > 0) {
		errs = append(errs, fmt.Errorf("--proj-lr: %g, want > 0", c.ProjLR))
	}
	if c.FitIters < 0 {
		errs = append(errs, fmt.Errorf("--fit-iters: %d, want >= 0", c.FitIters))
	}
	return errors.Join(errs...)
}

func (st *lspState) init(e *Engine) error {
	st.e, st.cfg, st.calibLayer = e, e.cfg.LSP, -1
	st.rewarm = lsp.DefaultRewarm()
	m, be := e.Model, e.be
	mc, BT := m.Cfg, m.B*m.T
	var nInts, nFloats, dmax, nmax int
	for k := gpt2.Matrix(0); k < gpt2.NumMatrices; k++ {
		mm, nn, d, r := matrixDims(mc, st.cfg, k)
		i, f := lspSizes(mm, nn, d, r, BT)
		nInts += mc.L * i
		nFloats += mc.L * f
		dmax, nmax = max(dmax, d), max(nmax, nn)
	}
	var err error
	if st.ints, err = be.Alloc("lsp projector indices", nInts, backend.I32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if st.floats, err = be.Alloc("lsp projectors, A and S", nFloats, backend.F32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if st.bWork, err = be.Alloc("lsp B workspace", BT*dmax, backend.F32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if st.tWork, err = be.Alloc("lsp apply workspace", dmax*nmax, backend.F32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	ic, fc := &backend.Carver{T: st.ints}, &backend.Carver{T: st.floats}
	hostBytes := 0
	st.mats = make([][gpt2.NumMatrices]*lspMatrix, mc.L)
	st.layerNorm = make([]float64, mc.L)
	for l := 0; l < mc.L; l++ {
		for k := gpt2.Matrix(0); k < gpt2.NumMatrices; k++ {
			mm, nn, d, r := matrixDims(mc, st.cfg, k)
			pi := mc.MatrixParam(l, k)
			p := m.Layout()[pi]
			x := &lspMatrix{name: p.Name, l: l, k: k, id: uint32(l*gpt2.NumMatrices + int(k)),
				m: mm, n: nn, d: d, r: r, decay: p.Decay, w: m.ParamView(m.Params, pi)}
			x.pIdx, x.pColPtr, x.pRowIdx = ic.Next(mm*r), ic.Next(d+1), ic.Next(mm*r)
			x.qIdx, x.qColPtr, x.qRowIdx = ic.Next(nn*r), ic.Next(d+1), ic.Next(nn*r)
			x.pVal, x.pColVal, x.qVal, x.qColVal = fc.Next(mm*r), fc.Next(mm*r), fc.Next(nn*r), fc.Next(nn*r)
			x.A, x.S = fc.Next(d, BT), fc.Next(d, d)
			x.hostOff = hostBytes
			hostBytes += d * d * 4
			x.state = host.NewAdamState(d * d)
			st.mats[l][k] = x
		}
	}
	if st.hostS, err = be.AllocHost("lsp S and Delta", hostBytes); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if !st.cfg.NoFit {
		if st.calib, err = newCalibration(e); err != nil {
			return err
		}
	}
	return nil
}

func (st *lspState) free() {
	be := st.e.be
	for _, t := range []backend.Tensor{st.ints, st.floats, st.bWork, st.tWork} {
		if t.Buf != nil {
			be.Free(t)
		}
	}
	if st.hostS != nil {
		be.FreeHost(st.hostS)
	}
	if st.calib != nil {
		st.calib.free()
	}
}

// draw gives every matrix fresh random projectors (seeded per matrix) and
// uploads them.
func (st *lspState) draw() error {
	for _, row := range st.mats {
		for _, x := range row {
			rng := rand.New(rand.NewPCG(st.e.cfg.Seed, 0x15b0000+uint64(x.id)))
			var err error
			if x.P, err = lsp.NewProjector(x.m, x.d, x.r, rng); err != nil {
				return fmt.Errorf("engine: projector P of %s: %w", x.name, err)
			}
			if x.Q, err = lsp.NewProjector(x.n, x.d, x.r, rng); err != nil {
				return fmt.Errorf("engine: projector Q of %s: %w", x.name, err)
			}
			if err := st.upload(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// upload copies a matrix's projectors (both storages) to the device.
func (st *lspState) upload(x *lspMatrix) error {
	be, s := st.e.be, st.e.st.Compute
	for _, u := range []struct {
		t backend.Tensor
		v []int32
	}{{x.pIdx, x.P.Idx}, {x.pColPtr, x.P.ColPtr}, {x.pRowIdx, x.P.RowIdx},
		{x.qIdx, x.Q.Idx}, {x.qColPtr, x.Q.ColPtr}, {x.qRowIdx, x.Q.RowIdx}} {
		if err := backend.UploadInt32(be, s, u.t, u.v); err != nil {
			return fmt.Errorf("engine: projectors of %s: %w", x.name, err)
		}
	}
	for _, u := range []struct {
		t backend.Tensor
		v []float32
	}{{x.pVal, x.P.Val}, {x.pColVal, x.P.ColVal}, {x.qVal, x.Q.Val}, {x.qColVal, x.Q.ColVal}} {
		if err := backend.Upload(be, s, u.t, u.v); err != nil {
			return fmt.Errorf("engine: projectors of %s: %w", x.name, err)
		}
	}
	return nil
}

// Input implements gpt2.MatrixGrads: keep A = P^T X^T.
func (st *lspState) Input(s backend.Stream, l int, k gpt2.Matrix, X backend.Tensor) error {
	if st.calibLayer >= 0 {
		return st.calib.input(s, l, k, X)
	}
	x := st.mats[l][k]
	m := st.e.Model
	return st.e.be.SparseCompressA(s, x.A, X, x.pColPtr, x.pRowIdx, x.pColVal, m.B*m.T, x.m, x.d)
}

// OutputGrad implements gpt2.MatrixGrads: S (+)= A (dY Q).
func (st *lspState) OutputGrad(s backend.Stream, l int, k gpt2.Matrix, dY backend.Tensor) error {
	if st.calibLayer >= 0 {
		return st.calib.outputGrad(s, l, k, dY)
	}
	x := st.mats[l][k]
	be, m := st.e.be, st.e.Model
	BT := m.B * m.T
	b := st.bWork.Slice(0, BT*x.d, BT, x.d)
	if err := be.SparseCompressB(s, b, dY, x.qColPtr, x.qRowIdx, x.qColVal, BT, x.n, x.d); err != nil {
		return err
	}
	return be.SparseS(s, x.S, x.A, b, BT, x.d, st.micro > 0)
}

// lr is a matrix's learning rate at the current step, re-warmed after a
// large subspace change.
func (st *lspState) lr(x *lspMatrix, lr float64) float64 {
	if x.rewarmFrom == 0 {
		return lr
	}
	return lr * st.rewarm.Multiplier(st.e.step-x.rewarmFrom)
}

// addDown adds, per layer from the last, the copy of its four S and the
// host Adam on them; it returns the Adam nodes by layer.
func (st *lspState) addDown(g *Graph, bwd []NodeID, lr float64) []NodeID {
	e := st.e
	adam := make([]NodeID, len(st.mats))
	for l := len(st.mats) - 1; l >= 0; l-- {
		l := l
		d2h := g.Add(fmt.Sprintf("d2h S %d", l), D2H, func(s backend.Stream) error {
			for _, x := range st.mats[l] {
				if err := e.be.CopyD2H(s, st.hostS, x.hostOff, x.S); err != nil {
					return err
				}
			}
			return nil
		}, bwd[l])
		adam[l] = g.Add(fmt.Sprintf("host adam S %d", l), Host, func(backend.Stream) error {
			return st.adam(l, lr)
		}, d2h)
	}
	return adam
}

// addUp adds, per layer from the last, the copy of its Deltas and the apply.
func (st *lspState) addUp(g *Graph, adam []NodeID, lr float64) {
	e := st.e
	for l := len(st.mats) - 1; l >= 0; l-- {
		l := l
		h2d := g.Add(fmt.Sprintf("h2d Delta %d", l), H2D, func(s backend.Stream) error {
			for _, x := range st.mats[l] {
				if err := e.be.CopyH2D(s, x.S, st.hostS, x.hostOff); err != nil {
					return err
				}
			}
			return nil
		}, adam[l])
		g.Add(fmt.Sprintf("apply %d", l), Compute, func(s backend.Stream) error {
			return st.apply(s, l, lr)
		}, h2d)
	}
}

// adam runs subspace Adam on one layer's S, in place: S becomes Delta.
func (st *lspState) adam(l int, lr float64) error {
	e := st.e
	var rs []backend.Range
	for _, x := range st.mats[l] {
		rs = append(rs, hostRange(st.hostS, x.hostOff, x.d*x.d*4))
	}
	e.hostAccess(fmt.Sprintf("host adam S %d", l), rs, rs)
	h := e.cfg.Hyper
	all := st.hostS.Float32()
	ts := make([]host.AdamTensor, 0, gpt2.NumMatrices)
	for _, x := range st.mats[l] {
		p := host.AdamParams{LR: st.lr(x, lr), Beta1: float64(h.Beta1), Beta2: float64(h.Beta2), Eps: float64(h.Eps)}
		if h.Clip == optim.ClipMatrix {
			p.ClipNorm = float64(h.MaxNorm)
		}
		s := all[x.hostOff/4 : x.hostOff/4+x.d*x.d]
		ts = append(ts, host.AdamSubspace(x.name, s, x.state, p))
	}
	res, err := e.workers.AdamStep(ts)
	if err != nil {
		return err
	}
	st.layerNorm[l] = 0
	for i, r := range res.Tensors {
		if r.Skipped {
			// Nothing was written: make Delta zero so the apply only decays.
			x := st.mats[l][i]
			clear(all[x.hostOff/4 : x.hostOff/4+x.d*x.d])
		}
		st.layerNorm[l] += r.Norm * r.Norm
	}
	return nil
}

// apply enqueues W <- (1 - lr wd) W + P Delta Q^T for one layer.
func (st *lspState) apply(s backend.Stream, l int, lr float64) error {
	e := st.e
	for _, x := range st.mats[l] {
		xlr := st.lr(x, lr)
		wd := float32(0)
		if x.decay {
			wd = e.cfg.Hyper.WeightDecay
		}
		err := e.be.SparseApply(s, x.w, st.tWork.Slice(0, x.d*x.n, x.d, x.n), x.S, x.pIdx, x.pVal, x.qIdx, x.qVal,
			x.m, x.n, x.d, x.r, float32(xlr), wd, e.cfg.Seed, uint64(e.step), x.id)
		if err != nil {
			return fmt.Errorf("apply %s: %w", x.name, err)
		}
	}
	return nil
}

// stepNormSq sums the layers' squared S norms of the latest step.
func (st *lspState) stepNormSq() float64 {
	var s float64
	for _, v := range st.layerNorm {
		s += v
	}
	return s
}
