// CPU references for the activations of kernels/activations.cu, with the
// launchers' names and argument order (lsp_gelu_forward/backward,
// lsp_swiglu_forward/backward), elementwise over n values:
//
//	GELU (GPT-2's MLP):   out = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
//	                      (HF's gelu_new), computed as x / (1 + exp(-2u))
//	SwiGLU (LLaMA's MLP): out = silu(gate) * up, silu(g) = g * sigmoid(g)
//
// The backwards write (do not accumulate) the input gradients, and each
// may alias dout: every element is read before it is written.
//
// GELU's loops are C, package host's (host/ewise.c, host.GeluForward and
// GeluBackward), for speed: the exp is a vectorisable double-precision one
// (ewise.h says how close it is to Go's math.Exp). Every element is
// independent and no multiply-add is fused, so every SIMD path and any
// split of the elements give the same bits. SwiGLU is the Go below, its
// sigmoid's exp in float64.
//
// Pure fp32 functions over plain slices. Callers holding bf16 tensors
// widen them before the call and round the outputs after it, as the
// kernels do at load and store. Limits: the inputs and outputs must be the
// same length (N*H for SwiGLU's inputs [N, H]).

package cpu

import (
	"math"

	"github.com/lsp-offload/lsp-offload/host"
)

// GeluForward writes out = gelu(inp); it fails only when the lengths differ.
func GeluForward(out, inp []float32) error { return host.GeluForward(out, inp) }

// GeluBackward writes dinp = gelu'(inp) * dout; dinp may alias dout. It
// fails only when the lengths differ.
func GeluBackward(dinp, inp, dout []float32) error { return host.GeluBackward(dinp, inp, dout) }

func sigmoid32(x float32) float32 { return 1 / (1 + float32(math.Exp(float64(-x)))) }

// SwiGLUForward writes out = silu(gate) * up.
func SwiGLUForward(out, gate, up []float32) {
	for i, g := range gate {
		out[i] = g * sigmoid32(g) * up[i]
	}
}

// SwiGLUBackward writes (does not accumulate) the gradients given dout:
// dup = dout * silu(gate) and dgate = dout * up * silu'(gate), where
// silu'(g) = sigmoid(g) * (1 + g*(1 - sigmoid(g))). dgate or dup may alias
// dout: each element is read before it is written.
func SwiGLUBackward(dgate, dup, dout, gate, up []float32) {
	for i, g := range gate {
		sg := sigmoid32(g)
		dy, u := dout[i], up[i]
		dgate[i] = dy * u * (sg * (1 + g*(1-sg)))
		dup[i] = dy * (g * sg)
	}
}
