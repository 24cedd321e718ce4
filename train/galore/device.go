// GaLore on a Backend: the engine's --mode galore (docs/DESIGN.md,
// "GaLore"). Device is the model's model.Adapters with no forward term:
// the model keeps each block matrix frozen (no dense gradient) and hands
// its input X [BT, m] and output gradient dY [BT, n] to Backward, which
//
//	G = X^T dY                    m x n, one matrix at a time, in a single
//	                              workspace of the largest matrix
//	refresh (when due):           P = top-r singular vectors of G on the
//	                              matrix's side (train/rsvd, through the
//	                              backend's GEMMs), moments kept
//	R (+)= P^T G   or   G Q       the projected gradient (DenseGemm, fp32),
//	                              summed over the step's micro-batches
//
// and, in the step's last micro-batch, right away (the block's backward is
// the last reader of its weights in the step):
//
//	Z = -AdamW direction of R     the device AdamW on a zeroed Z, lr 1, with
//	                              eps / sqrt(1 - b2^t), which is galore-torch's
//	                              eps outside the bias correction
//	W <- (1 - lr wd) (W + lr s P Z)   (or Z Q^T): DenseApply, bf16 W by
//	                              stochastic rounding
//
// So the device never holds more than one matrix's full gradient; the
// state per matrix is P and R, M, V of the projected size (fp32). This
// is galore-torch 1.0's GaLoreAdamW step (Update) with three differences,
// each said where it is made: the SVD is the randomized one (rsvd: the
// top-r subspace to within its stated angles, not LAPACK's), a refresh at
// a step of several micro-batches uses the first micro-batch's gradient
// (the full step's is never whole on the device), and --clip-mode matrix
// clips each matrix's projected gradient R by its own norm (the full
// gradient's norm is never formed).
//
// Limits: one rank; a refresh synchronizes the stream (rsvd reads its
// Grams back), so refresh steps do not overlap their host work.

package galore

import (
	"errors"
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/rsvd"
)

// Matrix is one block matrix's GaLore state on the device.
type Matrix struct {
	Name     string
	L, K     int
	ID       uint32 // keys the stochastic rounding and the refresh's draw
	In, Out  int    // W is In x Out (our layout)
	Side     Side
	R        int
	Decay    bool
	P        backend.Tensor // F32, In x R (ProjectIn) or Out x R (ProjectOut)
	Grad     backend.Tensor // F32 projected gradient: R x Out or In x R (scratch of the step)
	M, V     backend.Tensor // F32 Adam moments, Grad's shape
	W        backend.Tensor // the weight, a view of the model's parameters (Bind)
	hasP     bool
	retry    bool // its gradient was zero at its refresh: refresh at the next step
	projRows int  // Grad's rows
}

// projSize is the elements of the projected gradient.
func (x *Matrix) projSize() int {
	if x.Side == ProjectIn {
		return x.R * x.Out
	}
	return x.In * x.R
}

// pRows is the projector's rows: the projected side.
func (x *Matrix) pRows() int {
	if x.Side == ProjectIn {
		return x.In
	}
	return x.Out
}

// Device is GaLore's state for one model (see the file header).
type Device struct {
	Cfg  Config
	Mats [][]*Matrix // [layer][k]
	// T is the steps taken, galore-torch's state["step"] (every matrix
	// steps together): a refresh is due when T % Every == 0.
	T int

	be    backend.Backend
	hyper optim.Hyper
	seed  uint64
	rows  int            // the largest BT a call may have
	state backend.Tensor // every P, then every M, then every V (State)
	grads backend.Tensor // every projected gradient
	g     backend.Tensor // G, the largest matrix's m x n in the model dtype
	z     backend.Tensor // the Adam direction, the largest projected size
	other backend.Tensor // the refresh's unused singular vectors
	norm  backend.Tensor // F32 [1]: a projected gradient's squared norm
	work  backend.Tensor // SumSquares' scratch
	svd   map[[2]int]*rsvd.Workspace
	skip  backend.Tensor

	// The step being run (Begin, SetMicro).
	micro, accum int
	lr           float64
	srStep       uint64
	due          bool
	// refreshH2D is what the step's refreshes copied to the device
	// (rsvd's random matrix and factors), RefreshUploads.
	refreshH2D int64
}

var _ model.Adapters = (*Device)(nil)

// Layout is the sizes of a Device: what New allocates, for the memory
// plan.
type Layout struct {
	State, Grads, G, Z, Other int // elements: fp32, fp32, dt, fp32, fp32
	SVD                       [][2]int
}

// layout walks idx's matrices as New lays them out.
func layout(idx *model.Index, cfg Config, each func(l, k int, x *Matrix)) Layout {
	var lay Layout
	seen := map[[2]int]bool{}
	for l := range idx.MatParam {
		for k, mt := range idx.Mats {
			x := &Matrix{L: l, K: k, In: mt.M, Out: mt.N, Side: SideOf(mt.M, mt.N), R: cfg.RankOf(mt.M, mt.N)}
			x.projRows = x.R
			if x.Side == ProjectOut {
				x.projRows = x.In
			}
			if each != nil {
				each(l, k, x)
			}
			lay.State += x.pRows()*x.R + 2*x.projSize()
			lay.Grads += x.projSize()
			lay.G = max(lay.G, x.In*x.Out)
			lay.Z = max(lay.Z, x.projSize())
			// rsvd writes both factors: P takes one, Other the other.
			lay.Other = max(lay.Other, (x.In+x.Out-x.pRows())*x.R)
			if sh := [2]int{x.In, x.Out}; !seen[sh] {
				seen[sh] = true
				lay.SVD = append(lay.SVD, sh)
			}
		}
	}
	return lay
}

// StateSizes is the elements of State's arrays for idx's matrices: the
// projectors', and each moment's.
func StateSizes(idx *model.Index, cfg Config) (p, moment int) {
	layout(idx, cfg, func(_, _ int, x *Matrix) { p, moment = p+x.pRows()*x.R, moment+x.projSize() })
	return p, moment
}

// Bytes predicts the device bytes New allocates for idx's matrices with
// gradients of dt (the model dtype): the state, the workspaces and one
// randomized-SVD workspace per matrix shape.
func Bytes(idx *model.Index, cfg Config, dt backend.DType) int64 {
	lay := layout(idx, cfg, nil)
	n := 4*int64(lay.State+lay.Grads+lay.Z+lay.Other+1) + int64(lay.G)*int64(dt.Size()) + 8*int64(backend.SumSquaresWork)
	for _, sh := range lay.SVD {
		n += rsvd.WorkspaceBytes(sh[0], sh[1], cfg.RankOf(sh[0], sh[1]), rsvd.DefaultOversample, dt)
	}
	return n
}

// New allocates GaLore's state for idx's block matrices on be, for calls
// of up to rows rows of the model dtype dt. Bind the weights once the
// model exists.
func New(be backend.Backend, idx *model.Index, cfg Config, h optim.Hyper, seed uint64, rows int, dt backend.DType) (*Device, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Device{Cfg: cfg, be: be, hyper: h, seed: seed, rows: rows, accum: 1, svd: map[[2]int]*rsvd.Workspace{}}
	d.Mats = make([][]*Matrix, len(idx.MatParam))
	lay := layout(idx, cfg, func(l, k int, x *Matrix) {
		p := idx.Layout[idx.MatParam[l][k]]
		x.Name, x.ID, x.Decay = p.Name, uint32(l*len(idx.Mats)+k), p.Decay
		d.Mats[l] = append(d.Mats[l], x)
	})
	ok := false
	defer func() {
		if !ok {
			d.Free()
		}
	}()
	var err error
	for _, a := range []struct {
		t    *backend.Tensor
		name string
		n    int
		dt   backend.DType
	}{
		{&d.state, "galore projectors and moments", lay.State, backend.F32},
		{&d.grads, "galore projected gradients", lay.Grads, backend.F32},
		{&d.g, "galore gradient", lay.G, dt},
		{&d.z, "galore direction", lay.Z, backend.F32},
		{&d.other, "galore svd factor", lay.Other, backend.F32},
		{&d.norm, "galore norm", 1, backend.F32},
		{&d.work, "galore norm scratch", backend.SumSquaresWork, backend.F64},
	} {
		if *a.t, err = be.Alloc(a.name, a.n, a.dt); err != nil {
			return nil, fmt.Errorf("galore: %w", err)
		}
	}
	// Every P, then every M, then every V: a checkpoint saves them as
	// three arrays.
	c, gc := &backend.Carver{T: d.state}, &backend.Carver{T: d.grads}
	for _, field := range []func(x *Matrix){
		func(x *Matrix) { x.P = c.Next(x.pRows(), x.R) },
		func(x *Matrix) { x.M = c.Next(x.projSize()) },
		func(x *Matrix) { x.V = c.Next(x.projSize()) },
		func(x *Matrix) { x.Grad = gc.Next(x.projRows, x.projSize()/x.projRows) },
	} {
		for _, row := range d.Mats {
			for _, x := range row {
				field(x)
			}
		}
	}
	if err := be.Fill(be.DefaultStream(), d.state, 0); err != nil {
		return nil, fmt.Errorf("galore: %w", err)
	}
	for _, sh := range lay.SVD {
		w, err := rsvd.NewWorkspace(be, sh[0], sh[1], cfg.RankOf(sh[0], sh[1]), rsvd.DefaultOversample, dt)
		if err != nil {
			return nil, fmt.Errorf("galore: svd workspace of %d x %d: %w", sh[0], sh[1], err)
		}
		d.svd[sh] = w
	}
	ok = true
	return d, nil
}

// Bind gives every matrix its weight: weight(l, k) is the view of matrix
// k of block l in the model's parameters; skip is the engine's non-finite
// flag of each step (F32 [1] on the device; nil Buf: none), which the
// updates read.
func (d *Device) Bind(weight func(l, k int) backend.Tensor, skip backend.Tensor) {
	d.skip = skip
	for _, row := range d.Mats {
		for _, x := range row {
			x.W = weight(x.L, x.K)
		}
	}
}

// Free releases the device storage.
func (d *Device) Free() {
	for _, t := range []backend.Tensor{d.state, d.grads, d.g, d.z, d.other, d.norm, d.work} {
		if t.Buf != nil {
			d.be.Free(t)
		}
	}
	for _, w := range d.svd {
		w.Free()
	}
	d.svd = nil
}

// Begin starts a step of accum micro-batches at learning rate lr; step
// (1-based, the run's) keys the stochastic rounding.
func (d *Device) Begin(step uint64, lr float64, accum int) {
	d.srStep, d.lr, d.accum = step, lr, accum
	d.due = d.T%d.Cfg.Every == 0
	d.T++
	d.refreshH2D = 0
}

// RefreshUploads is the bytes the latest step's refreshes copied to the
// device: the randomized SVDs' random matrices and small factors.
func (d *Device) RefreshUploads() int64 { return d.refreshH2D }

// Skipped takes back the latest step, which the device skipped: its
// moments and weights were left alone, and its refresh is due again.
func (d *Device) Skipped() { d.T-- }

// SetSteps restores the steps taken (a checkpoint's step count, which
// leaves out skipped steps as T does): after one or more steps every
// matrix has a projector, restored with State.
func (d *Device) SetSteps(n int) {
	d.T = n
	for _, row := range d.Mats {
		for _, x := range row {
			x.hasP = n > 0
		}
	}
}

// State is what a checkpoint saves (its step count is the engine's):
// every matrix's projector, then every first moment, then every second
// moment (F32 each), as the arrays "p", "m" and "v".
func (d *Device) State() (p, m, v backend.Tensor) {
	np, nm := 0, 0
	for _, row := range d.Mats {
		for _, x := range row {
			np, nm = np+x.P.Len(), nm+x.M.Len()
		}
	}
	return d.state.Slice(0, np), d.state.Slice(np, nm), d.state.Slice(np+nm, nm)
}

// SetMicro says which micro-batch of the step runs next.
func (d *Device) SetMicro(i int) { d.micro = i }

// Forward implements model.Adapters: GaLore adds no term.
func (d *Device) Forward(backend.Stream, int, int, backend.Tensor, backend.Tensor) error { return nil }

// Backward implements model.Adapters: matrix k of block l's gradient,
// projected and summed; in the last micro-batch its update, applied.
func (d *Device) Backward(s backend.Stream, l, k int, X, dY, _ backend.Tensor) error {
	x := d.Mats[l][k]
	BT := X.Len() / x.In
	if BT*x.In != X.Len() || BT*x.Out != dY.Len() || BT > d.rows {
		return fmt.Errorf("galore: %s: X %v and dY %v are not [BT, %d] and [BT, %d]", x.Name, X, dY, x.In, x.Out)
	}
	be := d.be
	G := d.g.Slice(0, x.In*x.Out, x.In, x.Out)
	if err := be.Gemm(s, true, false, x.In, x.Out, BT, 1, X, dY, 0, G); err != nil {
		return fmt.Errorf("galore: gradient of %s: %w", x.Name, err)
	}
	if (d.due || x.retry) && d.micro == 0 {
		if err := d.refresh(s, x, G); err != nil {
			return err
		}
	}
	beta := float32(1)
	if d.micro == 0 {
		beta = 0
	}
	var err error
	if x.Side == ProjectIn { // R [r, out] = P^T G
		err = be.DenseGemm(s, true, false, x.R, x.Out, x.In, 1, x.P, G, beta, x.Grad)
	} else { // R [in, r] = G Q
		err = be.DenseGemm(s, false, false, x.In, x.R, x.Out, 1, G, x.P, beta, x.Grad)
	}
	if err != nil {
		return fmt.Errorf("galore: projection of %s: %w", x.Name, err)
	}
	if d.micro == d.accum-1 {
		return d.update(s, x)
	}
	return nil
}

// refresh sets x's projector to G's top singular vectors on its side,
// unless G is not finite (a step whose loss is not finite is skipped
// after this micro-batch, and the refresh stays due): its norm is read
// back first, which costs nothing here, since rsvd synchronizes the
// stream anyway. (The step's non-finite flag is not known yet at its
// first micro-batch.)
func (d *Device) refresh(s backend.Stream, x *Matrix, G backend.Tensor) error {
	if err := d.be.SumSquares(s, d.norm, G, d.work); err != nil {
		return fmt.Errorf("galore: refresh of %s: %w", x.Name, err)
	}
	sq, err := backend.Download(d.be, s, d.norm)
	if err != nil {
		return fmt.Errorf("galore: refresh of %s: %w", x.Name, err)
	}
	switch {
	case math.IsNaN(float64(sq[0])) || math.IsInf(float64(sq[0]), 0):
		return nil
	case sq[0] == 0:
		// Nothing to find (weights that are all zero give zero
		// gradients): keep the subspace in use; with none yet (P zero,
		// so nothing moves) try again next step.
		x.retry = !x.hasP
		return nil
	}
	U, V := x.P, d.other.Slice(0, x.Out*x.R)
	if x.Side == ProjectOut {
		U, V = d.other.Slice(0, x.In*x.R), x.P
	}
	seed := d.seed ^ uint64(x.ID)<<32 ^ uint64(d.T)
	up := d.be.Traffic().H2D
	_, err = d.svd[[2]int{x.In, x.Out}].Compute(s, G, U, V, rsvd.DefaultPowerIters, seed)
	d.refreshH2D += d.be.Traffic().H2D - up
	switch {
	case errors.Is(err, rsvd.ErrRankDeficient):
		// G is zero: nothing to find. Keep the subspace in use; with
		// none yet (P zero, so nothing moves) try again next step.
		x.retry = !x.hasP
		return nil
	case err != nil:
		return fmt.Errorf("galore: refresh of %s: %w", x.Name, err)
	}
	x.hasP, x.retry = true, false
	return nil
}

// update runs AdamW in the projected space and applies the update.
func (d *Device) update(s backend.Stream, x *Matrix) error {
	be, h := d.be, d.hyper
	z := d.z.Slice(0, x.projSize())
	if err := be.Fill(s, z, 0); err != nil {
		return err
	}
	// On a zero parameter with lr 1 and no decay the device AdamW leaves
	// -(m/bc1) / (sqrt(v)/sqrt(bc2) + eps'); with eps' = eps/sqrt(bc2)
	// that is galore-torch's -(m / (sqrt(v) + eps)) sqrt(bc2) / bc1.
	bc2 := 1 - math.Pow(float64(h.Beta2), float64(d.T))
	p := backend.AdamParams{LR: 1, Beta1: h.Beta1, Beta2: h.Beta2, Eps: float32(float64(h.Eps) / math.Sqrt(bc2)), Step: d.T}
	var norm backend.Tensor
	if h.Clip == optim.ClipMatrix {
		norm, p.MaxNorm = d.norm, h.MaxNorm
		if err := be.SumSquares(s, norm, x.Grad, d.work); err != nil {
			return fmt.Errorf("galore: norm of %s: %w", x.Name, err)
		}
	}
	if err := be.AdamW(s, z, backend.Tensor{}, x.Grad, x.M, x.V, norm, d.skip, p); err != nil {
		return fmt.Errorf("galore: adam of %s: %w", x.Name, err)
	}
	wd := 0.0
	if x.Decay {
		wd = float64(h.WeightDecay)
	}
	decay := float32(1 - d.lr*wd)
	alpha := float32((1 - d.lr*wd) * d.lr * d.Cfg.Scale)
	var err error
	if x.Side == ProjectIn { // W += P Z, Z [r, out]
		err = be.DenseApply(s, false, false, x.In, x.Out, x.R, alpha, x.P, z, decay, x.W, d.skip, d.seed, d.srStep, x.ID)
	} else { // W += Z Q^T, Z [in, r]
		err = be.DenseApply(s, false, true, x.In, x.Out, x.R, alpha, z, x.P, decay, x.W, d.skip, d.seed, d.srStep, x.ID)
	}
	if err != nil {
		return fmt.Errorf("galore: update of %s: %w", x.Name, err)
	}
	return nil
}
