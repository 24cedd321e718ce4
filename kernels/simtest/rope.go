//go:build lsp_sim || cuda

// Go face of kernels/rope.cu for the simulator tests: RoPE forward and
// backward on one tensor [B, T, NH, HS], in place when out and inp are the
// same buffer.

package simtest

/*
#include "kernels.h"
*/
import "C"

// RoPEForward runs lsp_rope_forward.
func RoPEForward(out, inp FloatBuf, B, T, NH, HS int, theta float32) error {
	const op = "lsp_rope_forward"
	x, err := dtypeFlag(op, "value", out, inp)
	if err != nil {
		return err
	}
	code := C.lsp_rope_forward(out.ptr(), inp.ptr(), C.int(B), C.int(T), C.int(NH), C.int(HS), C.float(theta), x, nil)
	return Check(op, int(code))
}

// RoPEBackward runs lsp_rope_backward.
func RoPEBackward(dinp, dout FloatBuf, B, T, NH, HS int, theta float32) error {
	const op = "lsp_rope_backward"
	g, err := dtypeFlag(op, "gradient", dinp, dout)
	if err != nil {
		return err
	}
	code := C.lsp_rope_backward(dinp.ptr(), dout.ptr(), C.int(B), C.int(T), C.int(NH), C.int(HS), C.float(theta), g,
		nil)
	return Check(op, int(code))
}
