// Package model is the contract between a model family (train/gpt2,
// train/llama) and the training engine (train/engine): a model describes
// its own parameter layout (which tensors belong to which block, which of
// them are the weight matrices LSP projects and which of those read the
// same input) and offers its forward and backward passes block by block,
// so that the engine schedules, offloads and compresses any model without
// knowing it.
//
// The conventions every implementation keeps:
//
//   - All parameters live in one allocation (Buffers.Params), laid out as
//     Layout says, back to back; block l's parameters come before block
//     l+1's.
//   - A weight matrix W is stored m x n (in x out: y = x W), the form the
//     LSP kernels take (docs/DESIGN.md, "LSP as implemented").
//   - BackwardLayer(l) writes the gradients of block l's parameters only,
//     and nothing after it writes them again in the same micro-batch; the
//     parameters outside the blocks are complete after BackwardEmbed.
//     The engine starts a block's offload as soon as its backward is done.
package model

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Param is one parameter tensor inside the single parameter allocation.
type Param struct {
	Name   string // the checkpoint's name, e.g. transformer.h.0.attn.c_attn.weight
	Shape  []int  // as the checkpoint stores it (a matrix: in x out)
	Offset int    // in elements
	Decay  bool   // weight decay applies (matrices and embeddings, not biases or norms)
	Layer  int    // the block it belongs to; -1: outside the blocks (embeddings, final norm, head)
	// Transposed: Hugging Face files store the tensor as Shape reversed (a
	// torch Linear's out x in, LLaMA's projections), so loading and exporting
	// transpose it (docs/DESIGN.md, "LSP as implemented"). GPT-2's Conv1D
	// weights are stored in x out as here: not transposed.
	Transposed bool
	// Backward, for a parameter outside the blocks, is the set of
	// backward passes that write its gradient: ByHead (the final norm, an
	// untied head), ByEmbed (the embeddings) or both (a head tied to the
	// embedding). Zero in the blocks, whose BackwardLayer writes them. A
	// gradient ring (Options.GradSlots) needs it to know when a gradient
	// is complete.
	Backward Pass
}

// Pass is a set of the backward passes outside the blocks.
type Pass uint8

// The passes.
const (
	ByHead  Pass = 1 << iota // BackwardHead
	ByEmbed                  // BackwardEmbed
)

// Len is the number of elements.
func (p Param) Len() int {
	n := 1
	for _, s := range p.Shape {
		n *= s
	}
	return n
}

// Matrix describes one weight matrix that every block has and that LSP
// projects (the engine gives it no dense gradient in lsp mode).
type Matrix struct {
	Name string // short, for logs and buffer names, e.g. "qkv"
	// Slot is the matrix's position among its block's parameters (Layout
	// order).
	Slot int
	M, N int // in x out
	// Input numbers the block input the matrix reads, from 0. Matrices
	// with the same Input read the same activation X (LLaMA's q, k and v;
	// its gate and up), so LSP keeps one projector P and one compressed
	// activation for them. Inputs are numbered in order of first use.
	Input int
}

// Memory is the device memory a model allocates, by part, in bytes.
type Memory struct {
	Params, Grads, Activations, ActGrads, Batch int64
}

// Total is the sum of the parts.
func (m Memory) Total() int64 {
	return m.Params + m.Grads + m.Activations + m.ActGrads + m.Batch
}

// MatrixGrads replaces the dense gradients of the block matrices (lsp
// mode, and the engine's calibration pass).
type MatrixGrads interface {
	// Input is called during the forward pass, on the forward's stream,
	// right after X [BT, m] (input `in` of block l, Matrix.Input, in the
	// model dtype) has been computed and before it is overwritten; once
	// per input, before the first matrix that reads it. With hooks
	// installed X is NOT kept for the backward. Under
	// Options.HooksInRecompute it is called instead in block l's
	// backward, from its recompute, and X then stays as it is until that
	// backward's last OutputGrad.
	Input(s backend.Stream, l, in int, X backend.Tensor) error
	// OutputGrad is called during the backward pass with dY [BT, n] of
	// matrix k of block l (in the model dtype, as every activation
	// gradient), in place of dW += X^T dY (the bias gradient and dX are
	// still computed by the model).
	OutputGrad(s backend.Stream, l, k int, dY backend.Tensor) error
}

// Adapters add a trainable low-rank term to some block matrices (lora
// mode, train/lora): y = x W (+ b) + the adapter's term of x. The
// matrices themselves are frozen (no dense gradient), but unlike under
// MatrixGrads their inputs are kept for the backward, which the
// adapters' own gradients read. Both calls are enqueued on the model's
// stream, for every matrix; an adapter without a term for matrix k
// returns at once.
type Adapters interface {
	// Forward adds the term of matrix k of block l to Y [BT, n], which
	// holds X W (+ b) for X [BT, m]; in the forward and in --recompute's
	// recompute, before anything reads Y.
	Forward(s backend.Stream, l, k int, X, Y backend.Tensor) error
	// Backward accumulates the adapter's parameter gradients of matrix k
	// of block l from X [BT, m] and dY [BT, n], and adds the term's input
	// gradient to dX [BT, m], after the model has written dY W^T there.
	Backward(s backend.Stream, l, k int, X, dY, dX backend.Tensor) error
}

// AdapterForward is a family's call of a.Forward for matrix k of block l
// (name, for the error); nothing without adapters.
func AdapterForward(a Adapters, s backend.Stream, l, k int, name fmt.Stringer, X, Y backend.Tensor) error {
	if a == nil {
		return nil
	}
	if err := a.Forward(s, l, k, X, Y); err != nil {
		return fmt.Errorf("%v adapter: %w", name, err)
	}
	return nil
}

// AdapterBackward is a family's call of a.Backward, as AdapterForward.
func AdapterBackward(a Adapters, s backend.Stream, l, k int, name fmt.Stringer, X, dY, dX backend.Tensor) error {
	if a == nil {
		return nil
	}
	if err := a.Backward(s, l, k, X, dY, dX); err != nil {
		return fmt.Errorf("%v adapter backward: %w", name, err)
	}
	return nil
}

// Base holds the block matrices outside Params, in another form (lora
// --base-dtype nf4|int8: quantized, train/quant), frozen: Params then holds
// the other parameters only (Storage.ParamOffsets), and each family's
// linear asks Base for the matrix's products instead of a Gemm with a view
// of Params. Both calls are enqueued on the model's stream.
type Base interface {
	// Forward writes Y [rows, n] = X [rows, m] W for matrix k of block l.
	Forward(s backend.Stream, l, k, rows int, X, Y backend.Tensor) error
	// InputGrad writes dX [rows, m] = dY [rows, n] W^T + beta dX.
	InputGrad(s backend.Stream, l, k, rows int, dY, dX backend.Tensor, beta float32) error
}

// Options configure a model beyond its batch shape.
type Options struct {
	// MatrixGrads, when set, is called instead of computing the matrices'
	// dense gradients; Grads then holds only the other ("dense")
	// parameters, and the matrices' inputs need not be kept per layer.
	// For planning, any non-nil value (even a nil pointer of a hook type)
	// plans for hooks.
	MatrixGrads MatrixGrads
	// Adapters, when set (lora mode), freeze the block matrices and add
	// the adapters' terms to them; Grads then holds only the other
	// ("dense") parameters. Not with MatrixGrads.
	Adapters Adapters
	// Base, with Adapters only, holds the frozen block matrices (Base):
	// Params leaves them out.
	Base Base
	// GradDType stores the parameter gradients (fp32, the zero value, or
	// bf16: every accumulation rounds to nearest even). Activation
	// gradients are in the model dtype, whatever GradDType is.
	GradDType backend.DType
	// Recompute drops activations in the forward and computes them again
	// in each block's backward. Under RecomputeLayer, which recomputes
	// every matrix input, MatrixGrads.Input is called in the backward's
	// recompute of the block instead of in the forward (so the hooks need
	// not keep what they make of X for every block at once); under
	// RecomputeAttn it is called in the forward, as without recompute.
	Recompute Recompute
	// FrozenDense, with MatrixGrads or Adapters, gives the other ("dense") parameters
	// no gradient either (lsp --dense-params frozen): GradView reports
	// none, the embeddings' and head's gradients are not computed, and the
	// small ones that ops compute with their input gradients (norm
	// weights, biases) go to a discard buffer as long as one block's
	// (FrozenGradOffsets), which Grads then is.
	FrozenDense bool
	// GradSlots, when > 0, lays Grads out as a ring of that many slots
	// (NewGradRing) instead of one place per parameter: the caller zeroes
	// a group's slot before the group's backward and copies the gradient
	// out before the slot's next group writes it. 0: the whole gradient.
	GradSlots int
	// Packed rows (--pack) hold several documents each: the model then
	// has a Positions buffer (Buffers.Positions), filled with Inputs,
	// that restarts the positions and confines attention at each
	// document (backend.Positions). Unpacked, positions are 0..T-1 and
	// the ops take no positions at all (today's bits).
	Packed bool
}

// BatchRows is the number of I32 [B,T] arrays of a model's batch buffer:
// inputs and targets, and positions when packed.
func (o Options) BatchRows() int {
	if o.Packed {
		return 3
	}
	return 2
}

// FrozenMatrices reports whether the block matrices have no dense
// gradient: under MatrixGrads (lsp) or Adapters (lora).
func (o Options) FrozenMatrices() bool { return o.MatrixGrads != nil || o.Adapters != nil }

// ParamOffsets places a model's parameters in Params: at their layout
// offsets, or with a Base everything but the block matrices (isMatrix,
// by layout index) back to back, the matrices at -1. n is Params' length.
func (o Options) ParamOffsets(layout []Param, isMatrix func(i int) bool) (offs []int, n int) {
	if o.Base == nil {
		isMatrix = nil
	}
	return GradOffsets(layout, isMatrix)
}

// HooksInRecompute reports whether MatrixGrads.Input is called in the
// backward's recompute rather than in the forward (Options.Recompute).
func (o Options) HooksInRecompute() bool {
	return o.MatrixGrads != nil && o.Recompute == RecomputeLayer
}

// Arch is a model architecture: the layout of its parameters, its memory
// plan and the constructor of its model on a backend.
type Arch interface {
	// Layout lists every parameter in allocation order.
	Layout() []Param
	// Layers is the number of blocks.
	Layers() int
	// Matrices lists the weight matrices of one block (every block has the
	// same), in forward order; k indexes this list.
	Matrices() []Matrix
	// NumParams is the number of parameter elements.
	NumParams() int
	// MemoryWith predicts the device bytes NewModel allocates for batches of
	// B x T in dtype dt, the scratch its ops take included (the sizes of
	// package backend: a model allocates its ops' scratch, so that the
	// engine's memory plan counts it).
	MemoryWith(B, T int, dt backend.DType, opts Options) Memory
	// NewModel allocates the model for batches of B x T on be. Parameters
	// start at zero.
	NewModel(be backend.Backend, B, T int, dt backend.DType, opts Options) (Model, error)
}

// Buffers are the device tensors of a model that the engine reads and
// writes.
type Buffers struct {
	// Params holds every parameter (Layout); Grads every dense gradient.
	Params, Grads backend.Tensor
	// Inputs and Targets (I32, B*T) are filled before Forward and
	// CrossEntropy; targets < 0 are ignored.
	Inputs, Targets backend.Tensor
	// Positions (I32, B*T), with Options.Packed only (absent otherwise),
	// is each token's position within its document, filled with Inputs.
	Positions backend.Tensor
	// Losses (F32, B*T) holds the per-position losses after CrossEntropy.
	Losses backend.Tensor
	// Logits (B*T*V, the model dtype) holds the logits after Forward, and
	// scale * dloss/dlogits after CrossEntropy with a non-zero scale.
	Logits backend.Tensor
}

// Model is a model allocated on a backend for one batch shape. Every pass
// is enqueued on the stream it is given and returns at once.
type Model interface {
	Buffers() Buffers
	// ParamView returns parameter i of t: Params, or a tensor of the same
	// layout.
	ParamView(t backend.Tensor, i int) backend.Tensor
	// GradView returns the gradient of parameter i, false when it has no
	// dense gradient (a matrix under MatrixGrads).
	GradView(i int) (backend.Tensor, bool)
	// ZeroGrads clears every dense gradient.
	ZeroGrads(s backend.Stream) error
	// Forward runs from Inputs to the logits.
	Forward(s backend.Stream) error
	// CrossEntropy writes Losses and, with scale != 0, scale times the
	// loss gradient of the logits, ready for the backward.
	CrossEntropy(s backend.Stream, scale float32) error
	// BackwardHead runs the head's backward: the final norm and the logits.
	BackwardHead(s backend.Stream) error
	// BackwardLayer runs block l's backward, after block l+1's (or the
	// head's); it accumulates block l's parameter gradients.
	BackwardLayer(s backend.Stream, l int) error
	// BackwardEmbed runs the embeddings' backward, after block 0's.
	BackwardEmbed(s backend.Stream) error
	// Free releases every buffer of the model.
	Free()
}

// Backward enqueues a whole backward pass of m with L blocks.
func Backward(m Model, s backend.Stream, L int) error {
	if err := m.BackwardHead(s); err != nil {
		return err
	}
	for l := L - 1; l >= 0; l-- {
		if err := m.BackwardLayer(s, l); err != nil {
			return err
		}
	}
	return m.BackwardEmbed(s)
}

// ForwardBackward enqueues one forward, the loss scaled by scale, and a
// whole backward pass of m with L blocks: a pass outside a step's graph
// (the projector check's calibration).
func ForwardBackward(m Model, s backend.Stream, L int, scale float32) error {
	if err := m.Forward(s); err != nil {
		return err
	}
	if err := m.CrossEntropy(s, scale); err != nil {
		return err
	}
	return Backward(m, s, L)
}

// Index is an architecture's layout indexed by block, checked against the
// conventions of this package.
type Index struct {
	Layout   []Param
	Blocks   [][]int  // Blocks[l]: Layout indices of block l's parameters, in Layout order
	Outside  []int    // Layout indices of the parameters outside the blocks
	Mats     []Matrix // one block's matrices
	MatParam [][]int  // MatParam[l][k]: Layout index of matrix k of block l
	Inputs   int      // matrix inputs per block
	InputM   []int    // each input's width m
	IsMat    []bool   // by Layout index: a block matrix
	Readers  [][]int  // Readers[in]: the matrices reading input in, in order
}

// NewIndex indexes a's layout and checks it: parameters back to back,
// blocks in order, every matrix's parameter of shape M x N, inputs numbered in
// order of first use and read by matrices of the same width.
func NewIndex(a Arch) (*Index, error) {
	x := &Index{Layout: a.Layout(), Mats: a.Matrices()}
	L := a.Layers()
	if L < 1 {
		return nil, fmt.Errorf("model: %d blocks, want at least 1", L)
	}
	x.Blocks = make([][]int, L)
	x.IsMat = make([]bool, len(x.Layout))
	off, prev := 0, -1
	for i, p := range x.Layout {
		if p.Offset != off {
			return nil, fmt.Errorf("model: %s at offset %d, want %d (one contiguous allocation)", p.Name, p.Offset, off)
		}
		off += p.Len()
		switch {
		case p.Layer < -1 || p.Layer >= L:
			return nil, fmt.Errorf("model: %s in block %d of %d", p.Name, p.Layer, L)
		case p.Layer == -1:
			x.Outside = append(x.Outside, i)
			continue
		case p.Layer < prev || (p.Layer != prev && len(x.Blocks[p.Layer]) > 0):
			return nil, fmt.Errorf("model: %s of block %d breaks the block order", p.Name, p.Layer)
		}
		prev = p.Layer
		x.Blocks[p.Layer] = append(x.Blocks[p.Layer], i)
	}
	if off != a.NumParams() {
		return nil, fmt.Errorf("model: layout has %d elements, NumParams says %d", off, a.NumParams())
	}
	for k, mt := range x.Mats {
		switch {
		case mt.Input < 0 || mt.Input > x.Inputs:
			return nil, fmt.Errorf("model: matrix %s reads input %d; inputs are numbered in order of first use", mt.Name, mt.Input)
		case mt.Input == x.Inputs:
			x.Inputs++
			x.InputM = append(x.InputM, mt.M)
			x.Readers = append(x.Readers, nil)
		case x.InputM[mt.Input] != mt.M:
			return nil, fmt.Errorf("model: matrix %s reads input %d with width %d, another reader has %d", mt.Name, mt.Input, mt.M, x.InputM[mt.Input])
		}
		x.Readers[mt.Input] = append(x.Readers[mt.Input], k)
	}
	x.MatParam = make([][]int, L)
	for l, blk := range x.Blocks {
		for _, mt := range x.Mats {
			if mt.Slot < 0 || mt.Slot >= len(blk) {
				return nil, fmt.Errorf("model: matrix %s at slot %d of block %d's %d parameters", mt.Name, mt.Slot, l, len(blk))
			}
			i := blk[mt.Slot]
			if p := x.Layout[i]; len(p.Shape) != 2 || p.Shape[0] != mt.M || p.Shape[1] != mt.N {
				return nil, fmt.Errorf("model: matrix %s of block %d is %s %v, want %d x %d", mt.Name, l, p.Name, p.Shape, mt.M, mt.N)
			}
			if x.IsMat[i] {
				return nil, fmt.Errorf("model: two matrices at slot %d", mt.Slot)
			}
			x.IsMat[i] = true
			x.MatParam[l] = append(x.MatParam[l], i)
		}
	}
	return x, nil
}

// MatrixElems is the number of elements of every block matrix together.
func (x *Index) MatrixElems() int {
	n := 0
	for _, row := range x.MatParam {
		for _, i := range row {
			n += x.Layout[i].Len()
		}
	}
	return n
}

// Chain runs steps in order and stops at the first error: a pass's ops,
// each enqueued only when the one before it was accepted.
func Chain(steps ...func() error) error {
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// GradOffsets places a model's dense gradients in one allocation: the
// parameters of layout back to back in layout order, except those skip
// reports (the block matrices under MatrixGrads), which get offset -1. n
// is the allocation's length in elements.
func GradOffsets(layout []Param, skip func(i int) bool) (offs []int, n int) {
	offs = make([]int, len(layout))
	for i, p := range layout {
		if skip != nil && skip(i) {
			offs[i] = -1
			continue
		}
		offs[i] = n
		n += p.Len()
	}
	return offs, n
}

// FrozenGradOffsets places the discard buffer of Options.FrozenDense: the
// parameters skip does not report (the frozen ones whose gradients ops
// compute anyway) block by block, each block's (and the parameters'
// outside the blocks) from offset 0, since the blocks' backwards run one
// after another on one stream and nothing reads what they write. Each op
// still gets distinct memory for its outputs (a LayerNorm's weight and
// bias gradients). n is the buffer's length in elements.
func FrozenGradOffsets(layout []Param, skip func(i int) bool) (offs []int, n int) {
	offs = make([]int, len(layout))
	next := map[int]int{} // by Param.Layer
	for i, p := range layout {
		if skip(i) {
			offs[i] = -1
			continue
		}
		offs[i] = next[p.Layer]
		next[p.Layer] += p.Len()
		n = max(n, next[p.Layer])
	}
	return offs, n
}

// Decoder runs a model one position at a time, keeping the keys and
// values of the positions before it (a KV cache), for generation. It
// reads the parameters of the Model it came from, which must outlive it.
type Decoder interface {
	// Token is the I32 [1] tensor Step reads its token from.
	Token() backend.Tensor
	// Step enqueues the forward pass of Token at position pos < MaxT:
	// positions 0..pos-1 were stepped before it (stepping pos again
	// replaces it and forgets the later ones). Logits then holds the
	// logits of that position.
	Step(s backend.Stream, pos int) error
	// Logits is [V] in the model dtype.
	Logits() backend.Tensor
	// MaxT is the number of positions the cache holds.
	MaxT() int
	// Free releases the decoder's buffers (not the model's).
	Free()
}

// Cached is a Model that decodes with a KV cache.
type Cached interface {
	// NewDecoder allocates a decoder for up to maxT positions (at most
	// the model's context).
	NewDecoder(maxT int) (Decoder, error)
}
