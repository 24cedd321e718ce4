// LSP-Offload's matrix path (DESIGN.md section 2) inside the engine: the
// model's block matrices hand their input X and output gradient dY to this
// file's hooks instead of forming G = X^T dY. Matrices that read the same
// input (model.Matrix.Input) share P and A.
//
//	forward:  A = P^T X^T          (d x BT, kept; X is not)
//	backward: B = dY Q; S (+)= A B (d x d, fp32, summed over micro-batches)
//	d2h S -> host subspace Adam (d x d moments) -> Delta -> h2d into S's buffer
//	apply:    W <- (1 - lr wd) W + P Delta Q^T, stochastically rounded (bf16)
//
// The projector check (check.go) uses the same hooks in a calibration mode
// that forms one layer's full G at a time.
//
// Device memory per input: P by row and by column (2 m r int32 and as many
// float32, plus d+1 int32) and A (d BT fp32); per matrix: Q likewise (2 n r
// and 2 n r, plus d+1) and S (d^2 fp32); shared: B (BT dmax) and the
// apply's T (dmax nmax) workspaces.

package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/devfit"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// lspInput is one block input X (BT x m) that matrices read, with the
// projector P (m x d) and the compressed activation A = P^T X^T that the
// matrices reading it share (DESIGN.md section 2).
type lspInput struct {
	m, d, r int
	P       *lsp.Projector // host copy, the truth after every fit
	mats    []*lspMatrix   // the readers, in matrix order

	// Device storage: P by row (apply) and by column (compress), and A.
	pIdx, pColPtr, pRowIdx backend.Tensor // I32
	pVal, pColVal          backend.Tensor // F32
	A                      backend.Tensor // F32 [d,BT]

	gain []float32 // P's per-column gains (lsp.Projector.Gains), for Delta's rows
}

// lspMatrix is one block matrix W (m x n) and its projector Q.
type lspMatrix struct {
	name       string
	l, k       int
	id         uint32 // keys the stochastic rounding: l*(matrices per block)+k
	m, n, d, r int
	decay      bool
	w          backend.Tensor // the weight, a view of Params
	in         *lspInput      // P and A
	Q          *lsp.Projector // host copy, the truth after every fit

	// Device storage: Q by row (apply) and by column (compress), and S.
	qIdx, qColPtr, qRowIdx backend.Tensor // I32
	qVal, qColVal          backend.Tensor // F32
	S                      backend.Tensor // F32 [d,d]

	gain       []float32 // Q's per-column gains, for Delta's columns
	hostOff    int       // byte offset of S / Delta in the pinned buffer
	state      *host.AdamState
	rewarmFrom int // the step after the latest large subspace change (0: none)
}

// lspInputSizes are the element counts of one input's device storage (P
// and A), lspMatrixSizes those of one matrix's (Q and S).
func lspInputSizes(m, d, r, BT int) (ints, floats int) {
	return 2*m*r + (d + 1), 2*m*r + d*BT
}

func lspMatrixSizes(n, d, r int) (ints, floats int) {
	return 2*n*r + (d + 1), 2*n*r + d*d
}

type lspState struct {
	e      *Engine
	cfg    LSPConfig
	mats   [][]*lspMatrix // [layer][k]
	inputs [][]*lspInput  // [layer][input]
	ints   backend.Tensor // every projector's int32 storage
	floats backend.Tensor // every projector's values, A and S
	bWork  backend.Tensor // B = dY Q, [BT, dmax]
	tWork  backend.Tensor // the apply's T = Delta Q^T, [dmax, nmax]
	hostS  backend.HostBuffer
	rewarm lsp.Rewarm

	micro      int // the micro-batch being run (0: S is written, not accumulated)
	calibLayer int // >= 0: calibration mode for that layer (check.go)
	calib      *calibration
	fitReserve backend.Tensor  // the fit's device memory between checks (fitdev.go)
	fitStaging *devfit.Staging // the fits' pinned host staging (fitdev.go)
	layerNorm  []float64       // squared norm of the layer's S in the latest step
	// skipped[l]: the step's loss was not finite, so layer l's host Adam
	// left its moments alone and no Delta goes up (written by the host
	// node, read by the launcher after it); the apply skips on the device.
	skipped []bool
}

// lspDims is the capped d and r of every block matrix k: d = min(--d, m,
// n) over the matrices that share k's input (they share P, m x d), and r
// capped by d.
func lspDims(x *model.Index, c LSPConfig) (d, r []int) {
	d, r = make([]int, len(x.Mats)), make([]int, len(x.Mats))
	for _, readers := range x.Readers {
		dd := c.D
		for _, k := range readers {
			dd = lsp.CapD(dd, x.Mats[k].M, x.Mats[k].N)
		}
		for _, k := range readers {
			d[k], r[k] = dd, lsp.CapR(c.R, dd)
		}
	}
	return d, r
}

// lspCounts are the element counts of lsp mode's storage.
type lspCounts struct {
	ints, floats int // every projector (int32; float32), A and S
	dmax, nmax   int // the largest d and n: the workspaces are BT x dmax and dmax x nmax
	s2           int // the sum of d^2 over every matrix of every layer
}

func lspCount(x *model.Index, c LSPConfig, BT int) lspCounts {
	d, r := lspDims(x, c)
	L := len(x.Blocks)
	var n lspCounts
	for _, readers := range x.Readers {
		k := readers[0]
		i, f := lspInputSizes(x.Mats[k].M, d[k], r[k], BT)
		n.ints, n.floats = n.ints+L*i, n.floats+L*f
	}
	for k, mt := range x.Mats {
		i, f := lspMatrixSizes(mt.N, d[k], r[k])
		n.ints, n.floats = n.ints+L*i, n.floats+L*f
		n.dmax, n.nmax = max(n.dmax, d[k]), max(n.nmax, mt.N)
		n.s2 += L * d[k] * d[k]
	}
	return n
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
	if !(c.Ortho >= 0) || math.IsInf(c.Ortho, 0) {
		errs = append(errs, fmt.Errorf("--proj-ortho: %g, want finite and >= 0", c.Ortho))
	}
	c = c.withDefaults()
	if _, err := ParseRefit(string(c.Refit)); err != nil {
		errs = append(errs, fmt.Errorf("--refit: %w", err))
	}
	if _, err := ParseAccept(string(c.Accept)); err != nil {
		errs = append(errs, fmt.Errorf("--accept: %w", err))
	}
	if _, err := ParseRewarm(string(c.Rewarm)); err != nil {
		errs = append(errs, fmt.Errorf("--rewarm: %w", err))
	}
	return errors.Join(errs...)
}

func (st *lspState) init(e *Engine) error {
	st.e, st.cfg, st.calibLayer = e, e.cfg.LSP.withDefaults(), -1
	st.rewarm = lsp.DefaultRewarm()
	x, be := e.idx, e.be
	BT, L := e.b*e.t, len(x.Blocks)
	d, r := lspDims(x, st.cfg)
	n := lspCount(x, st.cfg, BT)
	var err error
	if st.ints, err = be.Alloc("lsp projector indices", n.ints, backend.I32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if st.floats, err = be.Alloc("lsp projectors, A and S", n.floats, backend.F32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if st.bWork, err = be.Alloc("lsp B workspace", BT*n.dmax, backend.F32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if st.tWork, err = be.Alloc("lsp apply workspace", n.dmax*n.nmax, backend.F32); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	ic, fc := &backend.Carver{T: st.ints}, &backend.Carver{T: st.floats}
	params := e.Model.Buffers().Params
	hostBytes := 0
	st.mats = make([][]*lspMatrix, L)
	st.inputs = make([][]*lspInput, L)
	st.layerNorm = make([]float64, L)
	st.skipped = make([]bool, L)
	for l := 0; l < L; l++ {
		st.inputs[l] = make([]*lspInput, x.Inputs)
		for k, mt := range x.Mats {
			pi := x.MatParam[l][k]
			p := x.Layout[pi]
			xm := &lspMatrix{name: p.Name, l: l, k: k, id: uint32(l*len(x.Mats) + k),
				m: mt.M, n: mt.N, d: d[k], r: r[k], decay: p.Decay, w: e.Model.ParamView(params, pi)}
			// P's storage comes with its first reader's, in the order
			// each matrix had its own P before inputs were shared.
			in := st.inputs[l][mt.Input]
			first := in == nil
			if first {
				in = &lspInput{m: mt.M, d: d[k], r: r[k]}
				st.inputs[l][mt.Input] = in
				in.pIdx, in.pColPtr, in.pRowIdx = ic.Next(mt.M*r[k]), ic.Next(d[k]+1), ic.Next(mt.M*r[k])
			}
			in.mats = append(in.mats, xm)
			xm.in = in
			xm.qIdx, xm.qColPtr, xm.qRowIdx = ic.Next(mt.N*r[k]), ic.Next(d[k]+1), ic.Next(mt.N*r[k])
			if first {
				in.pVal, in.pColVal = fc.Next(mt.M*r[k]), fc.Next(mt.M*r[k])
			}
			xm.qVal, xm.qColVal = fc.Next(mt.N*r[k]), fc.Next(mt.N*r[k])
			if first {
				in.A = fc.Next(d[k], BT)
			}
			xm.hostOff = hostBytes
			hostBytes += d[k] * d[k] * 4
			if !e.sizeOnly { // traced: the host nodes never run
				xm.state = host.NewAdamState(d[k] * d[k])
			}
			st.mats[l] = append(st.mats[l], xm)
		}
		// A layer's S follow each other, so that with several ranks one
		// collective sums them (layerS).
		for _, xm := range st.mats[l] {
			xm.S = fc.Next(xm.d, xm.d)
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
	if err := st.newFitStaging(); err != nil {
		return err
	}
	return st.reserveFit()
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
	st.fitStaging.Free(be)
	st.fitStaging = nil
	st.releaseFit()
}

// draw gives every matrix fresh random projectors and uploads them. Each
// matrix draws from a generator keyed by its id; an input's P is drawn
// from its first reader's, before that reader's Q.
func (st *lspState) draw() error {
	for _, row := range st.mats {
		for _, x := range row {
			rng := rand.New(rand.NewPCG(st.e.cfg.Seed, 0x15b0000+uint64(x.id)))
			var err error
			if x.in.mats[0] == x {
				if x.in.P, err = lsp.NewProjector(x.m, x.d, x.r, rng); err != nil {
					return fmt.Errorf("engine: projector P of %s: %w", x.name, err)
				}
				if err := st.uploadP(x.in); err != nil {
					return err
				}
			}
			if x.Q, err = lsp.NewProjector(x.n, x.d, x.r, rng); err != nil {
				return fmt.Errorf("engine: projector Q of %s: %w", x.name, err)
			}
			if err := st.uploadQ(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// uploadP copies an input's projector P (both storages) to the device.
func (st *lspState) uploadP(in *lspInput) error {
	in.gain = in.P.Gains()
	return st.upload(in.mats[0].name, in.P, in.pIdx, in.pColPtr, in.pRowIdx, in.pVal, in.pColVal)
}

// uploadQ copies a matrix's projector Q (both storages) to the device.
func (st *lspState) uploadQ(x *lspMatrix) error {
	x.gain = x.Q.Gains()
	return st.upload(x.name, x.Q, x.qIdx, x.qColPtr, x.qRowIdx, x.qVal, x.qColVal)
}

func (st *lspState) upload(name string, p *lsp.Projector, idx, colPtr, rowIdx, val, colVal backend.Tensor) error {
	be, s := st.e.be, st.e.st.Compute
	for _, u := range []struct {
		t backend.Tensor
		v []int32
	}{{idx, p.Idx}, {colPtr, p.ColPtr}, {rowIdx, p.RowIdx}} {
		if err := backend.UploadInt32(be, s, u.t, u.v); err != nil {
			return fmt.Errorf("engine: projectors of %s: %w", name, err)
		}
	}
	for _, u := range []struct {
		t backend.Tensor
		v []float32
	}{{val, p.Val}, {colVal, p.ColVal}} {
		if err := backend.Upload(be, s, u.t, u.v); err != nil {
			return fmt.Errorf("engine: projectors of %s: %w", name, err)
		}
	}
	return nil
}

// Input implements model.MatrixGrads: keep A = P^T X^T, once for the
// matrices that read X.
func (st *lspState) Input(s backend.Stream, l, in int, X backend.Tensor) error {
	if st.calibLayer >= 0 {
		return st.calib.input(s, l, in, X)
	}
	x := st.inputs[l][in]
	return st.e.be.SparseCompressA(s, x.A, X, x.pColPtr, x.pRowIdx, x.pColVal, st.e.b*st.e.t, x.m, x.d)
}

// OutputGrad implements model.MatrixGrads: S (+)= A (dY Q).
func (st *lspState) OutputGrad(s backend.Stream, l, k int, dY backend.Tensor) error {
	if st.calibLayer >= 0 {
		return st.calib.outputGrad(s, l, k, dY)
	}
	x := st.mats[l][k]
	be, BT := st.e.be, st.e.b*st.e.t
	b := st.bWork.Slice(0, BT*x.d, BT, x.d)
	if err := be.SparseCompressB(s, b, dY, x.qColPtr, x.qRowIdx, x.qColVal, BT, x.n, x.d); err != nil {
		return err
	}
	return be.SparseS(s, x.S, x.in.A, b, BT, x.d, st.micro > 0)
}

// lr is a matrix's learning rate at the current step, re-warmed after a
// large subspace change.
func (st *lspState) lr(x *lspMatrix, lr float64) float64 {
	if x.rewarmFrom == 0 {
		return lr
	}
	return lr * st.rewarm.Multiplier(st.e.step-x.rewarmFrom)
}

// addDown adds, per layer from the last, the copy of its S and the
// host Adam on them; it returns the Adam nodes by layer.
func (st *lspState) addDown(g *Graph, bwd []NodeID, lr float64) []NodeID {
	e := st.e
	adam := make([]NodeID, len(st.mats))
	for l := len(st.mats) - 1; l >= 0; l-- {
		l := l
		done := bwd[l]
		if e.dp.onDevice() {
			// Summed on the device first: the copy down copies the sum.
			done = e.deviceSum(g, fmt.Sprintf("all-reduce S %d", l), st.layerS(l), done)
		}
		d2h := g.Add(fmt.Sprintf("d2h S %d", l), D2H, func(s backend.Stream) error {
			for _, x := range st.mats[l] {
				if err := e.be.CopyD2H(s, st.hostS, x.hostOff, x.S); err != nil {
					return err
				}
			}
			return nil
		}, done)
		ready := d2h
		if e.dp != nil && !e.dp.onDevice() {
			// The layer's matrices are contiguous in hostS.
			first, last := st.mats[l][0], st.mats[l][len(st.mats[l])-1]
			off, n := first.hostOff, (last.hostOff-first.hostOff)/4+last.d*last.d
			name := fmt.Sprintf("all-reduce S %d", l)
			ready = e.dp.collective(g, name, n, func() error {
				return e.allReduceHost(name, st.hostS, off, n)
			}, d2h)
		}
		adam[l] = g.Add(fmt.Sprintf("host adam S %d", l), Host, func(backend.Stream) error {
			return st.adam(l, lr)
		}, ready)
		g.Nodes[adam[l]].Work = st.work(l)
	}
	return adam
}

// layerS is one layer's S as the device communicator sums them: one span
// (init carves them one after the other).
func (st *lspState) layerS(l int) []backend.Tensor {
	ts := make([]backend.Tensor, len(st.mats[l]))
	for i, x := range st.mats[l] {
		ts[i] = x.S
	}
	return spans(ts)
}

// work is one layer's subspace Adam: S pre-scanned, moments read and
// written, Delta written in place, and the gains' pass over Delta (read
// and written) unless --no-gain.
func (st *lspState) work(l int) HostWork {
	w := HostWork{Tensors: int64(len(st.mats[l]))}
	per := int64(host.AdamBytesPerElement(4, true, false, true))
	if !st.cfg.NoGain {
		per += 8
	}
	for _, x := range st.mats[l] {
		w.Elems += int64(x.d * x.d)
	}
	w.Bytes = w.Elems * per
	return w
}

// addUp adds, per layer from the last, the copy of its Deltas and the apply.
func (st *lspState) addUp(g *Graph, adam []NodeID, lr float64) {
	e := st.e
	for l := len(st.mats) - 1; l >= 0; l-- {
		l := l
		h2d := g.Add(fmt.Sprintf("h2d Delta %d", l), H2D, func(s backend.Stream) error {
			if st.skipped[l] {
				return nil // no Delta: the apply skips on the device flag
			}
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

// adam runs subspace Adam on one layer's S, in place: S becomes Delta; on
// a step whose loss is not finite it does nothing, so the subspace moments
// and step counts stay as they are.
func (st *lspState) adam(l int, lr float64) error {
	e := st.e
	if st.skipped[l] = e.hostSkip(fmt.Sprintf("host adam S %d", l)); st.skipped[l] {
		return nil
	}
	var rs []backend.Range
	for _, x := range st.mats[l] {
		rs = append(rs, hostRange(st.hostS, x.hostOff, x.d*x.d*4))
	}
	e.hostAccess(fmt.Sprintf("host adam S %d", l), rs, rs)
	all := st.hostS.Float32()
	ts := make([]host.AdamTensor, 0, len(st.mats[l]))
	for _, x := range st.mats[l] {
		// Weight decay is the apply's (on W), not the subspace Adam's.
		s := all[x.hostOff/4 : x.hostOff/4+x.d*x.d]
		ts = append(ts, host.AdamSubspace(x.name, s, x.state, e.cfg.Hyper.HostParams(st.lr(x, lr), false)))
	}
	res, err := e.workers.AdamStep(ts)
	if err != nil {
		return err
	}
	st.layerNorm[l] = 0
	for i, r := range res.Tensors {
		x := st.mats[l][i]
		delta := all[x.hostOff/4 : x.hostOff/4+x.d*x.d]
		if r.Skipped {
			// Nothing was written: make Delta zero so the apply only decays.
			clear(delta)
		} else if !st.cfg.NoGain {
			applyGains(delta, x.in.gain, x.gain)
		}
		st.layerNorm[l] += r.Norm * r.Norm
	}
	return nil
}

// applyGains scales Delta[a,b] (d x d) by gp[a] gq[b]: the update of the
// projectors with every column rescaled to a random one's squared norm
// (lsp.Projector.Gains), so that fitting does not shrink it.
func applyGains(delta, gp, gq []float32) {
	d := len(gp)
	for a, ga := range gp {
		row := delta[a*d : (a+1)*d]
		for b, gb := range gq {
			row[b] *= ga * gb
		}
	}
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
		err := e.be.SparseApply(s, x.w, st.tWork.Slice(0, x.d*x.n, x.d, x.n), x.S, x.in.pIdx, x.in.pVal, x.qIdx, x.qVal,
			e.skipFlag, x.m, x.n, x.d, x.r, float32(xlr), wd, e.cfg.Seed, uint64(e.step), x.id)
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
