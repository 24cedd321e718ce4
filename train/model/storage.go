package model

import "github.com/lsp-offload/lsp-offload/train/backend"

// Storage is the part of a Model that every family keeps the same way:
// its parameter layout, where each dense gradient lives, and the buffers
// the engine reads and writes. A family's Model embeds it and gets
// Layout, Buffers, ParamView and GradView from it.
type Storage struct {
	// ParamLayout is the layout of Params (and of Grads without hooks).
	ParamLayout []Param
	// ParamOffsets is each parameter's element offset in Params, -1
	// where Params does not hold it (a block matrix under Options.Base).
	ParamOffsets []int
	// GradOffsets is each parameter's element offset in Grads, -1 where
	// it has no dense gradient (a matrix under MatrixGrads).
	GradOffsets []int

	// Params holds every parameter; Grads every dense gradient (in
	// Options.GradDType): the layout of Params, or with hooks the same
	// with the matrices left out.
	Params, Grads backend.Tensor
	// Inputs and Targets (I32, B*T) are filled by the caller before
	// Forward and CrossEntropy; targets < 0 are ignored.
	Inputs, Targets backend.Tensor
	// Positions (I32, B*T) with Options.Packed, absent otherwise
	// (backend.Positions).
	Positions backend.Tensor
	// Losses (F32, B*T) holds the per-position losses after CrossEntropy.
	Losses backend.Tensor
	// Logits (B*T*V) holds the logits after Forward, and dlogits after
	// CrossEntropy with a non-zero scale.
	Logits backend.Tensor
}

// Layout is the parameter layout of Params.
func (s *Storage) Layout() []Param { return s.ParamLayout }

// Buffers implements Model.
func (s *Storage) Buffers() Buffers {
	return Buffers{Params: s.Params, Grads: s.Grads, Inputs: s.Inputs, Targets: s.Targets, Positions: s.Positions, Losses: s.Losses, Logits: s.Logits}
}

// ParamView returns parameter i of t (Params, or a tensor of the same
// layout such as an optimizer moment; Grads only without hooks, else use
// GradView).
// A block matrix that Params does not hold (Options.Base) has no view:
// the zero Tensor.
func (s *Storage) ParamView(t backend.Tensor, i int) backend.Tensor {
	p := s.ParamLayout[i]
	if s.ParamOffsets[i] < 0 {
		return backend.Tensor{}
	}
	return t.Slice(s.ParamOffsets[i], p.Len(), p.Shape...)
}

// GradView returns the gradient view of parameter i (the parameter's
// shape) and false when it has no dense gradient.
func (s *Storage) GradView(i int) (backend.Tensor, bool) {
	if i < 0 || i >= len(s.ParamLayout) || s.GradOffsets[i] < 0 {
		return backend.Tensor{}, false
	}
	p := s.ParamLayout[i]
	return s.Grads.Slice(s.GradOffsets[i], p.Len(), p.Shape...), true
}
