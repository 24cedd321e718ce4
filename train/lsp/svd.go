// The svd projectors' refresh (--projector svd; docs/DESIGN.md,
// "Projector kinds"): at each projector check P and Q become the top-d
// left and right singular vectors of the calibration gradient, every
// calibration micro-batch's summed (target-weighted, the fitting groups
// and the held-out ones together). Where matrices share an input (q, k
// and v), P comes from their stacked gradient [G_1 | G_2 | ...] (m x sum
// n: the top left singular vectors of sum_i G_i G_i^T) and each Q_i from
// G_i's own top right singular vectors; a matrix alone on its input takes
// both from one SVD. The SVDs are randomized (train/rsvd) through the
// backend's GEMMs on the device: the host's gradient sum is uploaded in
// the model's dtype (bf16 models: rounded to bf16, which the CUDA GEMM
// needs) into scratch allocated in the bytes reserved for checks
// (memory.go), and U and V come back. A run starts before any
// calibration, so the projectors are drawn gaussian (Draw) until the
// first check.
//
// The subspace Adam moments are kept as they are across a refresh (as
// GaLore keeps its moments across a projection change): no carry-over,
// no acceptance test, no re-warm. The reports give each matrix's capture
// of the summed calibration gradient before and after (Capture, on the
// host: m n d flops per matrix, skipped above captureMaxFlops).

package lsp

import (
	"errors"
	"fmt"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/rsvd"
)

// SVDOversample and SVDPower are the randomized SVD's oversampling p and
// power iterations q for the svd projectors' refresh.
const SVDOversample, SVDPower = 10, 2

// captureMaxFlops bounds the host work of a report's capture per matrix
// (m n d): above it CaptureBefore and CaptureAfter are left 0.
const captureMaxFlops = 1 << 30

// SVDGroup is one input's refresh: P (M rows) from its readers' stacked
// gradients (Ns columns each), each reader's Q from its own, rank D;
// Count such refreshes per check (one per layer).
type SVDGroup struct {
	M     int
	Ns    []int
	D     int
	Count int
}

// SVDGroups lists the svd refreshes of one projector check of arch (none
// unless c's projectors are svd): what the planner costs a check by.
func SVDGroups(arch model.Arch, c Config) ([]SVDGroup, error) {
	x, err := model.NewIndex(arch)
	if err != nil {
		return nil, fmt.Errorf("lsp: %w", err)
	}
	return svdGroups(x, c), nil
}

func svdGroups(x *model.Index, c Config) []SVDGroup {
	if c.Projector != KindSVD {
		return nil
	}
	d, _ := Dims(x, c)
	var out []SVDGroup
	for _, readers := range x.Readers {
		k := readers[0]
		g := SVDGroup{M: x.Mats[k].M, D: d[k], Count: len(x.Blocks)}
		for _, j := range readers {
			g.Ns = append(g.Ns, x.Mats[j].N)
		}
		out = append(out, g)
	}
	return out
}

// cols is the stacked gradient's width, the sum of Ns.
func (g SVDGroup) cols() int {
	n := 0
	for _, v := range g.Ns {
		n += v
	}
	return n
}

// shapes are the matrices the group's SVDs run on: the stacked gradient,
// then each reader's when there are several.
func (g SVDGroup) shapes() [][2]int {
	out := [][2]int{{g.M, g.cols()}}
	if len(g.Ns) > 1 {
		for _, n := range g.Ns {
			out = append(out, [2]int{g.M, n})
		}
	}
	return out
}

// Bytes is the device memory of the group's refresh with gradients of
// dtype dt: the gradient scratch (m x sum n of dt), U (m x d) and V (sum
// n x d) fp32, and the largest of its SVDs' workspaces (one at a time).
func (g SVDGroup) Bytes(dt backend.DType) int64 {
	N := int64(g.cols())
	var ws int64
	for _, s := range g.shapes() {
		ws = max(ws, rsvd.WorkspaceBytes(s[0], s[1], g.D, SVDOversample, dt))
	}
	return int64(g.M)*N*int64(dt.Size()) + 4*int64(g.M)*int64(g.D) + 4*N*int64(g.D) + ws
}

// FLOPs is the arithmetic of one refresh of the group (rsvd.FLOPs of
// each of its SVDs), once; Count per check.
func (g SVDGroup) FLOPs() float64 {
	var f float64
	for _, s := range g.shapes() {
		f += rsvd.FLOPs(s[0], s[1], g.D, SVDOversample, SVDPower)
	}
	return f
}

// HostFLOPs is the share of FLOPs that runs on the host (rsvd's small
// factorisations), which the planner prices at the host's rate.
func (g SVDGroup) HostFLOPs() float64 {
	var f float64
	for _, s := range g.shapes() {
		f += rsvd.HostFLOPs(s[0], s[1], g.D, SVDOversample, SVDPower)
	}
	return f
}

// svdBytes is the device memory of a check's largest refresh (0 unless
// the projectors are svd): reserved from Init on as the fit's is.
func svdBytes(x *model.Index, c Config, dt backend.DType) int64 {
	var most int64
	for _, g := range svdGroups(x, c) {
		most = max(most, g.Bytes(dt))
	}
	return most
}

// denseProjector is the dense projector of rows x d whose row-major
// values are val (every row holds all d columns, ascending).
func denseProjector(rows, d int, val []float32) (*Projector, error) {
	p := &Projector{M: rows, D: d, R: d, Idx: make([]int32, rows*d), Val: val}
	for i := range rows {
		for a := range d {
			p.Idx[i*d+a] = int32(a)
		}
	}
	if err := p.RebuildColumns(); err != nil {
		return nil, err
	}
	return p, p.Validate()
}

// svdRefresh replaces the projectors of layer l's matrices by the
// singular vectors of their calibration gradients (sums: the check's
// groups, summed together) and returns one report per matrix, in matrix
// order.
func (st *State) svdRefresh(l int, sums []gradSum, step int) ([]CheckReport, error) {
	var w float64
	for _, s := range sums {
		w += s.w
	}
	G := make([][]float32, len(st.Mats[l]))
	for k := range G {
		for _, s := range sums {
			if s.g == nil {
				continue
			}
			if G[k] == nil {
				G[k] = make([]float32, len(s.g[k]))
			}
			for e, v := range s.g[k] {
				G[k][e] += v
			}
		}
		for e := range G[k] {
			G[k][e] /= float32(w)
		}
	}
	// The refresh allocates in the bytes held for it, and frees them
	// before they are taken back.
	st.releaseFit()
	var reports []CheckReport
	for _, x := range st.Mats[l] {
		if x.In.Mats[0] != x {
			continue
		}
		gs := make([][]float32, len(x.In.Mats))
		for i, y := range x.In.Mats {
			gs[i] = G[y.K]
		}
		rs, err := st.svdInput(x.In, gs, step)
		if err != nil {
			st.reserveFit()
			return nil, fmt.Errorf("lsp: svd projectors of %s: %w", x.Name, err)
		}
		reports = append(reports, rs...)
	}
	return reports, st.reserveFit()
}

// svdInput refreshes one input's P and its readers' Qs from their
// gradients gs (in the order of in.Mats).
func (st *State) svdInput(in *Input, gs [][]float32, step int) ([]CheckReport, error) {
	t0 := time.Now()
	be, s, dt := st.env.Backend, st.env.Stream, st.env.DType
	m, d := in.M, in.D
	ns := make([]int, len(in.Mats))
	for i, y := range in.Mats {
		ns[i] = y.N
	}
	g := SVDGroup{M: m, Ns: ns, D: d}
	N := g.cols()
	var bufs []backend.Tensor
	defer func() {
		for _, t := range bufs {
			be.Free(t)
		}
	}()
	alloc := func(name string, n int, dt backend.DType) (backend.Tensor, error) {
		t, err := be.Alloc(name, n, dt)
		if err == nil {
			bufs = append(bufs, t)
		}
		return t, err
	}
	gBuf, err := alloc("svd refresh gradient", m*N, dt)
	if err != nil {
		return nil, err
	}
	uBuf, err := alloc("svd refresh U", m*d, backend.F32)
	if err != nil {
		return nil, err
	}
	vBuf, err := alloc("svd refresh V", N*d, backend.F32)
	if err != nil {
		return nil, err
	}
	// svd runs the top-d SVD of the m x n host matrix a and returns U and
	// V, downloaded.
	svd := func(a []float32, n int, seed uint64) (U, V []float32, err error) {
		ws, err := rsvd.NewWorkspace(be, m, n, d, SVDOversample, dt)
		if err != nil {
			return nil, nil, err
		}
		defer ws.Free()
		Gt, Ut, Vt := gBuf.Slice(0, m*n, m, n), uBuf.Reshape(m, d), vBuf.Slice(0, n*d, n, d)
		if err := backend.Upload(be, s, Gt, a); err != nil {
			return nil, nil, err
		}
		if _, err := ws.Compute(s, Gt, Ut, Vt, SVDPower, seed); err != nil {
			return nil, nil, err
		}
		if U, err = backend.Download(be, s, Ut); err != nil {
			return nil, nil, err
		}
		V, err = backend.Download(be, s, Vt)
		return U, V, err
	}
	seed := st.env.Seed ^ uint64(step)<<20 ^ uint64(in.Mats[0].ID)<<8
	var stacked []float32
	if len(gs) == 1 {
		stacked = gs[0]
	} else {
		stacked = make([]float32, m*N)
		for r := range m {
			o := r * N
			for i, gi := range gs {
				o += copy(stacked[o:], gi[r*ns[i]:(r+1)*ns[i]])
			}
		}
	}
	U, V, err := svd(stacked, N, seed)
	if errors.Is(err, rsvd.ErrRankDeficient) {
		return st.svdKept(in, time.Since(t0)), nil // a zero gradient: nothing to align to
	}
	if err != nil {
		return nil, err
	}
	P, err := denseProjector(m, d, U)
	if err != nil {
		return nil, err
	}
	Qs := make([]*Projector, len(gs))
	for i, gi := range gs {
		if len(gs) > 1 {
			if _, V, err = svd(gi, ns[i], seed+1+uint64(i)); err != nil && !errors.Is(err, rsvd.ErrRankDeficient) {
				return nil, err
			}
			if err != nil { // a zero gradient of this reader: its Q stays
				Qs[i] = in.Mats[i].Q
				continue
			}
		}
		if Qs[i], err = denseProjector(ns[i], d, V); err != nil {
			return nil, err
		}
	}
	reps := make([]CheckReport, len(gs))
	for i, x := range in.Mats {
		rp := &reps[i]
		rp.Matrix, rp.Resampled = x.Name, true
		if m*ns[i]*d <= captureMaxFlops {
			if rp.CaptureBefore, err = Capture(in.P, x.Q, gs[i]); err != nil {
				return nil, fmt.Errorf("capture of %s: %w", x.Name, err)
			}
			if rp.CaptureAfter, err = Capture(P, Qs[i], gs[i]); err != nil {
				return nil, fmt.Errorf("capture of %s: %w", x.Name, err)
			}
		}
		x.Q = Qs[i]
		if err := st.uploadQ(x); err != nil {
			return nil, err
		}
	}
	in.P = P
	if err := st.uploadP(in); err != nil {
		return nil, err
	}
	secs := time.Since(t0).Seconds()
	for i := range reps {
		reps[i].Seconds = secs
	}
	return reps, nil
}

// svdKept is the reports of an input whose projectors a refresh keeps.
func (st *State) svdKept(in *Input, took time.Duration) []CheckReport {
	reps := make([]CheckReport, len(in.Mats))
	for i, x := range in.Mats {
		reps[i] = CheckReport{Matrix: x.Name, Seconds: took.Seconds()}
	}
	return reps
}
