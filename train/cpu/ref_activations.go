// CPU reference for SwiGLU (LLaMA's MLP gate), the oracle of the SwiGLU
// kernels in kernels/activations.cu: out = silu(gate) * up elementwise, with
// silu(g) = g * sigmoid(g).
//
// Pure fp32 functions over plain slices (the sigmoid's exp in float64, as
// the GELU of math.go). Callers holding bf16 tensors widen them before the
// call and round the outputs after it, as the kernels do at load and store.
// Limits: gate, up and the outputs must be the same
// length (N*H for inputs [N, H]).

package cpu

import "math"

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
