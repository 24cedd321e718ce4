// LSP-Offload's matrix path during a step (docs/DESIGN.md, "LSP as
// implemented"): the model's block matrices hand their input X and output
// gradient dY to this file's hooks instead of forming G = X^T dY.
// Matrices that read the same input (model.Matrix.Input) share P and A.
//
//	forward:  A = P^T X^T          (d x BT, kept; X is not)
//	backward: B = dY Q; S (+)= A B (d x d, fp32, summed over micro-batches)
//
// Under --recompute layer the model hands X over in each block's backward
// instead (model.Options.HooksInRecompute): A is made there, right before
// its readers, in one buffer that serves every block (InFlight.A).
//
//	d2h S -> host subspace Adam (d x d moments) -> Delta -> h2d into S's buffer
//	apply:    W <- (1 - lr wd) W + P Delta Q^T, stochastically rounded (bf16)
//
// The engine (train/engine) owns the schedule: it puts each layer's copy
// down, host Adam, copy up and apply on its streams as graph nodes whose
// bodies are State's CopyDown, HostAdam, CopyUp and Apply. The projector
// check (check.go) uses the same hooks in a calibration mode that forms
// one layer's full G at a time.
//
// Device memory per input: P by row and by column (2 m r int32 and as many
// float32, plus d+1 int32) and A (d BT fp32); per matrix: Q likewise (2 n r
// and 2 n r, plus d+1) and S (d^2 fp32); shared: B (BT dmax) and the
// apply's T (dmax nmax) workspaces (memory.go counts them). Dense
// projectors (--projector svd, gaussian: r = d) keep only their values,
// P m d and Q n d fp32, and compress and apply by the backend's DenseGemm
// and DenseApply (docs/DESIGN.md, "Projector kinds").

package lsp

import (
	"fmt"
	"math/rand/v2"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// Env is what a State needs of the engine that runs it.
type Env struct {
	Backend backend.Backend
	// Stream is the compute stream: the projectors' uploads, the check's
	// calibration passes and the fits run there, between steps.
	Stream backend.Stream
	Model  model.Model
	Index  *model.Index // the model's layout by block
	B, T   int          // the micro-batch shape
	DType  backend.DType
	Seed   uint64
	Hyper  optim.Hyper
	// Workers run the subspace Adam on the host.
	Workers *host.Workers
	// SizeOnly: the engine is only traced (its host nodes never run), so
	// no Go copy of the subspace moments is made.
	SizeOnly bool
	// SkipFlag is the step's non-finite flag on the device: the apply
	// writes nothing when it is set.
	SkipFlag backend.Tensor
	// HostSkip reads the step's non-finite flag from its pinned copy; only
	// a host node ordered after that copy may call it.
	HostSkip func(node string) bool
	// HostAccess declares host reads and writes of pinned memory to a
	// backend that checks hazards (nil: none does).
	HostAccess func(name string, reads, writes []backend.Range)
	// InFlight says which buffers are sized for the blocks in flight
	// (memory.go).
	InFlight InFlight
}

// Input is one block input X (BT x m) that matrices read, with the
// projector P (m x d) and the compressed activation A = P^T X^T that the
// matrices reading it share.
type Input struct {
	M, D, R int
	P       *Projector // host copy, the truth after every fit
	Mats    []*Matrix  // the readers, in matrix order

	// Device storage: P (devProjector), and A.
	pDev devProjector
	A    backend.Tensor // F32 [d,BT]; with InFlight.A a view of the one shared buffer

	// handed is the X the model handed over, kept until the first
	// reader's OutputGrad compresses it (InFlight.A).
	handed backend.Tensor

	gain []float32 // P's per-column gains (Projector.Gains), for Delta's rows
}

// Matrix is one block matrix W (m x n) and its projector Q.
type Matrix struct {
	Name       string
	L, K       int    // its layer and its index among a block's matrices
	ID         uint32 // keys the stochastic rounding: L*(matrices per block)+K
	M, N, D, R int
	Decay      bool
	W          backend.Tensor // the weight, a view of the model's parameters
	In         *Input         // P and A
	Q          *Projector     // host copy, the truth after every fit
	S          backend.Tensor // F32 [d,d]: S, then Delta after the copy up
	// Adam is the subspace Adam's state: d x d moments and the step count.
	Adam *host.AdamState
	// RewarmFrom is the step after the latest large subspace change (0:
	// none), from which the learning rate ramps up again (Ramp).
	RewarmFrom int

	// Device storage of Q (devProjector).
	qDev devProjector

	gain    []float32 // Q's per-column gains, for Delta's columns
	hostOff int       // byte offset of S / Delta in the pinned buffer
}

// State is lsp mode's state for one model: every matrix's projectors,
// compressed activations and S on the device, the pinned S/Delta buffer
// and the subspace moments on the host, and the projector check's
// buffers. Make it, give it to the model as its model.MatrixGrads, then
// Init it once the model exists.
type State struct {
	Mats   [][]*Matrix // [layer][k]
	Inputs [][]*Input  // [layer][input]
	// Config is the settings in force (the caller's, WithDefaults).
	Config Config

	env    Env
	ints   backend.Tensor // the projectors' int32 storage: every block's, or the slots'
	floats backend.Tensor // the projectors' values: every block's, or the slots'
	aBuf   backend.Tensor // A: every input's of every block, or the shared buffer
	sBuf   backend.Tensor // S: every block's, or the slots'
	// blockInts and blockFloats are block l's projector storage on the
	// device (a slot's with projectors in slots); mirror holds every
	// block's as pinned host memory, ints first, that fills the slots
	// (nil when the projectors stay on the device).
	blockInts, blockFloats []backend.Tensor
	mirror                 backend.HostBuffer
	// sums are each layer's S summed over a step's micro-batches on the
	// host (InFlight.HostSum), matrix after matrix as in hostS.
	sums  [][]float32
	bWork backend.Tensor // B = dY Q, [BT, dmax]
	tWork backend.Tensor // the apply's T = Delta Q^T, [dmax, nmax]
	hostS backend.HostBuffer
	ramp  Ramp

	micro int // the micro-batch being run (0: S is written, not accumulated)
	// sharedA is InFlight.A's one A buffer and aOf the input whose A it
	// holds now (nil: none yet in this block's backward).
	sharedA    backend.Tensor
	aOf        *Input
	calibLayer int // >= 0: calibration mode for that layer (check.go)
	calib      *calibration
	fitReserve backend.Tensor // the fit's device memory between checks (memory.go)
	fitStaging *FitStaging    // the fits' pinned host staging (memory.go)
	layerNorm  []float64      // squared norm of the layer's S in the latest step
	// skipped[l]: the step's loss was not finite, so layer l's host Adam
	// left its moments alone and no Delta goes up (written by the host
	// node, read by the launcher after it); the apply skips on the device.
	skipped []bool
}

// Init allocates the device and host storage of every matrix of env's
// model with c's settings (the projectors are drawn by Draw). On an error
// the caller frees the state.
func (st *State) Init(env Env, c Config) error {
	st.env, st.Config, st.calibLayer = env, c.WithDefaults(), -1
	st.ramp = DefaultRamp()
	x, be := env.Index, env.Backend
	BT, L := env.B*env.T, len(x.Blocks)
	d, r := Dims(x, st.Config)
	dense := st.Config.Projector.Dense()
	fl := env.InFlight
	n := count(x, st.Config, BT, fl)
	pBlocks, sBlocks := fl.projectorBlocks(L), fl.sBlocks(L)
	var err error
	for _, a := range []struct {
		t    *backend.Tensor
		name string
		n    int
		dt   backend.DType
	}{
		{&st.ints, "lsp projector indices", pBlocks * n.pInts, backend.I32},
		{&st.floats, "lsp projector values", pBlocks * n.pFloats, backend.F32},
		{&st.aBuf, "lsp A", n.a, backend.F32},
		{&st.sBuf, "lsp S", sBlocks * n.sBlock, backend.F32},
		{&st.bWork, "lsp B workspace", BT * n.dmax, backend.F32},
		{&st.tWork, "lsp apply workspace", n.dmax * n.nmax, backend.F32},
	} {
		if a.n == 0 {
			continue // dense projectors have no indices
		}
		if *a.t, err = be.Alloc(a.name, a.n, a.dt); err != nil {
			return fmt.Errorf("lsp: %w", err)
		}
	}
	if fl.projectorSlots() {
		if st.mirror, err = be.AllocHost("lsp projectors (pinned)", 4*L*(n.pInts+n.pFloats)); err != nil {
			return fmt.Errorf("lsp: %w", err)
		}
	}
	ac := &backend.Carver{T: st.aBuf}
	if fl.A {
		st.sharedA = ac.Next(sharedA(x, st.Config) * BT)
	}
	params := env.Model.Buffers().Params
	hostBytes := 0
	st.Mats = make([][]*Matrix, L)
	st.Inputs = make([][]*Input, L)
	st.layerNorm = make([]float64, L)
	st.skipped = make([]bool, L)
	st.blockInts, st.blockFloats = make([]backend.Tensor, L), make([]backend.Tensor, L)
	for l := 0; l < L; l++ {
		pb, sb := l, l
		if fl.projectorSlots() {
			pb = l % fl.ProjectorSlots
		}
		if fl.Slots > 0 {
			sb = l % fl.Slots
		}
		st.blockInts[l] = st.ints.Slice(pb*n.pInts, n.pInts)
		st.blockFloats[l] = st.floats.Slice(pb*n.pFloats, n.pFloats)
		ic, fc := &backend.Carver{T: st.blockInts[l]}, &backend.Carver{T: st.blockFloats[l]}
		sc := &backend.Carver{T: st.sBuf.Slice(sb*n.sBlock, n.sBlock)}
		st.Inputs[l] = make([]*Input, x.Inputs)
		for k, mt := range x.Mats {
			pi := x.MatParam[l][k]
			p := x.Layout[pi]
			xm := &Matrix{Name: p.Name, L: l, K: k, ID: uint32(l*len(x.Mats) + k),
				M: mt.M, N: mt.N, D: d[k], R: r[k], Decay: p.Decay, W: env.Model.ParamView(params, pi)}
			// P's storage comes with its first reader's, in the order
			// each matrix had its own P before inputs were shared.
			in := st.Inputs[l][mt.Input]
			first := in == nil
			if first {
				in = &Input{M: mt.M, D: d[k], R: r[k]}
				st.Inputs[l][mt.Input] = in
				in.pDev = carveProjector(ic, fc, mt.M, d[k], r[k], dense)
			}
			in.Mats = append(in.Mats, xm)
			xm.In = in
			xm.qDev = carveProjector(ic, fc, mt.N, d[k], r[k], dense)
			switch {
			case first && fl.A:
				in.A = st.sharedA.Slice(0, d[k]*BT, d[k], BT)
			case first:
				in.A = ac.Next(d[k], BT)
			}
			xm.hostOff = hostBytes
			hostBytes += d[k] * d[k] * 4
			if !env.SizeOnly { // traced: the host nodes never run
				xm.Adam = host.NewAdamState(d[k] * d[k])
			}
			st.Mats[l] = append(st.Mats[l], xm)
		}
		// A layer's S follow each other, so that with several ranks one
		// collective sums them (LayerS).
		for _, xm := range st.Mats[l] {
			xm.S = sc.Next(xm.D, xm.D)
		}
	}
	if fl.HostSum && !env.SizeOnly {
		st.sums = make([][]float32, L)
		for l := range st.sums {
			st.sums[l] = make([]float32, n.sBlock)
		}
	}
	if st.hostS, err = be.AllocHost("lsp S and Delta", hostBytes); err != nil {
		return fmt.Errorf("lsp: %w", err)
	}
	if !st.Config.NoFit {
		if st.calib, err = newCalibration(st); err != nil {
			return err
		}
	}
	if err := st.newFitStaging(); err != nil {
		return err
	}
	return st.reserveFit()
}

// Free releases what Init allocated (after a failed Init too).
func (st *State) Free() {
	be := st.env.Backend
	if be == nil {
		return // never initialised
	}
	for _, t := range []backend.Tensor{st.ints, st.floats, st.aBuf, st.sBuf, st.bWork, st.tWork} {
		if t.Buf != nil {
			be.Free(t)
		}
	}
	for _, h := range []backend.HostBuffer{st.hostS, st.mirror} {
		if h != nil {
			be.FreeHost(h)
		}
	}
	if st.calib != nil {
		st.calib.free()
	}
	st.fitStaging.Free(be)
	st.fitStaging = nil
	st.releaseFit()
}

// Draw gives every matrix fresh random projectors and uploads them. Each
// matrix draws from a generator keyed by its id; an input's P is drawn
// from its first reader's, before that reader's Q.
func (st *State) Draw() error {
	for _, row := range st.Mats {
		for _, x := range row {
			rng := rand.New(rand.NewPCG(st.env.Seed, 0x15b0000+uint64(x.ID)))
			var err error
			if x.In.Mats[0] == x {
				if x.In.P, err = NewProjector(x.M, x.D, x.R, rng); err != nil {
					return fmt.Errorf("lsp: projector P of %s: %w", x.Name, err)
				}
				if err := st.uploadP(x.In); err != nil {
					return err
				}
			}
			if x.Q, err = NewProjector(x.N, x.D, x.R, rng); err != nil {
				return fmt.Errorf("lsp: projector Q of %s: %w", x.Name, err)
			}
			if err := st.uploadQ(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// devProjector is a projector's device storage: by row (apply) and by
// column (compress), or for a dense projector the values only (val, the
// row-major rows x d matrix; the rest empty).
type devProjector struct {
	idx, colPtr, rowIdx backend.Tensor // I32
	val, colVal         backend.Tensor // F32
	dense               bool
}

// carveProjector carves the storage of a projector of rows x d with r
// non-zeros per row (projectorSizes) from the block's ints and floats.
func carveProjector(ic, fc *backend.Carver, rows, d, r int, dense bool) devProjector {
	if dense {
		return devProjector{val: fc.Next(rows, d), dense: true}
	}
	var t devProjector
	t.idx, t.colPtr, t.rowIdx = ic.Next(rows*r), ic.Next(d+1), ic.Next(rows*r)
	t.val, t.colVal = fc.Next(rows*r), fc.Next(rows*r)
	return t
}

// parts pairs each of t's tensors with p's host array: the indices, then
// the values (the values only when dense).
func (t devProjector) parts(p *Projector) (ints []intPart, floats []floatPart) {
	if t.dense {
		return nil, []floatPart{{t.val, p.Val}}
	}
	return []intPart{{t.idx, p.Idx}, {t.colPtr, p.ColPtr}, {t.rowIdx, p.RowIdx}},
		[]floatPart{{t.val, p.Val}, {t.colVal, p.ColVal}}
}

type intPart struct {
	t backend.Tensor
	v []int32
}

type floatPart struct {
	t backend.Tensor
	v []float32
}

// uploadP copies an input's projector P (its device storage) to the
// device, or to the pinned copy that fills the slots.
func (st *State) uploadP(in *Input) error {
	in.gain = in.P.Gains()
	x := in.Mats[0]
	return st.upload(x.L, x.Name, in.P, in.pDev)
}

// uploadQ copies a matrix's projector Q (its device storage) to the
// device, or to the pinned copy that fills the slots.
func (st *State) uploadQ(x *Matrix) error {
	x.gain = x.Q.Gains()
	return st.upload(x.L, x.Name, x.Q, x.qDev)
}

func (st *State) upload(l int, name string, p *Projector, t devProjector) error {
	ints, floats := t.parts(p)
	if st.mirror != nil {
		st.mirrorProjector(l, name, ints, floats)
		return nil
	}
	be, s := st.env.Backend, st.env.Stream
	for _, u := range ints {
		if err := backend.UploadInt32(be, s, u.t, u.v); err != nil {
			return fmt.Errorf("lsp: projectors of %s: %w", name, err)
		}
	}
	for _, u := range floats {
		if err := backend.Upload(be, s, u.t, u.v); err != nil {
			return fmt.Errorf("lsp: projectors of %s: %w", name, err)
		}
	}
	return nil
}

// mirrorProjector writes a projector of block l (its parts) into the
// pinned copy, at the place of its device views in the block's storage
// (between steps: no copy reads the pinned copy then).
func (st *State) mirrorProjector(l int, name string, ints []intPart, floats []floatPart) {
	iBase, fBase := st.blockInts[l].Off, st.blockFloats[l].Off
	var writes []backend.Range
	for _, u := range ints {
		copy(st.mirrorInts(l)[u.t.Off-iBase:], u.v)
		writes = append(writes, hazard.HostRange(st.mirror, 4*(st.mirrorIntsOff(l)+u.t.Off-iBase), 4*len(u.v)))
	}
	for _, u := range floats {
		copy(st.mirrorFloats(l)[u.t.Off-fBase:], u.v)
		writes = append(writes, hazard.HostRange(st.mirror, 4*(st.mirrorFloatsOff(l)+u.t.Off-fBase), 4*len(u.v)))
	}
	if st.env.HostAccess != nil {
		st.env.HostAccess("lsp projectors of "+name, nil, writes)
	}
}

// The pinned copy holds every block's projector indices, then every
// block's values, each block's laid out as its device storage.
func (st *State) mirrorIntsOff(l int) int { return l * st.blockInts[l].Len() }
func (st *State) mirrorFloatsOff(l int) int {
	return len(st.Mats)*st.blockInts[l].Len() + l*st.blockFloats[l].Len()
}
func (st *State) mirrorInts(l int) []int32 {
	o := st.mirrorIntsOff(l)
	return st.mirror.Int32()[o : o+st.blockInts[l].Len()]
}
func (st *State) mirrorFloats(l int) []float32 {
	o := st.mirrorFloatsOff(l)
	return st.mirror.Float32()[o : o+st.blockFloats[l].Len()]
}

// UploadProjectors enqueues on s (the host-to-device stream) the copy of
// block l's projectors from the pinned copy into its slot, before each of
// its backwards; nothing when the projectors stay on the device.
func (st *State) UploadProjectors(s backend.Stream, l int) error {
	if st.mirror == nil {
		return nil
	}
	be := st.env.Backend
	if st.ints.Buf != nil { // dense projectors have no indices
		if err := be.CopyH2D(s, st.blockInts[l], st.mirror, 4*st.mirrorIntsOff(l)); err != nil {
			return err
		}
	}
	return be.CopyH2D(s, st.blockFloats[l], st.mirror, 4*st.mirrorFloatsOff(l))
}

// ProjectorUploadBytes is the bytes UploadProjectors copies up per
// micro-batch, every block's projectors (0 when they stay on the device).
func (st *State) ProjectorUploadBytes() int64 {
	if st.mirror == nil {
		return 0
	}
	return int64(len(st.mirror.Bytes()))
}

// ProjectorsInSlots reports whether the projectors are uploaded into
// their block's slot before each backward (UploadProjectors).
func (st *State) ProjectorsInSlots() bool { return st.mirror != nil }

// SetMicro says which micro-batch of the step runs next: the first writes
// S, the later ones add to it.
func (st *State) SetMicro(i int) { st.micro = i }

// Input implements model.MatrixGrads: keep A = P^T X^T, once for the
// matrices that read X; with InFlight.A (X handed over in the block's
// backward, where it stays until the block's last OutputGrad) only note X:
// OutputGrad compresses it into the shared buffer before its first reader.
func (st *State) Input(s backend.Stream, l, in int, X backend.Tensor) error {
	if st.calibLayer >= 0 {
		return st.calib.input(s, l, in, X)
	}
	x := st.Inputs[l][in]
	if st.env.InFlight.A {
		x.handed, st.aOf = X, nil
		return nil
	}
	return st.compressA(s, x, X)
}

func (st *State) compressA(s backend.Stream, x *Input, X backend.Tensor) error {
	BT, p := st.env.B*st.env.T, x.pDev
	if st.Config.Projector.Dense() {
		return st.env.Backend.DenseGemm(s, true, true, x.D, BT, x.M, 1, p.val, X, 0, x.A)
	}
	return st.env.Backend.SparseCompressA(s, x.A, X, p.colPtr, p.rowIdx, p.colVal, BT, x.M, x.D)
}

// OutputGrad implements model.MatrixGrads: S (+)= A (dY Q).
func (st *State) OutputGrad(s backend.Stream, l, k int, dY backend.Tensor) error {
	if st.calibLayer >= 0 {
		return st.calib.outputGrad(s, l, k, dY)
	}
	x := st.Mats[l][k]
	if st.env.InFlight.A && st.aOf != x.In {
		// The first reader of its input in this backward (the readers of
		// one input come one after another, so each A is made once).
		if x.In.handed.Buf == nil {
			return fmt.Errorf("lsp: output gradient of %s before its input", x.Name)
		}
		if err := st.compressA(s, x.In, x.In.handed); err != nil {
			return err
		}
		st.aOf = x.In
	}
	be, BT := st.env.Backend, st.env.B*st.env.T
	b := st.bWork.Slice(0, BT*x.D, BT, x.D)
	var err error
	if q := x.qDev; st.Config.Projector.Dense() {
		err = be.DenseGemm(s, false, false, BT, x.D, x.N, 1, dY, q.val, 0, b)
	} else {
		err = be.SparseCompressB(s, b, dY, q.colPtr, q.rowIdx, q.colVal, BT, x.N, x.D)
	}
	if err != nil {
		return err
	}
	// With HostSum every micro-batch's S goes down on its own.
	return be.SparseS(s, x.S, x.In.A, b, BT, x.D, st.micro > 0 && !st.env.InFlight.HostSum)
}

// LR is matrix x's learning rate at step (1-based) for the run's lr,
// re-warmed after a large subspace change.
func (st *State) LR(x *Matrix, step int, lr float64) float64 {
	if x.RewarmFrom == 0 {
		return lr
	}
	return lr * st.ramp.Multiplier(step-x.RewarmFrom)
}

// CopyDown enqueues on s (the device-to-host stream) the copy of layer l's
// S into the pinned host buffer, once its backward is done.
func (st *State) CopyDown(s backend.Stream, l int) error {
	for _, x := range st.Mats[l] {
		if err := st.env.Backend.CopyD2H(s, st.hostS, x.hostOff, x.S); err != nil {
			return err
		}
	}
	return nil
}

// HostS is layer l's S (then Delta) in the pinned host buffer: the
// buffer and the span of floats the layer's matrices take there, one
// after another.
func (st *State) HostS(l int) (h backend.HostBuffer, off, n int) {
	first, last := st.Mats[l][0], st.Mats[l][len(st.Mats[l])-1]
	return st.hostS, first.hostOff, (last.hostOff-first.hostOff)/4 + last.D*last.D
}

// LayerS is one layer's S on the device, in matrix order (Init carves
// them one after another, so a device communicator sums them at once).
func (st *State) LayerS(l int) []backend.Tensor {
	ts := make([]backend.Tensor, len(st.Mats[l]))
	for i, x := range st.Mats[l] {
		ts[i] = x.S
	}
	return ts
}

// AdamWork is layer l's subspace Adam, for a planner that cannot run it:
// the elements it updates, the tensors they are in and the bytes it reads
// and writes (S pre-scanned, moments read and written, Delta written in
// place, and the gains' pass over Delta unless --no-gain).
func (st *State) AdamWork(l int) (elems, tensors, bytes int64) {
	per := int64(host.AdamBytesPerElement(4, true, false, true))
	if !st.Config.NoGain {
		per += 8
	}
	for _, x := range st.Mats[l] {
		elems += int64(x.D * x.D)
	}
	if st.env.InFlight.HostSum {
		per += 12 // the last micro-batch's S added to the sum: both read, S written
	}
	return elems, int64(len(st.Mats[l])), elems * per
}

// SumWork is SumS on layer l, for a planner: the elements and the bytes
// it reads and writes (the pinned S read, the fp32 sum read and written).
func (st *State) SumWork(l int) (elems, bytes int64) {
	for _, x := range st.Mats[l] {
		elems += int64(x.D * x.D)
	}
	return elems, 12 * elems
}

// CopyUp enqueues on s (the host-to-device stream) the copy of layer l's
// Delta into S's buffer, after HostAdam; nothing when the step was
// skipped (the apply skips on the device flag).
func (st *State) CopyUp(s backend.Stream, l int) error {
	if st.skipped[l] {
		return nil
	}
	for _, x := range st.Mats[l] {
		if err := st.env.Backend.CopyH2D(s, x.S, st.hostS, x.hostOff); err != nil {
			return err
		}
	}
	return nil
}

// SumS adds layer l's S of micro-batch micro, in the pinned buffer after
// CopyDown, to the layer's fp32 sum on the host (InFlight.HostSum; the
// first micro-batch's starts it). It runs on a host goroutine, before the
// next micro-batch's copy of the layer overwrites the pinned S; HostAdam
// adds the last micro-batch's.
func (st *State) SumS(l, micro int) error {
	if st.sums == nil {
		return fmt.Errorf("lsp: SumS without InFlight.HostSum")
	}
	h, off, n := st.HostS(l)
	if st.env.HostAccess != nil {
		st.env.HostAccess(fmt.Sprintf("sum S %d.%d", micro, l), []backend.Range{hazard.HostRange(h, off, 4*n)}, nil)
	}
	src, sum := h.Float32()[off/4:off/4+n], st.sums[l]
	if micro == 0 {
		copy(sum, src)
		return nil
	}
	for i, v := range src {
		sum[i] += v
	}
	return nil
}

// HostAdam runs subspace Adam on layer l's S of step (1-based) at the
// run's learning rate lr, in place: S becomes Delta. On a step whose loss
// is not finite it does nothing, so the subspace moments and step counts
// stay as they are. It runs on a host goroutine after CopyDown's copy.
func (st *State) HostAdam(l, step int, lr float64) error {
	node := fmt.Sprintf("host adam S %d", l)
	if st.skipped[l] = st.env.HostSkip(node); st.skipped[l] {
		return nil
	}
	if st.env.HostAccess != nil {
		var rs []backend.Range
		for _, x := range st.Mats[l] {
			rs = append(rs, hazard.HostRange(st.hostS, x.hostOff, x.D*x.D*4))
		}
		st.env.HostAccess(node, rs, rs)
	}
	all := st.hostS.Float32()
	if st.sums != nil {
		// The last micro-batch's S plus the earlier ones' sum, in the
		// order the device would have summed them.
		_, off, n := st.HostS(l)
		last := all[off/4 : off/4+n]
		for i, v := range st.sums[l] {
			last[i] = v + last[i]
		}
	}
	ts := make([]host.AdamTensor, 0, len(st.Mats[l]))
	for _, x := range st.Mats[l] {
		// Weight decay is the apply's (on W), not the subspace Adam's.
		s := all[x.hostOff/4 : x.hostOff/4+x.D*x.D]
		ts = append(ts, host.AdamSubspace(x.Name, s, x.Adam, st.env.Hyper.HostParams(st.LR(x, step, lr), false)))
	}
	res, err := st.env.Workers.AdamStep(ts)
	if err != nil {
		return err
	}
	st.layerNorm[l] = 0
	for i, r := range res.Tensors {
		x := st.Mats[l][i]
		delta := all[x.hostOff/4 : x.hostOff/4+x.D*x.D]
		if r.Skipped {
			// Nothing was written: make Delta zero so the apply only decays.
			clear(delta)
		} else if !st.Config.NoGain {
			applyGains(delta, x.In.gain, x.gain)
		}
		st.layerNorm[l] += r.Norm * r.Norm
	}
	return nil
}

// applyGains scales Delta[a,b] (d x d) by gp[a] gq[b]: the update of the
// projectors with every column rescaled to a random one's squared norm
// (Projector.Gains), so that fitting does not shrink it.
func applyGains(delta, gp, gq []float32) {
	d := len(gp)
	for a, ga := range gp {
		row := delta[a*d : (a+1)*d]
		for b, gb := range gq {
			row[b] *= ga * gb
		}
	}
}

// Apply enqueues W <- (1 - lr wd) W + P Delta Q^T for layer l of step
// (1-based; it keys the stochastic rounding) on s, after CopyUp.
func (st *State) Apply(s backend.Stream, l, step int, lr float64) error {
	env := st.env
	for _, x := range st.Mats[l] {
		xlr := st.LR(x, step, lr)
		wd := float32(0)
		if x.Decay {
			wd = env.Hyper.WeightDecay
		}
		T, p, q := st.tWork.Slice(0, x.D*x.N, x.D, x.N), x.In.pDev, x.qDev
		var err error
		if st.Config.Projector.Dense() {
			err = st.denseApply(s, x, T, float32(xlr), wd, step)
		} else {
			err = env.Backend.SparseApply(s, x.W, T, x.S, p.idx, p.val, q.idx, q.val,
				env.SkipFlag, x.M, x.N, x.D, x.R, float32(xlr), wd, env.Seed, uint64(step), x.ID)
		}
		if err != nil {
			return fmt.Errorf("apply %s: %w", x.Name, err)
		}
	}
	return nil
}

// denseApply is Apply's W <- (1 - lr wd) W + P Delta Q^T for dense
// projectors: T = Delta Q^T, then W's update P T, with the decay and the
// stochastic rounding of SparseApply.
func (st *State) denseApply(s backend.Stream, x *Matrix, T backend.Tensor, lr, wd float32, step int) error {
	env := st.env
	if err := env.Backend.DenseGemm(s, false, true, x.D, x.N, x.D, 1, x.S, x.qDev.val, 0, T); err != nil {
		return err
	}
	return env.Backend.DenseApply(s, false, false, x.M, x.N, x.D, 1, x.In.pDev.val, T, 1-float32(lr*wd), x.W,
		env.SkipFlag, env.Seed, uint64(step), x.ID)
}

// StepNormSq sums the layers' squared S norms of the latest step.
func (st *State) StepNormSq() float64 {
	var s float64
	for _, v := range st.layerNorm {
		s += v
	}
	return s
}
