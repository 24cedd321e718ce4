package model

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
)

// Recompute says which of a block's activations the forward keeps for the
// backward and which the backward computes again from the block's input
// (--recompute). It trades compute for memory, never results: the
// recomputation runs the forward's own ops on the same inputs, so it
// writes the same bits the forward did.
type Recompute uint8

const (
	// RecomputeNone keeps every activation the backward reads.
	RecomputeNone Recompute = iota
	// RecomputeAttn recomputes the attention block (its norm, the q/k/v
	// projection and the attention itself) at the start of each block's
	// backward; the MLP's activations are kept. It saves the widest
	// per-layer activations but one fifth of the forward's GEMMs.
	RecomputeAttn
	// RecomputeLayer keeps only each block's output (the next block's
	// input) and recomputes the whole block, but its last projection,
	// before its backward.
	RecomputeLayer
)

// ParseRecompute parses the flag spelling: none, attn or layer.
func ParseRecompute(s string) (Recompute, error) {
	switch s {
	case "none", "":
		return RecomputeNone, nil
	case "attn":
		return RecomputeAttn, nil
	case "layer":
		return RecomputeLayer, nil
	}
	return 0, fmt.Errorf("%q is not none, attn or layer", s)
}

// Recomputes lists every setting, from the least memory saved to the most.
var Recomputes = []Recompute{RecomputeNone, RecomputeAttn, RecomputeLayer}

func (r Recompute) String() string {
	switch r {
	case RecomputeNone:
		return "none"
	case RecomputeAttn:
		return "attn"
	case RecomputeLayer:
		return "layer"
	}
	return fmt.Sprintf("Recompute(%d)", uint8(r))
}

// Recomputed is the last part of a block the backward recomputes: the
// attention (attn) or the MLP (layer, from the block's input on); false
// when nothing is recomputed. The block's last projection and residual add
// are never recomputed: their output is kept.
func (r Recompute) Recomputed() (last Block, ok bool) {
	switch r {
	case RecomputeAttn:
		return Attention, true
	case RecomputeLayer:
		return MLP, true
	}
	return 0, false
}

// Set parses a flag value (flag.Value).
func (r *Recompute) Set(s string) error { return flagerr.Set(r, ParseRecompute, s) }

// Block is the part of a block an activation belongs to.
type Block uint8

const (
	// Attention: the first norm, q/k/v and the attention output and
	// statistics; recomputed by attn and layer.
	Attention Block = iota
	// MLP: from the attention's residual add to the MLP's activation;
	// recomputed by layer.
	MLP
	// Output: the block's output, the next block's input; always kept.
	Output
)

// Act is one per-block activation tensor.
type Act struct {
	Shape []int
	// F32: a statistic (norm, log-sum-exp) stored in fp32; otherwise the
	// activation is in the model dtype.
	F32   bool
	Block Block
	// MatrixInput: the backward reads it only as a matrix's input X, for
	// dW = X^T dY, so under MatrixGrads hooks (which compress X in the
	// forward) it is not kept.
	MatrixInput bool
}

// Len is the number of elements.
func (a Act) Len() int {
	n := 1
	for _, s := range a.Shape {
		n *= s
	}
	return n
}

// Kept reports whether every layer keeps its own copy of a; otherwise all
// layers share one buffer, written by the forward and again by the
// backward's recomputation, one layer at a time.
func (r Recompute) Kept(a Act, hooked bool) bool {
	switch {
	case a.Block == Output:
		return true
	case a.MatrixInput && hooked:
		return false
	case r == RecomputeNone:
		return true
	case r == RecomputeAttn:
		return a.Block != Attention
	}
	return false
}

// ActSizes is the elements of a block's activations acts for L blocks:
// data in the model dtype, stats in fp32; kept ones once per block, the
// others once.
func ActSizes(acts []Act, L int, r Recompute, hooked bool) (data, stats int) {
	for _, a := range acts {
		n := a.Len()
		if r.Kept(a, hooked) {
			n *= L
		}
		if a.F32 {
			stats += n
		} else {
			data += n
		}
	}
	return data, stats
}

// CarveActs hands out the views of acts for L blocks from the model
// dtype's carver a and the fp32 carver st: views[l][i] is block l's
// activation i, its own or the one shared by every block. The shared ones
// come first, then each block's own, block by block, in the order of acts;
// the carvers advance by ActSizes.
func CarveActs(acts []Act, L int, r Recompute, hooked bool, a, st *backend.Carver) [][]backend.Tensor {
	next := func(x Act) backend.Tensor {
		if x.F32 {
			return st.Next(x.Shape...)
		}
		return a.Next(x.Shape...)
	}
	shared := make([]backend.Tensor, len(acts))
	for i, x := range acts {
		if !r.Kept(x, hooked) {
			shared[i] = next(x)
		}
	}
	views := make([][]backend.Tensor, L)
	for l := range views {
		views[l] = make([]backend.Tensor, len(acts))
		for i, x := range acts {
			if r.Kept(x, hooked) {
				views[l][i] = next(x)
			} else {
				views[l][i] = shared[i]
			}
		}
	}
	return views
}
