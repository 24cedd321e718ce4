//go:build lsp_sim

// Go face of kernels/elementwise.cu for the simulator tests: Fill, Scale,
// Add, Accumulate, AddBias and BiasBackward on simulator buffers, one
// wrapper per launcher with the launcher's arguments in its order (each
// tensor's dtype as a bool, true for bf16). They check nothing themselves;
// the launchers' own argument checks are part of what the tests exercise.

package simtest

/*
#include "kernels.h"
*/
import "C"

import "unsafe"

// ewPtr is the device address of b, NULL for a nil buffer.
func ewPtr(b *Buffer) unsafe.Pointer {
	if b == nil {
		return nil
	}
	return b.Ptr()
}

// ewFlag is a launcher's dtype flag: 1 for bf16, 0 for fp32.
func ewFlag(bf16 bool) C.int {
	if bf16 {
		return 1
	}
	return 0
}

// Fill runs lsp_fill: t[i] = v for n elements.
func Fill(t *Buffer, v float32, n int, tBF16 bool) error {
	return Check("lsp_fill", int(C.lsp_fill(ewPtr(t), C.float(v), C.longlong(n), ewFlag(tBF16), nil)))
}

// Scale runs lsp_scale: t[i] *= a for n elements.
func Scale(t *Buffer, a float32, n int, tBF16 bool) error {
	return Check("lsp_scale", int(C.lsp_scale(ewPtr(t), C.float(a), C.longlong(n), ewFlag(tBF16), nil)))
}

// Add runs lsp_add: out = a + b over n elements.
func Add(out, a, b *Buffer, n int, outBF16, aBF16, bBF16 bool) error {
	code := C.lsp_add(ewPtr(out), ewPtr(a), ewPtr(b), C.longlong(n), ewFlag(outBF16), ewFlag(aBF16), ewFlag(bBF16), nil)
	return Check("lsp_add", int(code))
}

// Accumulate runs lsp_accumulate: dst += src over n elements.
func Accumulate(dst, src *Buffer, n int, dstBF16, srcBF16 bool) error {
	code := C.lsp_accumulate(ewPtr(dst), ewPtr(src), C.longlong(n), ewFlag(dstBF16), ewFlag(srcBF16), nil)
	return Check("lsp_accumulate", int(code))
}

// AddBias runs lsp_add_bias: out [N, OC] += bias [OC] on every row.
func AddBias(out, bias *Buffer, N, OC int, outBF16, biasBF16 bool) error {
	code := C.lsp_add_bias(ewPtr(out), ewPtr(bias), C.int(N), C.int(OC), ewFlag(outBF16), ewFlag(biasBF16), nil)
	return Check("lsp_add_bias", int(code))
}

// BiasBackward runs lsp_bias_backward: dbias [OC] += the column sums of
// dout [N, OC].
func BiasBackward(dbias, dout *Buffer, N, OC int, dbiasBF16, doutBF16 bool) error {
	code := C.lsp_bias_backward(ewPtr(dbias), ewPtr(dout), C.int(N), C.int(OC), ewFlag(dbiasBF16), ewFlag(doutBF16),
		nil)
	return Check("lsp_bias_backward", int(code))
}

// elementwiseBadDType calls every launcher with the dtype flag 2 (no such
// dtype) in each flag position in turn, the others fp32, on the fp32
// buffers x and y of n elements (bias shapes 1 x n), and returns the
// errors, which should all be non-nil.
func elementwiseBadDType(x, y *Buffer, n int) []error {
	px, py, ln := ewPtr(x), ewPtr(y), C.longlong(n)
	codes := []C.cudaError_t{
		C.lsp_fill(px, 1, ln, 2, nil),
		C.lsp_scale(px, 2, ln, 2, nil),
		C.lsp_add(px, px, py, ln, 2, 0, 0, nil),
		C.lsp_add(px, px, py, ln, 0, 2, 0, nil),
		C.lsp_add(px, px, py, ln, 0, 0, 2, nil),
		C.lsp_accumulate(px, py, ln, 2, 0, nil),
		C.lsp_accumulate(px, py, ln, 0, 2, nil),
		C.lsp_add_bias(px, py, 1, C.int(n), 2, 0, nil),
		C.lsp_add_bias(px, py, 1, C.int(n), 0, 2, nil),
		C.lsp_bias_backward(px, py, 1, C.int(n), 2, 0, nil),
		C.lsp_bias_backward(px, py, 1, C.int(n), 0, 2, nil),
	}
	errs := make([]error, len(codes))
	for i, c := range codes {
		errs[i] = Check("elementwise dtype flag", int(c))
	}
	return errs
}
