// adam.go: the fused CPU AdamW step over a batch of tensors (ZeRO-Offload's
// host optimizer) and its subspace form for LSP (d x d, update out), on the
// worker pool, with the NaN/Inf pre-scan that skips a bad tensor before any
// of its state is written.
//
// A step runs in two parallel phases: the pre-scan (sum of squares of each
// gradient, one partial per fixed chunk of AdamChunkLen elements; skipped
// when the caller supplies the norm), then the update of every tensor whose
// norm is finite. Workers take runs of whole chunks ("grabs") of shrinking
// length, as OpenMP's guided schedule does: long runs keep the number of cgo
// calls per step small (each call longer than a scheduler tick lets the Go
// runtime take the worker's P and wake a spinning thread on a busy core,
// which cost about a tenth of a 128M-parameter step with one call per
// chunk), short last runs balance the workers. Chunk boundaries depend only
// on tensor lengths and the C kernels give the same bits on every SIMD path,
// so results do not depend on the thread count, the grabs or the CPU.
// adam.h states the arithmetic; it follows torch.optim.AdamW (decoupled
// weight decay, eps outside the square root).
//
// Limits: fp32 weights and moments only; a tensor must not be in two
// in-flight steps at once, and the caller must not touch a submitted step's
// slices before its completion.

package host

/*
#cgo CFLAGS: -O3 -std=c11
#cgo LDFLAGS: -lm
#include "adam.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/klauspost/cpuid/v2"
)

// AdamChunkLen is the pre-scan's unit (one partial sum each, added in chunk
// order) and the smallest run of elements handed to a worker.
const AdamChunkLen = 1 << 16

// adamGuided sets the grab length: about remaining/(adamGuided*workers)
// chunks, so a step has about adamGuided*workers*ln(chunks) grabs.
const adamGuided = 2

// AdamParams are the AdamW hyperparameters of one tensor for one step.
type AdamParams struct {
	LR          float64 // learning rate, >= 0
	Beta1       float64 // first-moment decay, in [0, 1)
	Beta2       float64 // second-moment decay, in [0, 1)
	Eps         float64 // added to the bias-corrected sqrt(v), >= 0
	WeightDecay float64 // decoupled: w *= 1 - LR*WeightDecay; ignored for subspace tensors
	// ClipNorm, when > 0, scales the gradient by min(1, ClipNorm/(norm+1e-6))
	// (per tensor, as torch.nn.utils.clip_grad_norm_ on that tensor alone).
	ClipNorm float64
}

// AdamDefaults returns torch.optim.AdamW's defaults: lr 1e-3, betas (0.9,
// 0.999), eps 1e-8, weight decay 1e-2.
func AdamDefaults() AdamParams {
	return AdamParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 1e-2}
}

func (p AdamParams) validate() error {
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	switch {
	case !finite(p.LR) || p.LR < 0:
		return fmt.Errorf("LR = %v, want finite >= 0", p.LR)
	case !(p.Beta1 >= 0 && p.Beta1 < 1):
		return fmt.Errorf("Beta1 = %v, want in [0, 1)", p.Beta1)
	case !(p.Beta2 >= 0 && p.Beta2 < 1):
		return fmt.Errorf("Beta2 = %v, want in [0, 1)", p.Beta2)
	case !finite(p.Eps) || p.Eps < 0:
		return fmt.Errorf("Eps = %v, want finite >= 0", p.Eps)
	case !finite(p.WeightDecay) || p.WeightDecay < 0:
		return fmt.Errorf("WeightDecay = %v, want finite >= 0", p.WeightDecay)
	case !finite(p.ClipNorm) || p.ClipNorm < 0:
		return fmt.Errorf("ClipNorm = %v, want finite >= 0", p.ClipNorm)
	}
	return nil
}

// AdamGrad is a gradient view: exactly one of the fields is non-nil.
type AdamGrad struct {
	F32  []float32
	BF16 []uint16 // bfloat16 bits
	F16  []uint16 // IEEE binary16 bits
}

// kind returns the C type code, base pointer, length and element size.
func (g AdamGrad) kind() (gt C.int, p unsafe.Pointer, n, size int, err error) {
	set := 0
	if g.F32 != nil {
		set++
		gt, n, size = C.LSP_ADAM_F32, len(g.F32), 4
		if n > 0 {
			p = unsafe.Pointer(&g.F32[0])
		}
	}
	if g.BF16 != nil {
		set++
		gt, n, size = C.LSP_ADAM_BF16, len(g.BF16), 2
		if n > 0 {
			p = unsafe.Pointer(&g.BF16[0])
		}
	}
	if g.F16 != nil {
		set++
		gt, n, size = C.LSP_ADAM_F16, len(g.F16), 2
		if n > 0 {
			p = unsafe.Pointer(&g.F16[0])
		}
	}
	if set != 1 {
		return 0, nil, 0, 0, fmt.Errorf("gradient has %d of F32, BF16, F16 set, want exactly 1", set)
	}
	return gt, p, n, size, nil
}

// AdamState is one tensor's optimizer state. M and V may live in Go memory
// or in a HostBuffer.
type AdamState struct {
	M, V []float32
	Step int64 // steps taken; the next step is number Step+1
}

// NewAdamState returns zeroed moments for n elements, on the Go heap.
func NewAdamState(n int) *AdamState {
	return &AdamState{M: make([]float32, n), V: make([]float32, n)}
}

// AdamTensor is one tensor's part of a step. Set W for a weight update, or
// Delta for a subspace update (see AdamSubspace), not both.
type AdamTensor struct {
	Name   string // used in errors
	Params AdamParams
	W      []float32 // fp32 master weights, updated in place
	Grad   AdamGrad
	State  *AdamState
	// BF16Out, when non-nil, receives the updated W rounded to bf16 (nearest
	// even), in the same pass.
	BF16Out []uint16
	// Delta, when non-nil (and W nil), receives the update -lr*mhat/(sqrt(vhat)+eps)
	// instead of a weight change; it may be Grad.F32 itself (in place).
	// Weight decay is not applied (the LSP apply step does it).
	Delta []float32
	// NormKnown says Norm holds the gradient's L2 norm, computed by the
	// caller: the pre-scan is skipped, and a non-finite Norm skips the step.
	NormKnown bool
	Norm      float64
}

// AdamSubspace returns the tensor for one LSP matrix: s holds the compressed
// gradient S (d x d) on entry and the update Delta on return.
func AdamSubspace(name string, s []float32, st *AdamState, p AdamParams) AdamTensor {
	return AdamTensor{Name: name, Params: p, Grad: AdamGrad{F32: s}, Delta: s, State: st}
}

// AdamTensorResult reports one tensor of a step.
type AdamTensorResult struct {
	Norm    float64 // gradient L2 norm (scanned or supplied); Inf or NaN when skipped
	Skipped bool    // the gradient was not finite: nothing was written
}

// AdamResult reports a step.
type AdamResult struct {
	Tensors []AdamTensorResult
	Skipped int // tensors skipped for a non-finite gradient
	// Bytes is the memory traffic of the step: every byte read (the pre-scan
	// included) and written, without write-allocate.
	Bytes int64
}

// adamJob is one validated tensor.
type adamJob struct {
	t     *AdamTensor
	n     int
	gt    C.int
	gp    unsafe.Pointer
	gsize int
	coef  C.lsp_adam_coef
}

// adamGrab is a run of whole chunks of one job, done in one C call: elements
// [lo, hi), whose first chunk is number chunk0 of the phase.
type adamGrab struct {
	job    int
	lo, hi int
	chunk0 int
}

// AdamBytesPerElement returns the bytes one element of a step moves: the
// gradient (gradBytes: 4, or 2 for bf16/fp16), read twice when pre-scanned,
// w/m/v read and written (or, for a subspace tensor, m/v read and written
// and Delta written), and the bf16 copy written.
func AdamBytesPerElement(gradBytes int, scan, bf16Out, subspace bool) int {
	b := gradBytes + 16 // grad, m and v read and written
	if subspace {
		b += 4
	} else {
		b += 8
		if bf16Out {
			b += 2
		}
	}
	if scan {
		b += gradBytes
	}
	return b
}

// AdamStep runs one step of every tensor on the workers and returns when it
// is done. A nil *Workers runs it on the calling goroutine. The SIMD path is
// ActiveSIMD (LSP_SIMD or SetSIMD override it).
func (w *Workers) AdamStep(ts []AdamTensor) (AdamResult, error) {
	return w.adamStep(ts, ActiveSIMD())
}

// AdamCompletion is the handle of a submitted step.
type AdamCompletion struct {
	c   *WorkersCompletion
	res AdamResult
}

// Done is closed when the step has finished.
func (c *AdamCompletion) Done() <-chan struct{} { return c.c.Done() }

// Wait blocks until the step has finished and returns its result.
func (c *AdamCompletion) Wait() (AdamResult, error) {
	err := c.c.Wait()
	return c.res, err
}

// AdamSubmit starts a step and returns at once (see AdamStep). ts and every
// slice in it belong to the step until the completion is done.
func (w *Workers) AdamSubmit(ts []AdamTensor) *AdamCompletion {
	path := ActiveSIMD()
	ac := &AdamCompletion{}
	run := func() error {
		r, err := w.adamStep(ts, path)
		ac.res = r
		return err
	}
	if w == nil {
		c := &WorkersCompletion{done: make(chan struct{})}
		go func() { defer close(c.done); c.err = run() }()
		ac.c = c
		return ac
	}
	ac.c = w.Submit(run)
	return ac
}

// parallel runs fn over chunks on the pool, or inline for a nil pool.
func (w *Workers) parallel(chunks int, fn func(int)) error {
	if w == nil {
		for c := 0; c < chunks; c++ {
			fn(c)
		}
		return nil
	}
	return w.ParallelFor(chunks, fn)
}

// adamPrefetch chooses the kernels' software prefetches (adam.h, LSP_PF_*);
// tests force each level, which all give the same bits.
type adamPrefetch int

const (
	adamPrefetchAuto adamPrefetch = iota // each phase's measured default (below)
	adamPrefetchNone                     // hardware prefetchers only
	adamPrefetchNear                     // into L1, 1-2 KiB ahead
	adamPrefetchFar                      // near, and further ahead into L2
)

// adamUpdatePrefetch is the update's level under adamPrefetchAuto. On the
// AMD EPYC (Zen 4) this project is measured on, software prefetches slowed
// the update: at 128M parameters, f32, norm given, in interleaved rounds
// (best of 5 steps each, on a quiet machine), it moved about 80 GB/s with
// near and far prefetches (what a step larger than the last-level cache
// used to get), 92 with near only and 95-100 with none on two cores; 39-40,
// 44-49 and 49-52 on one. When the machine's bandwidth is lower (shared
// memory, 50-60 GB/s), none is still never slower. The hardware
// prefetchers keep the four streams fed; the prefetch instructions only
// cost. The pre-scan keeps its prefetches (near, and far when the step
// outgrows the last-level cache: adamFar): no difference was measurable.
const adamUpdatePrefetch = adamPrefetchNone

// level returns the C prefetch level of pf for a phase whose default is def.
func (pf adamPrefetch) level(def adamPrefetch) C.int {
	if pf == adamPrefetchAuto {
		pf = def
	}
	switch pf {
	case adamPrefetchNear:
		return C.LSP_PF_NEAR
	case adamPrefetchFar:
		return C.LSP_PF_FAR
	}
	return C.LSP_PF_NONE
}

func (w *Workers) adamStep(ts []AdamTensor, path SIMD) (AdamResult, error) {
	return w.adamStepPrefetch(ts, path, adamPrefetchAuto)
}

func (w *Workers) adamStepPrefetch(ts []AdamTensor, path SIMD, pf adamPrefetch) (AdamResult, error) {
	if path < Scalar || path > DetectSIMD() {
		return AdamResult{}, fmt.Errorf("host: adam: SIMD path %v not supported here", path)
	}
	if path >= AVX2 && (C.lsp_adam_simd_compiled() == 0 || !cpuid.CPU.Supports(cpuid.F16C)) {
		path = Scalar
	}
	jobs := make([]adamJob, len(ts))
	for i := range ts {
		if err := jobs[i].init(&ts[i]); err != nil {
			return AdamResult{}, fmt.Errorf("host: adam: tensor %d %q: %w", i, ts[i].Name, err)
		}
	}
	res := AdamResult{Tensors: make([]AdamTensorResult, len(ts))}
	scanDef := adamPrefetchNear
	if adamFar(jobs) {
		scanDef = adamPrefetchFar
	}
	scanPF, updPF := pf.level(scanDef), pf.level(adamUpdatePrefetch)

	// Phase 1: pre-scan every gradient whose norm is not supplied.
	var scanJobs []int
	for j := range jobs {
		if !jobs[j].t.NormKnown {
			scanJobs = append(scanJobs, j)
			res.Bytes += int64(jobs[j].n * jobs[j].gsize)
		}
	}
	scan, nchunks := adamPlan(jobs, scanJobs, w.workers())
	partial := make([]float64, nchunks)
	err := w.parallel(len(scan), func(k int) {
		gr := scan[k]
		jb := &jobs[gr.job]
		C.lsp_adam_sumsq_chunks(C.int(path), unsafe.Add(jb.gp, gr.lo*jb.gsize), jb.gt,
			C.size_t(gr.hi-gr.lo), AdamChunkLen, (*C.double)(unsafe.Pointer(&partial[gr.chunk0])), scanPF)
	})
	if err != nil {
		return AdamResult{}, fmt.Errorf("host: adam: pre-scan: %w", err)
	}
	sumsq := make([]float64, len(jobs))
	for _, gr := range scan { // grabs and their chunks in order: a fixed summation order
		for c := gr.chunk0; c < gr.chunk0+adamChunks(gr.hi-gr.lo); c++ {
			sumsq[gr.job] += partial[c]
		}
	}

	// Phase 2: update every tensor with a finite gradient.
	var updJobs []int
	for j := range jobs {
		jb := &jobs[j]
		norm := jb.t.Norm
		if !jb.t.NormKnown {
			norm = math.Sqrt(sumsq[j])
		}
		res.Tensors[j].Norm = norm
		if math.IsNaN(norm) || math.IsInf(norm, 0) {
			res.Tensors[j].Skipped = true
			res.Skipped++
			continue
		}
		jb.setCoef(norm)
		updJobs = append(updJobs, j)
		res.Bytes += int64(jb.n * (AdamBytesPerElement(jb.gsize, false, jb.t.BF16Out != nil, jb.t.W == nil)))
	}
	upd, _ := adamPlan(jobs, updJobs, w.workers())
	err = w.parallel(len(upd), func(k int) {
		gr := upd[k]
		jobs[gr.job].run(path, gr.lo, gr.hi, updPF)
	})
	if err != nil {
		return AdamResult{}, fmt.Errorf("host: adam: update: %w", err)
	}
	for j := range jobs {
		if !res.Tensors[j].Skipped {
			jobs[j].t.State.Step++
		}
	}
	return res, nil
}

// adamChunks returns the number of chunks of n elements.
func adamChunks(n int) int { return (n + AdamChunkLen - 1) / AdamChunkLen }

// adamPlan splits the listed jobs, in order, into grabs for the given number
// of workers: each about remaining/(adamGuided*workers) chunks, at least
// one, never across a job's end. It also returns the total chunk count.
func adamPlan(jobs []adamJob, sel []int, workers int) ([]adamGrab, int) {
	total := 0
	for _, j := range sel {
		total += adamChunks(jobs[j].n)
	}
	var grabs []adamGrab
	left, c0 := total, 0
	for _, j := range sel {
		n := jobs[j].n
		for lo := 0; lo < n; {
			k := max(1, left/(adamGuided*workers))
			hi := min(lo+k*AdamChunkLen, n)
			grabs = append(grabs, adamGrab{job: j, lo: lo, hi: hi, chunk0: c0})
			k = adamChunks(hi - lo)
			left, c0, lo = left-k, c0+k, hi
		}
	}
	return grabs, total
}

// adamFar reports whether the step's arrays together are
// larger than the last-level cache (or its size is unknown): then the
// pre-scan also prefetches far ahead into L2, which paid about 10% for its
// single stream on data streamed from memory where it was measured, and
// costs a little on data already in the cache.
func adamFar(jobs []adamJob) bool {
	var bytes int64
	for _, jb := range jobs {
		per := jb.gsize + 12 // gradient, m, v, w or Delta
		if jb.t.BF16Out != nil {
			per += 2
		}
		bytes += int64(jb.n) * int64(per)
	}
	llc := TriadLLCBytes()
	return llc <= 0 || bytes > llc
}

// workers returns the number of workers, 1 for a nil pool.
func (w *Workers) workers() int {
	if w == nil {
		return 1
	}
	return w.n
}

// init validates t: lengths, modes and parameters.
func (jb *adamJob) init(t *AdamTensor) error {
	jb.t = t
	gt, gp, n, size, err := t.Grad.kind()
	if err != nil {
		return err
	}
	jb.gt, jb.gp, jb.n, jb.gsize = gt, gp, n, size
	if err := t.Params.validate(); err != nil {
		return err
	}
	if t.State == nil {
		return errors.New("State is nil")
	}
	if len(t.State.M) != n || len(t.State.V) != n {
		return fmt.Errorf("len(M) = %d, len(V) = %d, want the gradient length %d", len(t.State.M), len(t.State.V), n)
	}
	switch {
	case t.W != nil && t.Delta != nil:
		return errors.New("both W and Delta are set, want one")
	case t.W == nil && t.Delta == nil:
		return errors.New("neither W nor Delta is set, want one")
	case t.W != nil && len(t.W) != n:
		return fmt.Errorf("len(W) = %d, want the gradient length %d", len(t.W), n)
	case t.Delta != nil && len(t.Delta) != n:
		return fmt.Errorf("len(Delta) = %d, want the gradient length %d", len(t.Delta), n)
	case t.Delta != nil && t.BF16Out != nil:
		return errors.New("BF16Out is set on a subspace (Delta) tensor")
	case t.BF16Out != nil && len(t.BF16Out) != n:
		return fmt.Errorf("len(BF16Out) = %d, want the gradient length %d", len(t.BF16Out), n)
	}
	return nil
}

// setCoef computes the step's coefficients in double and rounds them once.
func (jb *adamJob) setCoef(norm float64) {
	p := jb.t.Params
	t := float64(jb.t.State.Step + 1)
	bc1 := 1 - math.Pow(p.Beta1, t)
	bc2 := 1 - math.Pow(p.Beta2, t)
	decay := 1 - p.LR*p.WeightDecay
	if jb.t.W == nil {
		decay = 1
	}
	gscale := 1.0
	if p.ClipNorm > 0 {
		gscale = math.Min(1, p.ClipNorm/(norm+1e-6))
	}
	jb.coef = C.lsp_adam_coef{
		beta1: C.float(p.Beta1), omb1: C.float(1 - p.Beta1),
		beta2: C.float(p.Beta2), omb2: C.float(1 - p.Beta2),
		eps:    C.float(p.Eps),
		rbc2:   C.float(1 / math.Sqrt(bc2)),
		step:   C.float(p.LR / bc1),
		decay:  C.float(decay),
		gscale: C.float(gscale),
	}
}

// run updates elements [lo, hi) of the job with the C prefetch level pf.
func (jb *adamJob) run(path SIMD, lo, hi int, pf C.int) {
	t := jb.t
	var w, delta *C.float
	var out *C.uint16_t
	if t.W != nil {
		w = (*C.float)(unsafe.Pointer(&t.W[lo]))
		if t.BF16Out != nil {
			out = (*C.uint16_t)(unsafe.Pointer(&t.BF16Out[lo]))
		}
	} else {
		delta = (*C.float)(unsafe.Pointer(&t.Delta[lo]))
	}
	C.lsp_adam_pf(C.int(path), jb.coef, w,
		(*C.float)(unsafe.Pointer(&t.State.M[lo])),
		(*C.float)(unsafe.Pointer(&t.State.V[lo])),
		unsafe.Add(jb.gp, lo*jb.gsize), jb.gt, delta, out, C.size_t(hi-lo), pf)
}
