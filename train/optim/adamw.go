// Package optim holds the AdamW optimizer's settings and its device
// implementation: the hyperparameters and the one place they become the
// device's or the host's Adam parameters, the dense AdamW that runs on the
// device (native mode, and lsp's dense parameters), its gradient
// clipping, and the learning-rate schedule.
//
// Clipping follows docs/DESIGN.md, "LSP as implemented": a global norm of the
// current step would need every gradient before any update and would break the
// layer-wise schedule, so the norm is either per parameter tensor ("matrix") or
// the global norm of the previous step ("global-prev"; step 1 is not clipped).
package optim

import (
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// ClipMode picks the norm that clipping uses.
type ClipMode string

// Clip modes.
const (
	ClipNone       ClipMode = "none"
	ClipMatrix     ClipMode = "matrix"      // each tensor by its own norm
	ClipGlobalPrev ClipMode = "global-prev" // every tensor by the previous step's global norm
)

// ParseClipMode reads a clip mode flag value.
func ParseClipMode(s string) (ClipMode, error) {
	switch m := ClipMode(s); m {
	case ClipNone, ClipMatrix, ClipGlobalPrev:
		return m, nil
	}
	return "", fmt.Errorf("unknown clip mode %q (want none, matrix or global-prev)", s)
}

// Hyper are AdamW's hyperparameters.
type Hyper struct {
	Beta1, Beta2, Eps, WeightDecay float32
	Clip                           ClipMode
	MaxNorm                        float32
}

// DefaultHyper are GPT-2 fine-tuning defaults.
func DefaultHyper() Hyper {
	return Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: ClipMatrix, MaxNorm: 1}
}

// deviceParams are the device AdamW's parameters (backend.AdamParams) of
// one tensor at learning rate lr and 1-based step; clipping is set by Step,
// which owns the norms.
func (h Hyper) deviceParams(lr float32, step int, decay bool) backend.AdamParams {
	p := backend.AdamParams{LR: lr, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, Step: step}
	if decay {
		p.WeightDecay = h.WeightDecay
	}
	return p
}

// HostParams are the host Adam's parameters (host.AdamParams) of one
// tensor at learning rate lr: decoupled weight decay when decay is set,
// and with ClipMatrix a clip by the tensor's own norm (the host Adam
// computes it). ClipGlobalPrev has no host form; the engine rejects it
// outside native mode.
func (h Hyper) HostParams(lr float64, decay bool) host.AdamParams {
	p := host.AdamParams{LR: lr, Beta1: float64(h.Beta1), Beta2: float64(h.Beta2), Eps: float64(h.Eps)}
	if decay {
		p.WeightDecay = float64(h.WeightDecay)
	}
	if h.Clip == ClipMatrix {
		p.ClipNorm = float64(h.MaxNorm)
	}
	return p
}

// Tensor is one parameter tensor the optimizer updates: views of the
// parameter and of its gradient, wherever they lie.
type Tensor struct {
	Name        string
	Param, Grad backend.Tensor
	Decay       bool
}

// AdamW keeps fp32 moments (and an fp32 master copy when the parameters
// are bf16) on the device, the tensors' back to back in their order. It is
// the device's one AdamW: native mode's over every parameter, and lsp
// mode's over the dense parameters (--dense-params device).
type AdamW struct {
	H       Hyper
	be      backend.Backend
	tensors []Tensor
	offs    []int          // each tensor's offset in the state
	all     backend.Tensor // every gradient as one tensor (nil Buf: none)

	// M, V and Master (nil Buf when params are fp32) are the state that a
	// checkpoint saves. Norms holds one squared norm per tensor, then, with
	// the whole gradient, the latest step's global squared norm and the one
	// before it (the clip of ClipGlobalPrev).
	M, V, Master, Norms backend.Tensor
	step                int
	// work is SumSquares' scratch, shared by every norm of a step (they
	// run in order on one stream).
	work backend.Tensor
}

// StateBytes predicts the device bytes New allocates for numTensors
// tensors of numElems elements together; global: New is given the whole
// gradient.
func StateBytes(numElems, numTensors int, paramDType backend.DType, global bool) int64 {
	b := int64(numElems)*8 + backend.SumSquaresWork*8 // moments, the norms' work
	if paramDType != backend.F32 {
		b += int64(numElems) * 4
	}
	if global {
		numTensors += 2
	}
	return b + int64(numTensors)*4
}

// New allocates the optimizer state of tensors (parameters of one dtype;
// bf16 ones get an fp32 master, copied from them by InitMaster). allGrads,
// when its Buf is set, holds every gradient of the tensors as one tensor:
// each step then sums the global squared norm over it (GradNormSq, and
// the clip of ClipGlobalPrev, which needs it); without it each tensor's
// norm is summed every step and GradNormSq adds them up.
func New(be backend.Backend, h Hyper, tensors []Tensor, allGrads backend.Tensor) (*AdamW, error) {
	if h.Beta1 < 0 || h.Beta1 >= 1 || h.Beta2 < 0 || h.Beta2 >= 1 {
		return nil, fmt.Errorf("adamw: betas (%g, %g) must be in [0, 1)", h.Beta1, h.Beta2)
	}
	if h.Clip != ClipNone && h.Clip != "" && !(h.MaxNorm > 0) {
		return nil, fmt.Errorf("adamw: clip mode %s needs a positive max norm, got %g", h.Clip, h.MaxNorm)
	}
	if h.Clip == ClipGlobalPrev && allGrads.Buf == nil {
		return nil, fmt.Errorf("adamw: clip mode %s needs the whole gradient", h.Clip)
	}
	o := &AdamW{H: h, be: be, tensors: tensors, all: allGrads}
	n, master := 0, false
	for _, t := range tensors {
		if t.Param.Len() != t.Grad.Len() {
			return nil, fmt.Errorf("adamw: %s has %d elements and a gradient of %d", t.Name, t.Param.Len(), t.Grad.Len())
		}
		o.offs = append(o.offs, n)
		n += t.Param.Len()
		master = master || t.Param.DType != backend.F32
	}
	var err error
	fail := func(what string, err error) (*AdamW, error) {
		o.Free()
		return nil, fmt.Errorf("adamw: %s: %w", what, err)
	}
	if o.M, err = be.Alloc("adam m", n, backend.F32); err != nil {
		return fail("first moment", err)
	}
	if o.V, err = be.Alloc("adam v", n, backend.F32); err != nil {
		return fail("second moment", err)
	}
	if master {
		if o.Master, err = be.Alloc("master weights", n, backend.F32); err != nil {
			return fail("master weights", err)
		}
	}
	norms := len(tensors)
	if allGrads.Buf != nil {
		norms += 2
	}
	if o.Norms, err = be.Alloc("grad norms", norms, backend.F32); err != nil {
		return fail("norms", err)
	}
	if o.work, err = be.Alloc("grad norm work", backend.SumSquaresWork, backend.F64); err != nil {
		return fail("norm work", err)
	}
	return o, nil
}

// InitMaster copies the parameters into the fp32 master (no-op for fp32).
func (o *AdamW) InitMaster(s backend.Stream) error {
	if o.Master.Buf == nil {
		return nil
	}
	for i, t := range o.tensors {
		if err := o.be.CopyD2D(s, o.Master.Slice(o.offs[i], t.Param.Len()), t.Param); err != nil {
			return fmt.Errorf("adamw: master of %s: %w", t.Name, err)
		}
	}
	return nil
}

// Free releases the optimizer state.
func (o *AdamW) Free() {
	for _, t := range []backend.Tensor{o.M, o.V, o.Master, o.Norms, o.work} {
		if t.Buf != nil {
			o.be.Free(t)
		}
	}
}

// SetStepCount restores the step count from a checkpoint.
func (o *AdamW) SetStepCount(n int) { o.step = n }

// GradNormSq is the squared gradient norm of the latest step, for logging:
// the global one, or the sum of the tensors' without the whole gradient.
// It synchronizes s.
func (o *AdamW) GradNormSq(s backend.Stream) (float64, error) {
	if o.all.Buf != nil {
		v, err := backend.Download(o.be, s, o.Norms.Slice(len(o.tensors), 1))
		if err != nil {
			return 0, err
		}
		return float64(v[0]), nil
	}
	v, err := backend.Download(o.be, s, o.Norms)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, x := range v {
		sum += float64(x)
	}
	return sum, nil
}

// Step enqueues one AdamW update of every tensor at learning rate lr.
// skip (F32 [1] on the device, nil Buf: none) is the step's non-finite
// flag: when it is set the device writes no parameter, master or moment,
// and the caller, once it has read the flag, calls Skipped to take the
// step back from the optimizer's own bookkeeping.
func (o *AdamW) Step(s backend.Stream, lr float32, skip backend.Tensor) error {
	o.step++
	be := o.be
	nt := len(o.tensors)
	global := o.all.Buf != nil
	var cur, prev backend.Tensor
	if global {
		cur, prev = o.Norms.Slice(nt, 1), o.Norms.Slice(nt+1, 1)
		// This step clips by the latest applied step's global norm. The
		// copy is made here rather than after the updates so that a
		// skipped step's norm (NaN, most likely) never becomes prev:
		// Skipped puts the applied one back into cur.
		if err := be.CopyD2D(s, prev, cur); err != nil {
			return fmt.Errorf("adamw: %w", err)
		}
		if err := be.SumSquares(s, cur, o.all, o.work); err != nil {
			return fmt.Errorf("adamw: global norm: %w", err)
		}
	}
	for i, t := range o.tensors {
		state := func(x backend.Tensor) backend.Tensor {
			if x.Buf == nil {
				return x
			}
			return x.Slice(o.offs[i], t.Param.Len())
		}
		p := o.H.deviceParams(lr, o.step, t.Decay)
		var norm backend.Tensor
		if o.H.Clip == ClipMatrix || !global {
			norm = o.Norms.Slice(i, 1)
			if err := be.SumSquares(s, norm, t.Grad, o.work); err != nil {
				return fmt.Errorf("adamw: norm of %s: %w", t.Name, err)
			}
		}
		switch o.H.Clip {
		case ClipMatrix:
			p.MaxNorm = o.H.MaxNorm
		case ClipGlobalPrev:
			norm, p.MaxNorm = prev, o.H.MaxNorm
		}
		if err := be.AdamW(s, t.Param, state(o.Master), t.Grad, state(o.M), state(o.V), norm, skip, p); err != nil {
			return fmt.Errorf("adamw: %s: %w", t.Name, err)
		}
	}
	return nil
}

// Skipped takes back the latest Step, which the device skipped (its skip
// flag was set): the step count used for bias correction goes back, as
// torch leaves an optimizer's state untouched on a step its GradScaler
// skips, and the global norm of the latest applied step, which the
// skipped step moved to prev, goes back to cur for the next Step to
// clip by. Enqueued on s, after the skipped step.
func (o *AdamW) Skipped(s backend.Stream) error {
	o.step--
	if o.all.Buf == nil {
		return nil
	}
	nt := len(o.tensors)
	if err := o.be.CopyD2D(s, o.Norms.Slice(nt, 1), o.Norms.Slice(nt+1, 1)); err != nil {
		return fmt.Errorf("adamw: %w", err)
	}
	return nil
}

// Schedule is a learning rate with linear warmup and cosine decay.
type Schedule struct {
	LR     float64 // peak
	MinLR  float64 // reached at Total
	Warmup int     // steps of linear warmup from LR/Warmup
	Total  int     // steps
}

// At is the learning rate of 1-based step.
func (s Schedule) At(step int) float64 {
	if s.Warmup > 0 && step <= s.Warmup {
		return s.LR * float64(step) / float64(s.Warmup)
	}
	if s.Total <= s.Warmup {
		return s.LR
	}
	frac := float64(step-s.Warmup) / float64(s.Total-s.Warmup)
	frac = min(max(frac, 0), 1)
	return s.MinLR + 0.5*(s.LR-s.MinLR)*(1+math.Cos(math.Pi*frac))
}
