//go:build cuda || cudasim

// The compute ops of the CUDA backend, one function for all of them (op):
// the checks the op table declares (backend.CheckCall: sizes, each tensor
// a live view of this backend of its count, the ops' rules), the dtype
// table, then the op's launcher (ops_gen.go, generated from the table and
// kernels.h) on the device thread. A launcher's own refusal (its size
// limits, the launch configuration) comes back at once; a fault while the
// kernel runs is sticky and surfaces at Synchronize. The CPU backend
// (train/cpu/ops.go) makes the same checks, so it refuses the same calls
// for the same reasons.

package cuda

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// bufferState is what the view checks (b.views) need to know of t's
// buffer, or ok false when it is not a CUDA buffer: a tensor that is not a
// live view of this backend would give a kernel an address that is not
// (or no longer) the tensor's.
func (b *Backend) bufferState(t backend.Tensor) (st backend.BufferState, ok bool) {
	u, ok := t.Buf.(*buffer)
	if !ok || u == nil {
		return st, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.BufferState{Bytes: u.bytes, Foreign: u.owner != b, Live: b.live[u.id] == u, Closed: b.closed}, true
}

// dtypes refuses what op's kernel does not take (the table of
// backend.KernelDTypes); ts are the op's tensors in its method's order.
func dtypes(op string, ts ...backend.Tensor) error {
	if err := backend.CheckDTypes(op, ts...); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return nil
}

// flagOf is a tensor's launcher dtype flag (its *_bf16 argument).
func flagOf(t backend.Tensor) kernels.DType {
	if t.DType == backend.BF16 {
		return kernels.BF16
	}
	return kernels.F32
}

// launch runs one launcher on the device thread, on stream s.
func (b *Backend) launch(s backend.Stream, op string, run func(kernels.Stream) error) error {
	st, err := b.stream(s)
	if err != nil {
		return err
	}
	if err := b.w.do(func() error { return run(kernels.Stream(st.h)) }); err != nil {
		return fmt.Errorf("cuda: %s on stream %s: %w", op, st.name, err)
	}
	return nil
}

// CopyD2D implements backend.Backend: same length, converting dtypes (I32
// only to I32): a cudaMemcpyAsync for one dtype, a cast kernel
// (lsp_cast_*) between fp32 and bf16.
func (b *Backend) CopyD2D(s backend.Stream, dst, src backend.Tensor) error {
	const op = "CopyD2D"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := src.Len()
	if err := b.views.Copy(op, dst, src); err != nil {
		return err
	}
	if src.DType == dst.DType {
		return b.copyTo(s, "copy d2d", uintptr(b.ptr(dst)), uintptr(b.ptr(src)), src.Bytes(), d2d)
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		if dst.DType == backend.BF16 {
			return kernels.CastF32ToBF16(b.ptr(dst), b.ptr(src), int64(n), st)
		}
		return kernels.CastBF16ToF32(b.ptr(dst), b.ptr(src), int64(n), st)
	})
}

// op checks and launches one call of any op (the backend's OpsFunc): the
// table's checks (backend.CheckCall), then the dtype table's.
func (b *Backend) op(s backend.Stream, c *backend.Call) error {
	if err := b.onDevice(c.Op); err != nil {
		return err
	}
	skip, err := backend.CheckCall(c, "cuda", c.Op, b.views.Arg)
	if err != nil {
		return err
	}
	if err := dtypes(c.Op, c.Tensors...); err != nil || skip {
		return err
	}
	run := launches[c.Op]
	return b.launch(s, c.Op, func(st kernels.Stream) error { return run(b, c, st) })
}
