//go:build lsp_sim || cuda

// Go face of kernels/softmax_ce.cu for the simulator tests: the fused
// softmax + cross-entropy. losses is an fp32 buffer of N values, targets an
// int32 buffer of N ids; logits (bf16 or fp32) are overwritten in place by
// the gradient when scale != 0.

package simtest

/*
#include "kernels.h"
*/
import "C"

// CrossEntropyForwardBackward runs lsp_cross_entropy_forward_backward.
func CrossEntropyForwardBackward(losses *Buffer, logits FloatBuf, targets *Buffer, N, V int, scale float32) error {
	const op = "lsp_cross_entropy_forward_backward"
	x, err := dtypeFlag(op, "value", logits)
	if err != nil {
		return err
	}
	code := C.lsp_cross_entropy_forward_backward(f32Ptr(losses), logits.ptr(), i32Ptr(targets), C.int(N), C.int(V),
		C.float(scale), x, nil)
	return Check(op, int(code))
}
