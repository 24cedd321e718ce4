// The projector fit on a Backend: FitSamplesOn runs the host fit of
// fit.go (FitSamples: the bias objective ||P P^T G Q Q^T - G||^2 /
// ||G||^2, its analytic gradient in the projectors' values and Adam on
// those values) through Backend ops, so that on a GPU a check costs
// device time instead of float64 host time.
// The host keeps only the control flow: the fresh draw (FreshDraw, the
// same positions and values the host fit draws), the scale match, the
// stopping test and the choice of the best point, on a few scalars read
// back once per evaluation.
//
// Products, all fp32 on the backend (the derivation is bias.go's:
// S = P^T G Q, A = P^T P, B = Q^T Q, H/2 = A S B - 2 S):
//
//	G Q            SparseCompressB(G [m,n], Q by column)
//	P^T G          SparseCompressA(G^T [n,m], P by column)   (G^T uploaded once)
//	S              SparseCompressB(P^T G, Q by column)
//	S^T            SparseCompressA(P^T G, Q by column)
//	A, B           EncoderBackward (a scatter, C=1) of X's values into dense
//	               X^T [d,rows], then SparseCompressB(X^T, X by column)
//	A S, S B, H,   SparseS with BT = d (d x d fp32 products, no transposes;
//	S B S^T, S^T A S   H accumulated onto -2 S)
//	||S||^2        SumSquares (float64 sums)
//	||R||^2        <A S, S B>: SparseS as a 1 x 1 product over d*d terms
//	gradients      SparseValueGrad (the one op of its own, kernels/fit.cu)
//	column values  EncoderForward (a gather, C=1) of the row values
//	Adam           AdamW with no decay, clipping or skip
//	best point     CopyD2D
//
// Orthogonality penalty (FitOptions.Ortho): with t = tr(A)/d = ||X||^2/d,
// pen = ||A||^2 / (t^2 d) - 1 and its gradient (c/t) X A - c (1 + shrink)
// X (c = 4/(d t), shrink = (||A||^2/t - d t)/(t d)), from two SumSquares
// and one SparseValueGrad without Y.
//
// Tolerance against the host fit (devicefit_test.go, on ragged problems, on
// the CPU backend and the simulated CUDA runtime): the objective's terms
// are fp32 products where the host sums in float64 (||R||^2 a sequential
// fp32 sum of d^2 terms), and Adam's masters are the fp32 values
// themselves where the host keeps float64 masters and rounds. At the same
// projectors the objective and ratios agree within 1e-5 and every
// gradient entry within 2e-6 of the largest (about 2e-7 seen); after 15
// Adam steps from the same draw the decisions are the same, the ratios
// within 1e-5 and the values within 2e-5 of the largest (about 1e-6
// seen). ratio^2 = (||R||^2 - 2 ||S||^2 + ||G||^2) / ||G||^2 cancels: with
// fp32 terms it is known to about 1e-6, so a ratio r to about 1e-6/(2r)
// (5e-5 at r = 1e-2); the fit stops far above that (alpha is 0.5 by
// default).
//
// Speed (BenchmarkFitGPT2, a GPT-2 block's four fits at d 512, r 16, 3
// Adam steps, on 2 shared cores): 1.3 s on the CPU backend against 7.9 to
// 8.8 s for the host float64 fit. In a check the held-out capture and the
// moment carry-over, still float64 on the host (measure.go, carry.go),
// now cost more than the fit.
//
// Memory: every gradient sample twice (G and G^T) plus a few d x d and
// d x max(m, n) fp32 buffers, allocated per fit and freed at its end;
// FitBytes gives the total so that the memory plan can count it.

package lsp

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// FitBytes is the device memory a fit allocates for a shared-P group: P
// m x d, one Q per entry of ns (n_k x d), r non-zeros per row, on
// samples gradient samples.
func FitBytes(m int, ns []int, d, r, samples int) int64 {
	maxN, sumN := 0, 0
	for _, n := range ns {
		maxN, sumN = max(maxN, n), sumN+n
	}
	f := int64(4)
	nnz := int64(m+sumN) * int64(r)
	var b int64
	b += 2 * int64(samples) * int64(m) * int64(sumN) * f // G and G^T
	b += nnz * f * 6                                     // vals, grads, Adam m and v, best, scratch
	b += nnz * f * 4                                     // idx, rowidx, colval, slot (+ flat indices below)
	b += nnz * f                                         // flat transposed indices
	b += int64(len(ns)+1) * int64(d+1) * f               // colptr
	b += int64(d) * int64(max(m, maxN)) * f              // dense X^T
	b += int64(m) * int64(d) * f                         // G Q
	b += int64(d) * int64(maxN) * f                      // P^T G
	b += int64(len(ns)+1+8) * int64(d) * int64(d) * f    // grams and the d x d products
	b += int64(backend.SumSquaresWork) * 8               // SumSquares' work
	b += int64(2*samples*len(ns)+4*(len(ns)+1)) * f      // sums
	// Each buffer may be rounded up to a 256-byte block (the CUDA arena).
	buffers := 6 + 7*(len(ns)+1) + 3 + 7 + 2 + 2*samples*len(ns)
	return b + 256*int64(buffers)
}

// FitStaging is the pinned host memory a fit copies through: one gradient
// (and then its transpose) at a time, and the values, indices and sums
// that go up and come back. A caller that fits at every check (the
// engine) allocates it once (NewStaging, sized by StagingBytes over its
// fits) and passes it to each fit, so that a check allocates no host
// memory; FitSamples without one allocates and frees its own.
type FitStaging struct {
	grad, small backend.HostBuffer
}

// FitStagingBytes is the size of the two host buffers a fit of a shared-P
// group (as Bytes) copies through.
func FitStagingBytes(m int, ns []int, d, r, samples int) (grad, small int) {
	maxN, sumN := 0, 0
	for _, n := range ns {
		maxN, sumN = max(maxN, n), sumN+n
	}
	nsum := 2*samples*len(ns) + 2*(len(ns)+1)
	return 4 * m * maxN, 4 * max(nsum, (m+sumN)*r, d+1)
}

// NewFitStaging allocates the buffers of StagingBytes' sizes on be.
func NewFitStaging(be backend.Backend, grad, small int) (*FitStaging, error) {
	g, err := be.AllocHost("projector fit gradient staging", grad)
	if err != nil {
		return nil, fmt.Errorf("device fit: %w", err)
	}
	sm, err := be.AllocHost("projector fit staging", small)
	if err != nil {
		be.FreeHost(g)
		return nil, fmt.Errorf("device fit: %w", err)
	}
	return &FitStaging{grad: g, small: sm}, nil
}

// Free frees the buffers (nothing may be copying through them).
func (st *FitStaging) Free(be backend.Backend) {
	if st != nil {
		be.FreeHost(st.grad)
		be.FreeHost(st.small)
	}
}

// deviceProj is one projector's device storage: row positions and values (a
// view into the fit's value buffer), column storage, the gather and
// scatter indices, and its Gram matrix.
type deviceProj struct {
	off     int // of its values in the value buffer
	idx     backend.Tensor
	val     backend.Tensor // view of fit.vals
	grad    backend.Tensor // view of fit.grads
	colptr  backend.Tensor
	rowidx  backend.Tensor
	colval  backend.Tensor
	slot    backend.Tensor // column entry k holds row entry slot[k]
	flatT   backend.Tensor // idx*rows + row: the entry's place in dense X^T
	gram    backend.Tensor // X^T X [d,d]
	orthoW  float64        // weight of its orthogonality penalty
	n2, a2  int            // places of ||X||^2 and ||X^T X||^2 among the sums
	nnz, rs int
}

// deviceFit is one FitSamples call's device state.
type deviceFit struct {
	be      backend.Backend
	s       backend.Stream
	opts    FitOptions
	d, r    int
	samples [][][]float32
	g2s     [][]float64
	bufs    []backend.Tensor // to free

	G, Gt []backend.Tensor // per sample j and matrix k: index j*K+k
	// Values, their gradients, Adam's moments and the best point so far,
	// P's then each Q's, one buffer each so that one AdamW steps them all.
	vals, grads, m1, v1, best, tmp backend.Tensor
	ps                             []*deviceProj // P then the Qs
	xt, gq, ptg                    backend.Tensor
	S, St, AS, SB, H, K, L         backend.Tensor
	work                           backend.Tensor
	sums                           backend.Tensor // [2 per (j,k)] ||S||^2, ||R||^2, then per projector ||X||^2, ||A||^2
	// host stages the gradients (m x max n), small the projectors, the
	// values and the sums read back, so that a fit without data (TraceFit)
	// never touches the large one.
	host, small backend.HostBuffer
	stg         *FitStaging // where host and small come from
	ownStaging  bool        // stg was allocated by this fit (free frees it)
	nsum        int
	noData      bool // TraceFit: the gradients are never written
}

// deviceEval is what the host reads back: the objective, per matrix the
// ratio, and ||S||^2, ||R||^2 over ||G||^2 (averaged over samples).
type deviceEval struct {
	obj            float64
	ratios, s2, r2 []float64
	ortho          []orthoTerms // per projector, when opts.Ortho > 0
}

// orthoTerms are one projector's penalty scalars.
type orthoTerms struct{ t, a2 float64 }

func (f *deviceFit) alloc(name string, n int, dt backend.DType) (backend.Tensor, error) {
	t, err := f.be.Alloc("device fit "+name, n, dt)
	if err != nil {
		return backend.Tensor{}, fmt.Errorf("device fit: allocating %s: %w", name, err)
	}
	f.bufs = append(f.bufs, t)
	return t, nil
}

func (f *deviceFit) free() {
	for _, t := range f.bufs {
		f.be.Free(t)
	}
	if f.ownStaging {
		for _, h := range []backend.HostBuffer{f.host, f.small} {
			if h != nil {
				f.be.FreeHost(h)
			}
		}
	}
}

// FitSamplesOn is FitSamplesOn run on be, on stream s: the same checks,
// fresh draw, scale match, Adam iterations, stopping rule and choice of
// the best point, with the objective, its gradient and Adam's steps
// computed by be's ops in fp32 (see the package doc for the tolerance).
// It synchronizes s once per evaluation; it leaves no work queued.
func FitSamplesOn(be backend.Backend, s backend.Stream, P *Projector, Qs []*Projector, samples [][][]float32, alpha float64, opts FitOptions) ([]FitResult, error) {
	return FitSamplesStaged(be, s, nil, P, Qs, samples, alpha, opts)
}

// FitSamplesStaged is FitSamples copying through stg (nil: buffers of its
// own), which must be at least StagingBytes for this fit.
func FitSamplesStaged(be backend.Backend, s backend.Stream, stg *FitStaging, P *Projector, Qs []*Projector, samples [][][]float32, alpha float64, opts FitOptions) ([]FitResult, error) {
	g2s, err := CheckFitSamples(P, Qs, samples, alpha, opts)
	if err != nil {
		return nil, err
	}
	f := &deviceFit{be: be, s: s, opts: opts, d: P.D, r: P.R, samples: samples, g2s: g2s, stg: stg}
	defer f.free()
	if err := f.setup(P, Qs); err != nil {
		return nil, err
	}
	before, err := f.evaluateAt(P, Qs)
	if err != nil {
		return nil, err
	}
	res, nP, nQs, err := startFit(P, Qs, before.ratios, alpha, opts.Seed)
	if err != nil || nP == nil {
		return res, err
	}
	ev, err := f.evaluateAt(nP, nQs)
	if err != nil {
		return nil, err
	}
	if err := MatchScale(nP, nQs, ev.s2, ev.r2); err != nil {
		return nil, err
	}
	if err := f.uploadValues(nP, nQs); err != nil {
		return nil, err
	}
	// Adam's moments start at zero (Alloc zeroes, but a second fit of the
	// same buffers would not).
	if err := be.Fill(s, f.m1, 0); err != nil {
		return nil, fmt.Errorf("device fit: %w", err)
	}
	if err := be.Fill(s, f.v1, 0); err != nil {
		return nil, fmt.Errorf("device fit: %w", err)
	}

	best := deviceEval{obj: math.Inf(1)}
	iters := 0
	for {
		ev, err := f.evaluate(iters < opts.MaxIters)
		if err != nil {
			return nil, err
		}
		if ev.obj < best.obj {
			best = ev
			if err := be.CopyD2D(s, f.best, f.vals); err != nil {
				return nil, fmt.Errorf("device fit: keeping the best values: %w", err)
			}
		}
		if AllWithin(ev.ratios, alpha) || iters == opts.MaxIters {
			break
		}
		if math.IsNaN(ev.obj) || math.IsInf(ev.obj, 0) {
			return nil, fmt.Errorf("lsp fit: objective %v after %d steps (lower the projector learning rate)", ev.obj, iters)
		}
		iters++
		if opts.Ortho > 0 {
			if err := f.orthoGrad(ev); err != nil {
				return nil, err
			}
		}
		p := backend.AdamParams{LR: float32(opts.LR), Beta1: FitBeta1, Beta2: FitBeta2, Eps: FitEps, Step: iters}
		if err := be.AdamW(s, f.vals, backend.Tensor{}, f.grads, f.m1, f.v1, backend.Tensor{}, backend.Tensor{}, p); err != nil {
			return nil, fmt.Errorf("device fit: Adam step %d: %w", iters, err)
		}
	}

	for k := range res {
		res[k].Iters = iters
	}
	if !(best.obj < before.obj) {
		for k := range res {
			res[k].Reached = before.ratios[k] <= alpha
		}
		return res, f.sync()
	}
	if err := f.downloadBest(nP, nQs); err != nil {
		return nil, err
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

func (f *deviceFit) sync() error {
	if err := f.be.Synchronize(f.s); err != nil {
		return fmt.Errorf("device fit: %w", err)
	}
	return nil
}

// setup allocates everything and uploads the gradient samples and their
// transposes.
func (f *deviceFit) setup(P *Projector, Qs []*Projector) error {
	d, r := f.d, f.r
	m := P.M
	total, maxRows := P.M*r, m
	all := append([]*Projector{P}, Qs...)
	for _, q := range Qs {
		total += q.M * r
		maxRows = max(maxRows, q.M)
	}
	var err error
	for _, p := range []*backend.Tensor{&f.vals, &f.grads, &f.m1, &f.v1, &f.best, &f.tmp} {
		if *p, err = f.alloc("values", total, backend.F32); err != nil {
			return err
		}
	}
	off := 0
	for k, p := range all {
		x := &deviceProj{off: off, nnz: p.M * r, rs: p.M}
		x.val, x.grad = f.vals.Slice(off, x.nnz), f.grads.Slice(off, x.nnz)
		off += x.nnz
		for _, t := range []*backend.Tensor{&x.idx, &x.rowidx, &x.slot, &x.flatT} {
			if *t, err = f.alloc("indices", x.nnz, backend.I32); err != nil {
				return err
			}
		}
		if x.colptr, err = f.alloc("colptr", d+1, backend.I32); err != nil {
			return err
		}
		if x.colval, err = f.alloc("column values", x.nnz, backend.F32); err != nil {
			return err
		}
		if x.gram, err = f.alloc("gram", d*d, backend.F32); err != nil {
			return err
		}
		x.orthoW = f.opts.Ortho
		if k > 0 {
			x.orthoW = f.opts.Ortho / float64(len(Qs))
		}
		f.ps = append(f.ps, x)
	}
	maxN := 0
	for _, q := range Qs {
		maxN = max(maxN, q.M)
	}
	if f.xt, err = f.alloc("dense X^T", d*maxRows, backend.F32); err != nil {
		return err
	}
	if f.gq, err = f.alloc("G Q", m*d, backend.F32); err != nil {
		return err
	}
	if f.ptg, err = f.alloc("P^T G", d*maxN, backend.F32); err != nil {
		return err
	}
	for _, t := range []*backend.Tensor{&f.S, &f.St, &f.AS, &f.SB, &f.H, &f.K, &f.L} {
		if *t, err = f.alloc("d x d", d*d, backend.F32); err != nil {
			return err
		}
	}
	if f.work, err = f.alloc("sum work", backend.SumSquaresWork, backend.F64); err != nil {
		return err
	}
	f.nsum = 2*len(f.samples)*len(Qs) + 2*len(all)
	if f.sums, err = f.alloc("sums", f.nsum, backend.F32); err != nil {
		return err
	}
	for k, x := range f.ps {
		x.n2, x.a2 = 2*len(f.samples)*len(Qs)+2*k, 2*len(f.samples)*len(Qs)+2*k+1
	}
	var ns []int
	for _, q := range Qs {
		ns = append(ns, q.M)
	}
	gb, sb := FitStagingBytes(m, ns, d, f.r, len(f.samples))
	if f.stg == nil {
		if f.stg, err = NewFitStaging(f.be, gb, sb); err != nil {
			return err
		}
		f.ownStaging = true
	}
	f.host, f.small = f.stg.grad, f.stg.small
	// A caller's staging is checked (its own is right by construction, and
	// reading its size would make a tracing backend's large one real).
	if !f.ownStaging && (len(f.host.Bytes()) < gb || len(f.small.Bytes()) < sb) {
		return fmt.Errorf("device fit: staging of %d and %d bytes, this fit needs %d and %d", len(f.host.Bytes()), len(f.small.Bytes()), gb, sb)
	}
	// The samples, and their transposes (P^T G is compress A of G^T).
	for j, Gs := range f.samples {
		for k, G := range Gs {
			n := Qs[k].M
			g, err := f.alloc(fmt.Sprintf("G %d/%d", j, k), m*n, backend.F32)
			if err != nil {
				return err
			}
			gt, err := f.alloc(fmt.Sprintf("G^T %d/%d", j, k), n*m, backend.F32)
			if err != nil {
				return err
			}
			if !f.noData {
				copy(f.host.Float32(), G)
			}
			if err := f.copyIn(g, f.host); err != nil {
				return err
			}
			if !f.noData {
				h := f.host.Float32()
				for i := range m {
					for c := range n {
						h[c*m+i] = G[i*n+c]
					}
				}
			}
			if err := f.copyIn(gt, f.host); err != nil {
				return err
			}
			f.G, f.Gt = append(f.G, g), append(f.Gt, gt)
		}
	}
	return nil
}

// upload copies host values into t through the small staging buffer and
// waits (the staging buffer is reused at once).
func (f *deviceFit) upload(t backend.Tensor, v []float32) error {
	copy(f.small.Float32(), v)
	return f.copyIn(t, f.small)
}

// copyIn copies the start of h into t and waits.
func (f *deviceFit) copyIn(t backend.Tensor, h backend.HostBuffer) error {
	if err := f.be.CopyH2D(f.s, t, h, 0); err != nil {
		return fmt.Errorf("device fit: uploading %v: %w", t, err)
	}
	return f.sync()
}

func (f *deviceFit) uploadInts(t backend.Tensor, v []int32) error {
	b := f.small.Bytes()
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return f.copyIn(t, f.small)
}

// load uploads the positions (row and column storage, gather and scatter
// indices) and the values of P and the Qs.
func (f *deviceFit) load(P *Projector, Qs []*Projector) error {
	for k, p := range append([]*Projector{P}, Qs...) {
		x := f.ps[k]
		slot := make([]int32, x.nnz)
		flat := make([]int32, x.nnz)
		for c := range p.D {
			for e := p.ColPtr[c]; e < p.ColPtr[c+1]; e++ {
				i := int(p.RowIdx[e])
				for s := i * p.R; s < (i+1)*p.R; s++ {
					if int(p.Idx[s]) == c {
						slot[e] = int32(s)
						break
					}
				}
			}
		}
		for e, c := range p.Idx {
			flat[e] = c*int32(p.M) + int32(e/p.R)
		}
		for _, u := range []struct {
			t backend.Tensor
			v []int32
		}{{x.idx, p.Idx}, {x.colptr, p.ColPtr}, {x.rowidx, p.RowIdx}, {x.slot, slot}, {x.flatT, flat}} {
			if err := f.uploadInts(u.t, u.v); err != nil {
				return err
			}
		}
	}
	return f.uploadValues(P, Qs)
}

// uploadValues uploads the row values of P and the Qs.
func (f *deviceFit) uploadValues(P *Projector, Qs []*Projector) error {
	for k, p := range append([]*Projector{P}, Qs...) {
		if err := f.upload(f.ps[k].val, p.Val); err != nil {
			return err
		}
	}
	return nil
}

// downloadBest copies the best values into P's and the Qs' row storage.
func (f *deviceFit) downloadBest(P *Projector, Qs []*Projector) error {
	if err := f.be.CopyD2H(f.s, f.small, 0, f.best); err != nil {
		return fmt.Errorf("device fit: downloading the fitted values: %w", err)
	}
	if err := f.sync(); err != nil {
		return err
	}
	h := f.small.Float32()
	for k, p := range append([]*Projector{P}, Qs...) {
		copy(p.Val, h[f.ps[k].off:f.ps[k].off+len(p.Val)])
		if err := p.SyncValues(); err != nil {
			return fmt.Errorf("lsp fit: %w", err)
		}
	}
	return nil
}

// prepare brings a projector's column values and Gram matrix up to date
// with its row values.
func (f *deviceFit) prepare(x *deviceProj) error {
	be, s, d := f.be, f.s, f.d
	nnz := x.nnz
	// Column values: colval[k] = val[slot[k]], the encoder's row gather
	// with one-element rows.
	if err := be.EncoderForward(s, x.colval.Reshape(1, nnz, 1), x.slot.Reshape(1, nnz), backend.Tensor{}, x.val.Reshape(nnz, 1), backend.Tensor{}, 1, nnz, 1); err != nil {
		return fmt.Errorf("device fit: column values: %w", err)
	}
	// Dense X^T by the encoder backward's scatter, then X^T X by compress
	// B of it with X by column.
	xt := f.xt.Slice(0, d*x.rs)
	if err := be.Fill(s, xt, 0); err != nil {
		return fmt.Errorf("device fit: %w", err)
	}
	if err := be.EncoderBackward(s, xt.Reshape(d*x.rs, 1), backend.Tensor{}, x.val.Reshape(1, nnz, 1), x.flatT.Reshape(1, nnz), backend.Tensor{}, 1, nnz, 1); err != nil {
		return fmt.Errorf("device fit: dense projector: %w", err)
	}
	if err := be.SparseCompressB(s, x.gram, xt, x.colptr, x.rowidx, x.colval, d, x.rs, d); err != nil {
		return fmt.Errorf("device fit: Gram matrix: %w", err)
	}
	if f.opts.Ortho > 0 {
		if err := be.SumSquares(s, f.sums.Slice(x.n2, 1), x.val, f.work); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
		if err := be.SumSquares(s, f.sums.Slice(x.a2, 1), x.gram, f.work); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
	}
	return nil
}

// evaluateAt loads P and the Qs and evaluates the objective there, without
// its gradient.
func (f *deviceFit) evaluateAt(P *Projector, Qs []*Projector) (deviceEval, error) {
	if err := f.load(P, Qs); err != nil {
		return deviceEval{}, err
	}
	return f.evaluate(false)
}

// evaluate enqueues the objective's terms (and, with grad, its gradient
// into f.grads) at the values in f.vals, reads the scalars back and
// returns the evaluation.
func (f *deviceFit) evaluate(grad bool) (deviceEval, error) {
	be, s, d, r := f.be, f.s, f.d, f.r
	for _, x := range f.ps {
		if err := f.prepare(x); err != nil {
			return deviceEval{}, err
		}
	}
	p := f.ps[0]
	m := p.rs
	nq := len(f.ps) - 1
	w := 1 / float64(len(f.samples))
	for j := range f.samples {
		for k := range nq {
			q := f.ps[k+1]
			n := q.rs
			G, Gt := f.G[j*nq+k], f.Gt[j*nq+k]
			ptg := f.ptg.Slice(0, d*n)
			sum := f.sums.Slice(2*(j*nq+k), 2)
			steps := []struct {
				what string
				run  func() error
			}{
				{"G Q", func() error { return be.SparseCompressB(s, f.gq, G, q.colptr, q.rowidx, q.colval, m, n, d) }},
				{"P^T G", func() error { return be.SparseCompressA(s, ptg, Gt, p.colptr, p.rowidx, p.colval, n, m, d) }},
				{"S", func() error { return be.SparseCompressB(s, f.S, ptg, q.colptr, q.rowidx, q.colval, d, n, d) }},
				{"||S||^2", func() error { return be.SumSquares(s, sum.Slice(0, 1), f.S, f.work) }},
				{"A S", func() error { return be.SparseS(s, f.AS, p.gram, f.S, d, d, false) }},
				{"S B", func() error { return be.SparseS(s, f.SB, f.S, q.gram, d, d, false) }},
				{"||R||^2", func() error {
					return be.SparseS(s, sum.Slice(1, 1), f.AS.Reshape(1, d*d), f.SB.Reshape(d*d, 1), d*d, 1, false)
				}},
			}
			if grad {
				wg := float32(w * 2 / f.g2s[j][k])
				steps = append(steps, []struct {
					what string
					run  func() error
				}{
					{"S^T", func() error { return be.SparseCompressA(s, f.St, ptg, q.colptr, q.rowidx, q.colval, d, n, d) }},
					// H/2 = A S B - 2 S, accumulated onto -2 S (bias.go's
					// factor 2 is in wg, with 1/||G||^2).
					{"H", func() error { return be.CopyD2D(s, f.H, f.S) }},
					{"H", func() error { return be.Scale(s, f.H, -2) }},
					{"H", func() error { return be.SparseS(s, f.H, f.AS, q.gram, d, d, true) }},
					{"S B S^T", func() error { return be.SparseS(s, f.K, f.SB, f.St, d, d, false) }},
					{"S^T A S", func() error { return be.SparseS(s, f.L, f.St, f.AS, d, d, false) }},
					{"P's gradient", func() error {
						return be.SparseValueGrad(s, p.grad, f.gq, f.H, f.K, p.idx, p.val, m, d, r, wg, false, j > 0 || k > 0)
					}},
					{"Q's gradient", func() error {
						return be.SparseValueGrad(s, q.grad, ptg, f.H, f.L, q.idx, q.val, n, d, r, wg, true, j > 0)
					}},
				}...)
			}
			for _, st := range steps {
				if err := st.run(); err != nil {
					return deviceEval{}, fmt.Errorf("device fit: %s of matrix %d: %w", st.what, k, err)
				}
			}
		}
	}
	if err := be.CopyD2H(s, f.small, 0, f.sums); err != nil {
		return deviceEval{}, fmt.Errorf("device fit: reading the objective back: %w", err)
	}
	if err := f.sync(); err != nil {
		return deviceEval{}, err
	}
	h := f.small.Float32()
	ev := deviceEval{ratios: make([]float64, nq), s2: make([]float64, nq), r2: make([]float64, nq)}
	for j := range f.samples {
		for k := range nq {
			g2 := f.g2s[j][k]
			s2, r2 := float64(h[2*(j*nq+k)]), float64(h[2*(j*nq+k)+1])
			fk := r2 - 2*s2 + g2
			ev.obj += w * fk / g2
			ev.ratios[k] += w * max(fk, 0) / g2
			ev.s2[k] += w * s2 / g2
			ev.r2[k] += w * r2 / g2
		}
	}
	for k, v := range ev.ratios {
		ev.ratios[k] = math.Sqrt(v)
	}
	if f.opts.Ortho > 0 {
		for _, x := range f.ps {
			t := float64(h[x.n2]) / float64(d)
			a2 := float64(h[x.a2])
			ev.ortho = append(ev.ortho, orthoTerms{t: t, a2: a2})
			if t > 0 {
				ev.obj += x.orthoW * (a2/(t*t*float64(d)) - 1)
			}
		}
	}
	return ev, nil
}

// orthoGrad adds the orthogonality penalty's gradient to f.grads, from
// the scalars of the evaluation just read back (lsp's orthoPenalty:
// (c/t) X A - c (1 + shrink) X, weighted).
func (f *deviceFit) orthoGrad(ev deviceEval) error {
	be, s, d := f.be, f.s, float64(f.d)
	for k, x := range f.ps {
		t, a2 := ev.ortho[k].t, ev.ortho[k].a2
		if !(t > 0) {
			continue
		}
		c := 4 / (d * t)
		shrink := (a2/t - d*t) / (t * d)
		if err := be.SparseValueGrad(s, x.grad, backend.Tensor{}, backend.Tensor{}, x.gram, x.idx, x.val, x.rs, f.d, f.r, float32(x.orthoW*c/t), false, true); err != nil {
			return fmt.Errorf("device fit: orthogonality gradient: %w", err)
		}
		tmp := f.tmp.Slice(0, x.nnz)
		if err := be.CopyD2D(s, tmp, x.val); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
		if err := be.Scale(s, tmp, float32(-x.orthoW*c*(1+shrink))); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
		if err := be.Accumulate(s, x.grad, tmp); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
	}
	return nil
}

// TraceFit enqueues on be the ops of a fit of P's and the Qs' shapes on
// samples gradient samples that takes every one of iters Adam steps, with
// no gradient data (the uploads of G and G^T are enqueued from a staging
// buffer that is never written, so the results mean nothing): for a
// tracing backend, whose recorded ops the planner costs (train/plan). P
// and the Qs are left as they are.
func TraceFit(be backend.Backend, s backend.Stream, P *Projector, Qs []*Projector, samples, iters int, opts FitOptions) error {
	if samples < 1 || iters < 0 {
		return fmt.Errorf("device fit: trace of %d samples and %d steps", samples, iters)
	}
	f := &deviceFit{be: be, s: s, opts: opts, d: P.D, r: P.R, noData: true}
	for range samples {
		f.samples = append(f.samples, make([][]float32, len(Qs)))
		g2 := make([]float64, len(Qs))
		for k := range g2 {
			g2[k] = 1
		}
		f.g2s = append(f.g2s, g2)
	}
	defer f.free()
	if err := f.setup(P, Qs); err != nil {
		return err
	}
	// As FitSamples: the projectors in use, the fresh draw, its scale,
	// then every step, and the best values down.
	for range 2 {
		if _, err := f.evaluateAt(P, Qs); err != nil {
			return err
		}
	}
	if err := f.uploadValues(P, Qs); err != nil {
		return err
	}
	for _, t := range []backend.Tensor{f.m1, f.v1} {
		if err := be.Fill(s, t, 0); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
	}
	for it := range iters + 1 {
		ev, err := f.evaluate(it < iters)
		if err != nil {
			return err
		}
		if err := be.CopyD2D(s, f.best, f.vals); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
		if it == iters {
			break
		}
		if opts.Ortho > 0 {
			if err := f.orthoGrad(ev); err != nil {
				return err
			}
		}
		p := backend.AdamParams{LR: float32(opts.LR), Beta1: FitBeta1, Beta2: FitBeta2, Eps: FitEps, Step: it + 1}
		if err := be.AdamW(s, f.vals, backend.Tensor{}, f.grads, f.m1, f.v1, backend.Tensor{}, backend.Tensor{}, p); err != nil {
			return fmt.Errorf("device fit: %w", err)
		}
	}
	if err := be.CopyD2H(s, f.small, 0, f.best); err != nil {
		return fmt.Errorf("device fit: %w", err)
	}
	return f.sync()
}
