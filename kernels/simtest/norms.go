//go:build lsp_sim || cuda

// Go face of kernels/norms.cu for the simulator tests (LayerNorm and
// RMSNorm launchers), and FloatBuf, the typed buffer that the Go faces of
// norms, activations, rope, embedding and softmax_ce take: those launchers
// receive the dtype of each group of tensors as a flag (backend.DType
// values: 0 fp32, 1 bf16), and the wrappers derive it from the buffers,
// refusing groups of mixed dtypes. The wrappers check nothing else; the
// launchers' own argument checks are part of what the tests exercise.

package simtest

/*
#include "kernels.h"
*/
import "C"

import (
	"fmt"
	"testing"
	"unsafe"
)

// FloatBuf is a simulator buffer of float values stored as bf16 (BF16) or
// fp32. The zero FloatBuf passes a NULL pointer.
type FloatBuf struct {
	Buf  *Buffer
	BF16 bool
}

// NewFloatBuf allocates a buffer holding vals (rounded to nearest even for
// bf16), with its guard page right after the end or, with guardBefore,
// right before the start.
func NewFloatBuf(t testing.TB, vals []float32, bf16, guardBefore bool) FloatBuf {
	t.Helper()
	size := 4
	if bf16 {
		size = 2
	}
	var b *Buffer
	if guardBefore {
		b = AllocBefore(t, size*len(vals))
	} else {
		b = Alloc(t, size*len(vals))
	}
	f := FloatBuf{Buf: b, BF16: bf16}
	f.Set(vals)
	return f
}

// Set stores vals at the start of the buffer (rounded for bf16).
func (f FloatBuf) Set(vals []float32) {
	if f.BF16 {
		f.Buf.SetBF16(vals)
	} else {
		copy(f.Buf.Float32(), vals)
	}
}

// Values returns a copy of the buffer's values widened to float32.
func (f FloatBuf) Values() []float32 {
	if f.BF16 {
		return f.Buf.BF16()
	}
	return append([]float32(nil), f.Buf.Float32()...)
}

func (f FloatBuf) ptr() unsafe.Pointer {
	if f.Buf == nil {
		return nil
	}
	return f.Buf.Ptr()
}

func bufPtr(b *Buffer) unsafe.Pointer {
	if b == nil {
		return nil
	}
	return b.Ptr()
}

func f32Ptr(b *Buffer) *C.float { return (*C.float)(bufPtr(b)) }

func i32Ptr(b *Buffer) *C.int { return (*C.int)(bufPtr(b)) }

// dtypeFlag is the launchers' flag for a group of tensors (nil buffers
// are ignored); it fails when the group mixes bf16 and fp32.
func dtypeFlag(op, group string, fs ...FloatBuf) (C.int, error) {
	flag, seen := C.int(0), false
	for _, f := range fs {
		if f.Buf == nil {
			continue
		}
		v := C.int(0)
		if f.BF16 {
			v = 1
		}
		if seen && v != flag {
			return 0, fmt.Errorf("%s: the %s tensors mix bf16 and fp32", op, group)
		}
		flag, seen = v, true
	}
	return flag, nil
}

// LayerNormForward runs lsp_layernorm_forward: out, inp, weight, bias share
// one dtype; mean and rstd are fp32 buffers or nil.
func LayerNormForward(out FloatBuf, mean, rstd *Buffer, inp, weight, bias FloatBuf, N, Ch int, eps float32) error {
	const op = "lsp_layernorm_forward"
	x, err := dtypeFlag(op, "value", out, inp, weight, bias)
	if err != nil {
		return err
	}
	code := C.lsp_layernorm_forward(out.ptr(), f32Ptr(mean), f32Ptr(rstd), inp.ptr(), weight.ptr(), bias.ptr(),
		C.int(N), C.int(Ch), C.float(eps), x, nil)
	return Check(op, int(code))
}

// LayerNormBackwardScratchBytes is lsp_layernorm_backward_scratch_bytes.
func LayerNormBackwardScratchBytes(N, Ch int) int {
	return int(C.lsp_layernorm_backward_scratch_bytes(C.int(N), C.int(Ch)))
}

// LayerNormBackward runs lsp_layernorm_backward: dinp, dweight, dbias, dout
// share one dtype, inp and weight another; mean, rstd and scratch are fp32.
func LayerNormBackward(dinp, dweight, dbias, dout, inp, weight FloatBuf, mean, rstd, scratch *Buffer, N, Ch int) error {
	const op = "lsp_layernorm_backward"
	g, err := dtypeFlag(op, "gradient", dinp, dweight, dbias, dout)
	if err != nil {
		return err
	}
	x, err := dtypeFlag(op, "value", inp, weight)
	if err != nil {
		return err
	}
	code := C.lsp_layernorm_backward(dinp.ptr(), dweight.ptr(), dbias.ptr(), dout.ptr(), inp.ptr(), weight.ptr(),
		f32Ptr(mean), f32Ptr(rstd), f32Ptr(scratch), C.int(N), C.int(Ch), x, g, nil)
	return Check(op, int(code))
}

// RMSNormForward runs lsp_rmsnorm_forward: out, inp, weight share one
// dtype; rstd is an fp32 buffer or nil.
func RMSNormForward(out FloatBuf, rstd *Buffer, inp, weight FloatBuf, N, Ch int, eps float32) error {
	const op = "lsp_rmsnorm_forward"
	x, err := dtypeFlag(op, "value", out, inp, weight)
	if err != nil {
		return err
	}
	code := C.lsp_rmsnorm_forward(out.ptr(), f32Ptr(rstd), inp.ptr(), weight.ptr(), C.int(N), C.int(Ch),
		C.float(eps), x, nil)
	return Check(op, int(code))
}

// RMSNormBackwardScratchBytes is lsp_rmsnorm_backward_scratch_bytes.
func RMSNormBackwardScratchBytes(N, Ch int) int {
	return int(C.lsp_rmsnorm_backward_scratch_bytes(C.int(N), C.int(Ch)))
}

// RMSNormBackward runs lsp_rmsnorm_backward: dinp, dweight, dout share one
// dtype, inp and weight another; rstd and scratch are fp32.
func RMSNormBackward(dinp, dweight, dout, inp, weight FloatBuf, rstd, scratch *Buffer, N, Ch int) error {
	const op = "lsp_rmsnorm_backward"
	g, err := dtypeFlag(op, "gradient", dinp, dweight, dout)
	if err != nil {
		return err
	}
	x, err := dtypeFlag(op, "value", inp, weight)
	if err != nil {
		return err
	}
	code := C.lsp_rmsnorm_backward(dinp.ptr(), dweight.ptr(), dout.ptr(), inp.ptr(), weight.ptr(), f32Ptr(rstd),
		f32Ptr(scratch), C.int(N), C.int(Ch), x, g, nil)
	return Check(op, int(code))
}
