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

// viewError says why t is not a view inside a live buffer of this backend
// with a known dtype: anything else would give a kernel an address that is
// not (or no longer) the tensor's.
func (b *Backend) viewError(t backend.Tensor) error {
	u, ok := t.Buf.(*buffer)
	if !ok || u == nil {
		return fmt.Errorf("tensor %v is not a CUDA buffer", t)
	}
	if t.DType.Size() == 0 {
		return fmt.Errorf("tensor %v has unknown dtype %v", t, t.DType)
	}
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("tensor %v has a negative shape", t)
		}
	}
	if t.Off < 0 || int64(t.Off)*int64(t.DType.Size())+t.Bytes() > u.bytes {
		return fmt.Errorf("view %v outside its buffer of %d bytes", t, u.bytes)
	}
	if u.owner != b {
		return fmt.Errorf("tensor %v belongs to another backend", t)
	}
	b.mu.Lock()
	live, closed := b.live[u.id] == u, b.closed
	b.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("tensor %v: backend is closed", t)
	case !live:
		return fmt.Errorf("tensor %v: its buffer was freed", t)
	}
	return nil
}

// checkTensor is viewError's verdict on t, named what.
func (b *Backend) checkTensor(what string, t backend.Tensor) error {
	if err := b.viewError(t); err != nil {
		return fmt.Errorf("cuda: %s: %w", what, err)
	}
	return nil
}

// checkArg is checkTensor for argument arg of op (backend.CheckCall's
// live check): it builds no name unless t fails.
func (b *Backend) checkArg(op, arg string, t backend.Tensor) error {
	if err := b.viewError(t); err != nil {
		return fmt.Errorf("cuda: %s %s: %w", op, arg, err)
	}
	return nil
}

type arg struct {
	name string
	t    backend.Tensor
	n    int
	ints bool
}

// needAll checks that each argument is a valid float tensor (fp32 or bf16;
// I32 when ints) of its number of elements.
func (b *Backend) needAll(op string, args ...arg) error {
	for _, a := range args {
		if err := b.checkTensor(op+" "+a.name, a.t); err != nil {
			return err
		}
		float := a.t.DType == backend.F32 || a.t.DType == backend.BF16
		if a.ints != (a.t.DType == backend.I32) || !a.ints && !float {
			return fmt.Errorf("cuda: %s: %s has dtype %v", op, a.name, a.t.DType)
		}
		if a.t.Len() != a.n {
			return fmt.Errorf("cuda: %s: %s has %d elements, want %d", op, a.name, a.t.Len(), a.n)
		}
	}
	return nil
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
	ints := src.DType == backend.I32
	n := src.Len()
	if err := b.needAll(op, arg{"dst", dst, n, ints}, arg{"src", src, n, ints}); err != nil {
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
	skip, err := backend.CheckCall(c, "cuda", c.Op, b.checkArg)
	if err != nil {
		return err
	}
	if err := dtypes(c.Op, c.Tensors...); err != nil || skip {
		return err
	}
	run := launches[c.Op]
	return b.launch(s, c.Op, func(st kernels.Stream) error { return run(b, c, st) })
}
