//go:build lsp_sim || cuda

// Go face of kernels/embedding.cu for the simulator tests: the token +
// position embedding forward and its deterministic backward. inp is an
// int32 buffer of B*T token ids.

package simtest

/*
#include "kernels.h"
*/
import "C"

// EncoderForward runs lsp_encoder_forward: out, wte, wpe share one dtype.
func EncoderForward(out FloatBuf, inp *Buffer, wte, wpe FloatBuf, B, T, Ch, V int) error {
	const op = "lsp_encoder_forward"
	x, err := dtypeFlag(op, "value", out, wte, wpe)
	if err != nil {
		return err
	}
	code := C.lsp_encoder_forward(out.ptr(), i32Ptr(inp), wte.ptr(), wpe.ptr(), C.int(B), C.int(T), C.int(Ch),
		C.int(V), x, nil)
	return Check(op, int(code))
}

// EncoderBackward runs lsp_encoder_backward: dwte, dwpe, dout share one
// dtype.
func EncoderBackward(dwte, dwpe, dout FloatBuf, inp *Buffer, B, T, Ch, V int) error {
	const op = "lsp_encoder_backward"
	g, err := dtypeFlag(op, "gradient", dwte, dwpe, dout)
	if err != nil {
		return err
	}
	code := C.lsp_encoder_backward(dwte.ptr(), dwpe.ptr(), dout.ptr(), i32Ptr(inp), C.int(B), C.int(T), C.int(Ch),
		C.int(V), g, nil)
	return Check(op, int(code))
}
