//go:build lsp_sim || cuda

// Go face of kernels/attention.cu for the simulator tests:
// AttentionForward and AttentionBackward call lsp_attention_forward and
// lsp_attention_backward on simulator buffers. They check nothing
// themselves; the launchers' own argument checks are part of what the
// tests exercise. AttentionArgs.Off shifts every pointer by a number of
// bytes, so tests can hand the launchers misaligned views.

package simtest

/*
#include "kernels.h"

static int lsp_attention_forward_call(void* out, void* lse, void* qkv, int B, int T, int C, int NH) {
	return (int)lsp_attention_forward((__nv_bfloat16*)out, (float*)lse, (const __nv_bfloat16*)qkv, B, T, C, NH,
		(cudaStream_t)0);
}

static int lsp_attention_backward_call(void* dqkv, void* dout, void* qkv, void* out, void* lse, void* scratch,
		int B, int T, int C, int NH) {
	return (int)lsp_attention_backward((__nv_bfloat16*)dqkv, (const __nv_bfloat16*)dout,
		(const __nv_bfloat16*)qkv, (const __nv_bfloat16*)out, (const float*)lse, (float*)scratch, B, T, C, NH,
		(cudaStream_t)0);
}
*/
import "C"

import "unsafe"

// AttentionArgs are the buffers and sizes of the attention launchers (see
// kernels/attention.cu): qkv, out, dout, dqkv bf16; lse, scratch fp32.
// A nil buffer is passed as a null pointer. Off (bytes) is added to every
// bf16 pointer (qkv, out, dout, dqkv) to test unaligned views; the buffers
// must then be Off bytes longer.
type AttentionArgs struct {
	Out, Lse, Qkv, Dqkv, Dout, Scratch *Buffer
	B, T, C, NH                        int
	Off                                int
}

func (a AttentionArgs) ptr(b *Buffer, off int) unsafe.Pointer {
	if b == nil {
		return nil
	}
	return unsafe.Add(b.Ptr(), off)
}

// AttentionForward runs lsp_attention_forward(Out, Lse, Qkv, B, T, C, NH)
// and returns its error (see Check).
func AttentionForward(a AttentionArgs) error {
	code := C.lsp_attention_forward_call(a.ptr(a.Out, a.Off), a.ptr(a.Lse, 0), a.ptr(a.Qkv, a.Off),
		C.int(a.B), C.int(a.T), C.int(a.C), C.int(a.NH))
	return Check("lsp_attention_forward", int(code))
}

// AttentionBackward runs lsp_attention_backward(Dqkv, Dout, Qkv, Out, Lse,
// Scratch, B, T, C, NH) and returns its error (see Check).
func AttentionBackward(a AttentionArgs) error {
	code := C.lsp_attention_backward_call(a.ptr(a.Dqkv, a.Off), a.ptr(a.Dout, a.Off), a.ptr(a.Qkv, a.Off),
		a.ptr(a.Out, a.Off), a.ptr(a.Lse, 0), a.ptr(a.Scratch, 0), C.int(a.B), C.int(a.T), C.int(a.C), C.int(a.NH))
	return Check("lsp_attention_backward", int(code))
}
