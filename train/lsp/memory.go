// lsp mode's memory, predicted from the configuration alone with the
// size formulas State.Init allocates by, so that the engine's memory
// plan (train/engine's MemoryOf) counts exactly what a run holds; and the
// projector fit's device memory: the fit of a check runs through the
// backend's ops (devicefit.go), so its buffers count in the plan, and a
// State holds that many bytes reserved from Init on (one buffer, freed
// just before each fit and taken back after it), so that a budget that
// fits Init fits every check, and Init fails as the plan says.

package lsp

import (
	"fmt"
	"math/rand/v2"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Dims is the capped d and r of every block matrix k: d = min(--d, m, n)
// (AutoD(m, n) for --d 0) over the matrices that share k's input (they
// share P, m x d), and r capped by d; r = d for dense projectors.
func Dims(x *model.Index, c Config) (d, r []int) {
	d, r = make([]int, len(x.Mats)), make([]int, len(x.Mats))
	for _, readers := range x.Readers {
		dd := 0
		for _, k := range readers {
			if cd := CapD(c.D, x.Mats[k].M, x.Mats[k].N); dd == 0 || cd < dd {
				dd = cd
			}
		}
		for _, k := range readers {
			d[k], r[k] = dd, CapR(c.R, dd)
			if c.Projector.Dense() {
				r[k] = dd
			}
		}
	}
	return d, r
}

// projectorSizes are the element counts of the device storage of one
// projector of rows x d: by row and by column, or for dense projectors
// the values only (the row-major rows x d matrix). An input's P has m
// rows, a matrix's Q n.
func projectorSizes(rows, d, r int, dense bool) (ints, floats int) {
	if dense {
		return 0, rows * d
	}
	return 2*rows*r + (d + 1), 2 * rows * r
}

// sharedA is the rows of the one A buffer of InFlight.A: the largest d of
// any input.
func sharedA(x *model.Index, c Config) int {
	d, _ := Dims(x, c)
	most := 0
	for _, readers := range x.Readers {
		most = max(most, d[readers[0]])
	}
	return most
}

// InFlight says which of a State's per-block buffers are sized for the
// blocks in flight instead of for every block (docs/DESIGN.md, "LSP as
// implemented": memory).
type InFlight struct {
	// A: the model hands each block's inputs over in its backward
	// (model.Options.HooksInRecompute), so the compressed activations are
	// made right before the matrices that read them and one buffer, as
	// long as the largest input's, serves every input of every block.
	A bool
	// Slots > 0: each block's S lives in one of Slots device slots
	// (block l in slot l % Slots) from its backward until its update is
	// applied, and the engine schedules each block's apply before the
	// backward that takes its slot next. 0: every block's S stays on the
	// device.
	Slots int
	// ProjectorSlots > 0, with A: the projectors live in that many slots
	// too (block l in slot l % ProjectorSlots), uploaded from a pinned
	// copy before each backward of their block (the forward no longer
	// reads them). The engine gives them one slot more than S, so that a
	// block's upload waits for the apply of the block Slots+1 above it,
	// which the compute stream runs before the backward above the block,
	// and the copy hides behind that backward instead of delaying the
	// block's own. 0: every block's projectors stay on the device.
	ProjectorSlots int
	// HostSum: with Slots and several micro-batches, each micro-batch's
	// S goes down as soon as its block is done and the host sums them in
	// fp32 (SumS); otherwise S is summed on the device.
	HostSum bool
}

// projectorSlots reports whether the projectors live in the slots.
func (fl InFlight) projectorSlots() bool { return fl.A && fl.ProjectorSlots > 0 }

// blocks is the number of blocks of L that device storage is sized for:
// slots (no more than the blocks), or every block (slots 0).
func blocks(slots, L int) int {
	if slots > 0 {
		return min(slots, L)
	}
	return L
}

// projectorBlocks and sBlocks are blocks for the projectors and S.
func (fl InFlight) projectorBlocks(L int) int {
	if fl.projectorSlots() {
		return blocks(fl.ProjectorSlots, L)
	}
	return L
}

func (fl InFlight) sBlocks(L int) int { return blocks(fl.Slots, L) }

// counts are the element counts of a State's storage.
type counts struct {
	pInts, pFloats int // one block's projectors (int32; float32)
	sBlock         int // one block's S: the sum of d^2 over its matrices
	a              int // A: every input of every block, or the shared buffer
	dmax, nmax     int // the largest d and n: the workspaces are BT x dmax and dmax x nmax
}

func count(x *model.Index, c Config, BT int, fl InFlight) counts {
	d, r := Dims(x, c)
	L := len(x.Blocks)
	var n counts
	for _, readers := range x.Readers {
		k := readers[0]
		i, f := projectorSizes(x.Mats[k].M, d[k], r[k], c.Projector.Dense())
		n.pInts, n.pFloats = n.pInts+i, n.pFloats+f
		n.a += L * d[k] * BT
	}
	if fl.A {
		n.a = sharedA(x, c) * BT
	}
	for k, mt := range x.Mats {
		i, f := projectorSizes(mt.N, d[k], r[k], c.Projector.Dense())
		n.pInts, n.pFloats = n.pInts+i, n.pFloats+f
		n.dmax, n.nmax = max(n.dmax, d[k]), max(n.nmax, mt.N)
		n.sBlock += d[k] * d[k]
	}
	return n
}

// Memory is the memory of a State and of its checks, by part, as Init
// and Check allocate it.
type Memory struct {
	// Projectors is every projector on the device (both storages) or
	// those of the slots; A the compressed activations; S the blocks' S
	// (then Delta); Workspaces the B and apply workspaces.
	Projectors, A, S, Workspaces int64
	// Calibration is the check's buffers (one layer's inputs and full
	// gradients); Fit the fit's reservation and FitStaging its pinned
	// host staging. All three are 0 with NoFit, Fit and FitStaging also
	// when checks redraw instead of fitting.
	Calibration, Fit, FitStaging int64
	// Refresh is the svd projectors' refresh at a check (svd.go: the
	// largest input's gradient scratch, U, V and SVD workspace), held
	// reserved as Fit is; 0 for other kinds.
	Refresh int64
	// HostS is S/Delta in pinned memory and the subspace moments;
	// HostSums the fp32 sums of InFlight.HostSum; HostProjectors the
	// projectors' pinned copy that the slots are filled from (0 without
	// either).
	HostS, HostSums, HostProjectors int64
	// LinkDown is the bytes of S that go down per step; LinkUp those of
	// Delta and of the projectors uploaded into the slots that come up.
	LinkDown, LinkUp int64
	// Saved is the bytes of the arrays State.SaveArrays converts for a
	// checkpoint (the indices as fp32 and the counters), Views of those
	// it hands over as they are (the projector values and the moments):
	// together, lsp's share of the file.
	Saved, Views int64
	// SaveConvert is the longest array SaveArrays converts, which is all
	// a checkpoint write holds of lsp's state at once; RestoreHeld what
	// Restore holds for one matrix (its arrays read whole, and its new
	// projectors before the old ones are dropped).
	SaveConvert, RestoreHeld int64
}

// MemoryOf is the memory a State and its checks take for the model x with
// micro-batches of B x T (accum per step) at dtype dt, its buffers in
// flight as fl says.
func MemoryOf(x *model.Index, c Config, B, T, accum int, dt backend.DType, fl InFlight) Memory {
	BT, L := B*T, len(x.Blocks)
	n := count(x, c, BT, fl)
	s2 := int64(L * n.sBlock)
	proj := 4 * int64(n.pInts+n.pFloats) // one block's
	b := Memory{
		Projectors: int64(fl.projectorBlocks(L)) * proj,
		A:          4 * int64(n.a),
		S:          4 * int64(fl.sBlocks(L)*n.sBlock),
		Workspaces: 4 * (int64(BT)*int64(n.dmax) + int64(n.dmax)*int64(n.nmax)),
		HostS:      12 * s2,
		LinkDown:   4 * s2,
		LinkUp:     4 * s2,
	}
	if fl.HostSum {
		b.HostSums = 4 * s2
		b.LinkDown *= int64(accum)
	}
	if fl.projectorSlots() {
		b.HostProjectors = int64(L) * proj
		b.LinkUp += int64(accum) * b.HostProjectors
	}
	if !c.NoFit {
		b.Calibration = calibrationBytes(x, BT, dt)
		b.Fit = fitBytes(x, c, B)
		g, sm := fitStagingBytes(x, c, B)
		b.FitStaging = int64(g + sm)
		b.Refresh = svdBytes(x, c, dt)
	}
	d, r := Dims(x, c)
	var saved, views int64
	for k, mt := range x.Mats {
		// Each matrix's P and Q indices (the shared P once per matrix
		// reading it; none for dense projectors) and two counters; the
		// values and the moments are views.
		idx := mt.M*r[k] + mt.N*r[k]
		convert, held := max(mt.M, mt.N)*r[k], 4*(mt.M+mt.N)*r[k]
		if c.Projector.Dense() {
			// The values read, and the new projectors' Idx, Val, RowIdx
			// and ColVal.
			idx, convert, held = 0, 2, 5*(mt.M+mt.N)*d[k]
		}
		saved += int64(idx + 2)
		views += int64(mt.M*r[k] + mt.N*r[k] + 2*d[k]*d[k])
		b.SaveConvert = max(b.SaveConvert, 4*int64(convert))
		b.RestoreHeld = max(b.RestoreHeld, 4*int64(held+2*d[k]*d[k]+2))
	}
	b.Saved = 4 * int64(len(x.Blocks)) * saved
	b.Views = 4 * int64(len(x.Blocks)) * views
	return b
}

// fitSamples is the number of gradient samples per reader that one fit
// takes (Check: the fitting micro-batches in at most maxFitGroups groups for
// --refit split, their mean otherwise; every layer's with --share-layers
// and split), for micro-batches of B rows and L layers.
func fitSamples(c Config, B, L int) int {
	c = c.WithDefaults()
	if c.Refit != RefitSplit {
		return 1
	}
	n := (c.CalibSamples + B - 1) / B
	if c.Accept == AcceptHeldOut {
		n = max(n, 2) / 2
	}
	s := min(n, maxFitGroups)
	if c.ShareLayers {
		s *= L
	}
	return s
}

// fits reports whether c's checks fit projectors (rather than keep or
// redraw them).
func (c Config) fits() bool {
	return !c.NoFit && c.WithDefaults().Refit != RefitRandom && !c.Projector.Dense()
}

// fitBytes is the device memory of the largest fit of a check (one input's
// P with its readers' Qs; FitBytes), 0 when checks do not fit.
func fitBytes(x *model.Index, c Config, B int) int64 {
	var most int64
	for _, g := range fitGroups(x, c, B) {
		most = max(most, FitBytes(g.M, g.Ns, g.D, g.R, g.Samples))
	}
	return most
}

// fitStagingBytes is the size of the host staging buffers the largest fit
// of a check copies through (FitStagingBytes), 0 and 0 when checks do
// not fit.
func fitStagingBytes(x *model.Index, c Config, B int) (grad, small int) {
	for _, g := range fitGroups(x, c, B) {
		gb, sb := FitStagingBytes(g.M, g.Ns, g.D, g.R, g.Samples)
		grad, small = max(grad, gb), max(small, sb)
	}
	return grad, small
}

// newFitStaging allocates the fits' host staging once, so that a check
// allocates no host memory; nil when checks do not fit.
func (st *State) newFitStaging() error {
	g, s := fitStagingBytes(st.env.Index, st.Config, st.env.B)
	if g == 0 {
		return nil
	}
	var err error
	if st.fitStaging, err = NewFitStaging(st.env.Backend, g, s); err != nil {
		return fmt.Errorf("lsp: %w", err)
	}
	return nil
}

// reserveFit takes the bytes of a check's fit (fitBytes) or svd refresh
// (svdBytes) back as one buffer; a no-op when checks do neither or the
// reservation is held.
func (st *State) reserveFit() error {
	n := fitBytes(st.env.Index, st.Config, st.env.B) + svdBytes(st.env.Index, st.Config, st.env.DType)
	if n == 0 || st.fitReserve.Buf != nil {
		return nil
	}
	t, err := st.env.Backend.Alloc("projector fit (reserved)", int((n+3)/4), backend.F32)
	if err != nil {
		return fmt.Errorf("lsp: reserving the projector fit's memory: %w", err)
	}
	st.fitReserve = t
	return nil
}

// releaseFit frees the reservation for the fit to allocate in.
func (st *State) releaseFit() {
	if st.fitReserve.Buf != nil {
		st.env.Backend.Free(st.fitReserve)
		st.fitReserve = backend.Tensor{}
	}
}

// FitGroup is one kind of fit a check runs: an input's P (M rows) with its
// readers' Qs (Ns rows), d, r and the gradient samples per reader; Count
// such fits per check (one per layer, or one with --share-layers).
type FitGroup struct {
	M       int
	Ns      []int
	D, R    int
	Samples int
	Count   int
}

// FitGroups lists the fits of one projector check of arch with
// micro-batches of B rows (none when checks do not fit): what the planner
// costs a check's fits by (train/plan).
func FitGroups(arch model.Arch, B int, c Config) ([]FitGroup, error) {
	x, err := model.NewIndex(arch)
	if err != nil {
		return nil, fmt.Errorf("lsp: %w", err)
	}
	return fitGroups(x, c, B), nil
}

func fitGroups(x *model.Index, c Config, B int) []FitGroup {
	if !c.fits() {
		return nil
	}
	d, r := Dims(x, c)
	L := len(x.Blocks)
	perCheck := L
	if c.ShareLayers {
		perCheck = 1
	}
	var out []FitGroup
	for _, readers := range x.Readers {
		k := readers[0]
		g := FitGroup{M: x.Mats[k].M, D: d[k], R: r[k], Samples: fitSamples(c, B, L), Count: perCheck}
		for _, j := range readers {
			g.Ns = append(g.Ns, x.Mats[j].N)
		}
		out = append(out, g)
	}
	return out
}

// Trace records on be (a tracing backend, train/trace), on stream s, one
// fit of g's shapes for iters Adam steps with the projector learning rate
// lr (0: 0.05) and orthogonality weight ortho, from random projectors:
// the ops a planner costs a fit by.
func (g FitGroup) Trace(be backend.Backend, s backend.Stream, iters int, lr, ortho float64) error {
	rng := rand.New(rand.NewPCG(1, 2))
	P, err := NewProjector(g.M, g.D, g.R, rng)
	if err != nil {
		return err
	}
	Qs := make([]*Projector, len(g.Ns))
	for k, n := range g.Ns {
		if Qs[k], err = NewProjector(n, g.D, g.R, rng); err != nil {
			return err
		}
	}
	if lr <= 0 {
		lr = 0.05
	}
	opts := FitOptions{LR: lr, MaxIters: iters, Ortho: ortho}
	return TraceFit(be, s, P, Qs, g.Samples, iters, opts)
}
