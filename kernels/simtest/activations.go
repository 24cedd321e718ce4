//go:build lsp_sim || cuda

// Go face of kernels/activations.cu for the simulator tests: GELU and
// SwiGLU forward and backward over n elements. Values (inp, gate, up, out)
// share one dtype and gradients (dinp, dgate, dup, dout) another.

package simtest

/*
#include "kernels.h"
*/
import "C"

// GeluForward runs lsp_gelu_forward.
func GeluForward(out, inp FloatBuf, n int) error {
	const op = "lsp_gelu_forward"
	x, err := dtypeFlag(op, "value", out, inp)
	if err != nil {
		return err
	}
	return Check(op, int(C.lsp_gelu_forward(out.ptr(), inp.ptr(), C.longlong(n), x, nil)))
}

// GeluBackward runs lsp_gelu_backward (dinp may be dout).
func GeluBackward(dinp, inp, dout FloatBuf, n int) error {
	const op = "lsp_gelu_backward"
	g, err := dtypeFlag(op, "gradient", dinp, dout)
	if err != nil {
		return err
	}
	x, err := dtypeFlag(op, "value", inp)
	if err != nil {
		return err
	}
	return Check(op, int(C.lsp_gelu_backward(dinp.ptr(), inp.ptr(), dout.ptr(), C.longlong(n), x, g, nil)))
}

// SwiGLUForward runs lsp_swiglu_forward.
func SwiGLUForward(out, gate, up FloatBuf, n int) error {
	const op = "lsp_swiglu_forward"
	x, err := dtypeFlag(op, "value", out, gate, up)
	if err != nil {
		return err
	}
	return Check(op, int(C.lsp_swiglu_forward(out.ptr(), gate.ptr(), up.ptr(), C.longlong(n), x, nil)))
}

// SwiGLUBackward runs lsp_swiglu_backward (dgate or dup may be dout).
func SwiGLUBackward(dgate, dup, dout, gate, up FloatBuf, n int) error {
	const op = "lsp_swiglu_backward"
	g, err := dtypeFlag(op, "gradient", dgate, dup, dout)
	if err != nil {
		return err
	}
	x, err := dtypeFlag(op, "value", gate, up)
	if err != nil {
		return err
	}
	code := C.lsp_swiglu_backward(dgate.ptr(), dup.ptr(), dout.ptr(), gate.ptr(), up.ptr(), C.longlong(n), x, g, nil)
	return Check(op, int(code))
}
