// Package optim holds the dense AdamW optimizer that runs on the device
// (the "native" placement), its gradient clipping, and the learning-rate
// schedule.
//
// Clipping follows DESIGN.md section 2: a global norm of the current step
// would need every gradient before any update and would break the layer-wise
// schedule, so the norm is either per parameter tensor ("matrix") or the
// global norm of the previous step ("global-prev"; step 1 is not clipped).
package optim

import (
	"fmt"
	"math"

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

// Tensor is one parameter tensor the optimizer updates.
type Tensor struct {
	Name   string
	Offset int // in elements, the same in params, grads and moments
	Len    int
	Decay  bool
}

// AdamW keeps fp32 moments (and an fp32 master copy when the parameters
// are bf16) on the device, in allocations laid out like the parameters.
type AdamW struct {
	H       Hyper
	be      backend.Backend
	tensors []Tensor
	params  backend.Tensor
	grads   backend.Tensor

	// M, V and Master (nil Buf when params are fp32) are the state that a
	// checkpoint saves. Norms holds one squared norm per tensor, then the
	// step's global squared norm, then the previous step's.
	M, V, Master, Norms backend.Tensor
	step                int
}

// StateBytes predicts the device bytes New allocates.
func StateBytes(numParams, numTensors int, paramDType backend.DType) int64 {
	b := int64(numParams) * 8
	if paramDType != backend.F32 {
		b += int64(numParams) * 4
	}
	return b + int64(numTensors+2)*4
}

// New allocates the optimizer state for params and grads (which share the
// layout of tensors). A bf16 params gets an fp32 master copied from it by
// InitMaster.
func New(be backend.Backend, h Hyper, params, grads backend.Tensor, tensors []Tensor) (*AdamW, error) {
	if h.Beta1 < 0 || h.Beta1 >= 1 || h.Beta2 < 0 || h.Beta2 >= 1 {
		return nil, fmt.Errorf("adamw: betas (%g, %g) must be in [0, 1)", h.Beta1, h.Beta2)
	}
	if h.Clip != ClipNone && h.Clip != "" && !(h.MaxNorm > 0) {
		return nil, fmt.Errorf("adamw: clip mode %s needs a positive max norm, got %g", h.Clip, h.MaxNorm)
	}
	o := &AdamW{H: h, be: be, tensors: tensors, params: params, grads: grads}
	n := params.Len()
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
	if params.DType != backend.F32 {
		if o.Master, err = be.Alloc("master weights", n, backend.F32); err != nil {
			return fail("master weights", err)
		}
	}
	if o.Norms, err = be.Alloc("grad norms", len(tensors)+2, backend.F32); err != nil {
		return fail("norms", err)
	}
	return o, nil
}

// InitMaster copies the parameters into the fp32 master (no-op for fp32).
func (o *AdamW) InitMaster(s backend.Stream) error {
	if o.Master.Buf == nil {
		return nil
	}
	return o.be.CopyD2D(s, o.Master, o.params)
}

// Free releases the optimizer state.
func (o *AdamW) Free() {
	for _, t := range []backend.Tensor{o.M, o.V, o.Master, o.Norms} {
		if t.Buf != nil {
			o.be.Free(t)
		}
	}
}

// StepCount is the number of steps taken.
func (o *AdamW) StepCount() int { return o.step }

// SetStepCount restores the step count from a checkpoint.
func (o *AdamW) SetStepCount(n int) { o.step = n }

// GlobalNormSq is the view holding the squared global gradient norm of the
// latest step (written by Step), for logging.
func (o *AdamW) GlobalNormSq() backend.Tensor { return o.Norms.Slice(len(o.tensors), 1) }

// Step enqueues one AdamW update of every tensor at learning rate lr.
func (o *AdamW) Step(s backend.Stream, lr float32) error {
	o.step++
	be := o.be
	nt := len(o.tensors)
	cur, prev := o.Norms.Slice(nt, 1), o.Norms.Slice(nt+1, 1)
	if err := be.SumSquares(s, cur, o.grads); err != nil {
		return fmt.Errorf("adamw: global norm: %w", err)
	}
	for i, t := range o.tensors {
		view := func(x backend.Tensor) backend.Tensor {
			if x.Buf == nil {
				return x
			}
			return x.Slice(t.Offset, t.Len)
		}
		p := backend.AdamParams{LR: lr, Beta1: o.H.Beta1, Beta2: o.H.Beta2, Eps: o.H.Eps, Step: o.step}
		if t.Decay {
			p.WeightDecay = o.H.WeightDecay
		}
		var norm backend.Tensor
		switch o.H.Clip {
		case ClipMatrix:
			norm = o.Norms.Slice(i, 1)
			if err := be.SumSquares(s, norm, view(o.grads)); err != nil {
				return fmt.Errorf("adamw: norm of %s: %w", t.Name, err)
			}
			p.MaxNorm = o.H.MaxNorm
		case ClipGlobalPrev:
			norm, p.MaxNorm = prev, o.H.MaxNorm
		}
		if err := be.AdamW(s, view(o.params), view(o.Master), view(o.grads), view(o.M), view(o.V), norm, p); err != nil {
			return fmt.Errorf("adamw: %s: %w", t.Name, err)
		}
	}
	// The next step clips by this step's global norm.
	if err := be.CopyD2D(s, prev, cur); err != nil {
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
