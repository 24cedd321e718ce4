//go:build cuda || cudasim

// The compute ops of the CUDA backend: the CPU backend's argument checks
// (train/cpu/ops.go, the same sizes refused with the same reasons), the
// dtype table (backend.CheckDTypes, so an fp32 GEMM is refused by name at
// enqueue, not by a launch error), then one launcher of the generated face
// (package kernels) on the device thread. A launcher's own refusal (its
// size limits, the launch configuration) comes back at once; a fault while
// the kernel runs is sticky and surfaces at Synchronize.

package cuda

import (
	"fmt"
	"strings"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// checkTensor checks that t is a view inside a live buffer of this backend
// with a known dtype: anything else would give a kernel an address that is
// not (or no longer) the tensor's.
func (b *Backend) checkTensor(what string, t backend.Tensor) error {
	u, ok := t.Buf.(*buffer)
	if !ok || u == nil {
		return fmt.Errorf("cuda: %s: tensor %v is not a CUDA buffer", what, t)
	}
	if t.DType.Size() == 0 {
		return fmt.Errorf("cuda: %s: tensor %v has unknown dtype %v", what, t, t.DType)
	}
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("cuda: %s: tensor %v has a negative shape", what, t)
		}
	}
	if t.Off < 0 || int64(t.Off)*int64(t.DType.Size())+t.Bytes() > u.bytes {
		return fmt.Errorf("cuda: %s: view %v outside its buffer of %d bytes", what, t, u.bytes)
	}
	if u.owner != b {
		return fmt.Errorf("cuda: %s: tensor %v belongs to another backend", what, t)
	}
	b.mu.Lock()
	live, closed := b.live[u.id] == u, b.closed
	b.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("cuda: %s: tensor %v: backend is closed", what, t)
	case !live:
		return fmt.Errorf("cuda: %s: tensor %v: its buffer was freed", what, t)
	}
	return nil
}

// checkDims rejects negative sizes; names lists them, space separated.
func checkDims(op, names string, vals ...int) error {
	for i, name := range strings.Fields(names) {
		if vals[i] < 0 {
			return fmt.Errorf("cuda: %s: %s=%d is negative", op, name, vals[i])
		}
	}
	return nil
}

// checkPositive rejects sizes below 1; names lists them, space separated.
func checkPositive(op, names string, vals ...int) error {
	for i, name := range strings.Fields(names) {
		if vals[i] < 1 {
			return fmt.Errorf("cuda: %s: %s=%d, want >= 1", op, name, vals[i])
		}
	}
	return nil
}

type arg struct {
	name string
	t    backend.Tensor
	n    int
	ints bool
}

func f(name string, t backend.Tensor, n int) arg   { return arg{name, t, n, false} }
func i32(name string, t backend.Tensor, n int) arg { return arg{name, t, n, true} }

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

// scratch checks a scratch argument of dtype dt of which the op needs n
// elements (none when n is 0, and then t may be absent).
func (b *Backend) scratch(op, name, size string, t backend.Tensor, dt backend.DType, n int) error {
	if n == 0 && t.Buf == nil {
		return nil
	}
	if err := b.checkTensor(op+" "+name, t); err != nil {
		return err
	}
	if t.DType != dt {
		return fmt.Errorf("cuda: %s: %s has dtype %v, want %v", op, name, t.DType, dt)
	}
	if t.Len() < n {
		return fmt.Errorf("cuda: %s: %s has %d elements, the op needs %d (backend.%s)", op, name, t.Len(), n, size)
	}
	return nil
}

// flag is a tensor's launcher dtype flag (its *_bf16 argument).
func flag(t backend.Tensor) kernels.DType {
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

// Fill implements backend.Ops (lsp_fill).
func (b *Backend) Fill(s backend.Stream, t backend.Tensor, v float32) error {
	const op = "Fill"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := b.needAll(op, f("t", t, t.Len())); err != nil {
		return err
	}
	if err := dtypes(op, t); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.Fill(b.ptr(t), v, int64(t.Len()), flag(t), st)
	})
}

// Scale implements backend.Ops (lsp_scale).
func (b *Backend) Scale(s backend.Stream, t backend.Tensor, a float32) error {
	const op = "Scale"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := b.needAll(op, f("t", t, t.Len())); err != nil {
		return err
	}
	if err := dtypes(op, t); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.Scale(b.ptr(t), a, int64(t.Len()), flag(t), st)
	})
}

// Add implements backend.Ops (lsp_add).
func (b *Backend) Add(s backend.Stream, out, x, y backend.Tensor) error {
	const op = "Add"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := out.Len()
	if err := b.needAll(op, f("out", out, n), f("a", x, n), f("b", y, n)); err != nil {
		return err
	}
	if err := dtypes(op, out, x, y); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.Add(b.ptr(out), b.ptr(x), b.ptr(y), int64(n), flag(out), flag(x), flag(y), st)
	})
}

// Accumulate implements backend.Ops (lsp_accumulate).
func (b *Backend) Accumulate(s backend.Stream, dst, src backend.Tensor) error {
	const op = "Accumulate"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := dst.Len()
	if err := b.needAll(op, f("dst", dst, n), f("src", src, n)); err != nil {
		return err
	}
	if err := dtypes(op, dst, src); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.Accumulate(b.ptr(dst), b.ptr(src), int64(n), flag(dst), flag(src), st)
	})
}

// positions checks an op's pos argument (backend.Positions): absent (the
// kernel gets NULL: unpacked rows), or I32 with B*T elements. Its values
// are the caller's to get right (backend.CheckPositions); the kernels
// cannot report a bad one.
func (b *Backend) positions(op string, pos backend.Tensor, B, T int) error {
	if pos.Buf == nil {
		return nil
	}
	return b.needAll(op, i32("pos", pos, B*T))
}

// EncoderForward implements backend.Ops (lsp_encoder_forward).
func (b *Backend) EncoderForward(s backend.Stream, out, inp, pos, wte, wpe backend.Tensor, B, T, C int) error {
	const op = "EncoderForward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "B T", B, T); err != nil {
		return err
	}
	if C <= 0 {
		return fmt.Errorf("cuda: %s: C=%d, want > 0", op, C)
	}
	noPos := wpe.Buf == nil // LLaMA: no position table; ptr gives the kernel NULL
	if len(wte.Shape) == 0 || wte.Len()%C != 0 || !noPos && wpe.Len() < T*C {
		return fmt.Errorf("cuda: %s: wte %v / wpe %v do not fit C=%d T=%d", op, wte.Shape, wpe.Shape, C, T)
	}
	V := wte.Len() / C
	if err := b.needAll(op, f("out", out, B*T*C), i32("inp", inp, B*T), f("wte", wte, V*C)); err != nil {
		return err
	}
	if !noPos {
		if err := b.needAll(op, f("wpe", wpe, wpe.Len())); err != nil {
			return err
		}
	}
	if err := b.positions(op, pos, B, T); err != nil {
		return err
	}
	if err := dtypes(op, out, inp, pos, wte, wpe); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.EncoderForward(b.ptr(out), b.ptr(inp), b.ptr(pos), b.ptr(wte), b.ptr(wpe), B, T, C, V, flag(out), st)
	})
}

// EncoderBackward implements backend.Ops (lsp_encoder_backward).
func (b *Backend) EncoderBackward(s backend.Stream, dwte, dwpe, dout, inp, pos backend.Tensor, B, T, C int) error {
	const op = "EncoderBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "B T", B, T); err != nil {
		return err
	}
	if C <= 0 {
		return fmt.Errorf("cuda: %s: C=%d, want > 0", op, C)
	}
	V := dwte.Len() / C
	noPos := dwpe.Buf == nil // LLaMA: no position table
	if err := b.needAll(op, f("dwte", dwte, V*C), f("dout", dout, B*T*C), i32("inp", inp, B*T)); err != nil {
		return err
	}
	if !noPos {
		if err := b.needAll(op, f("dwpe", dwpe, dwpe.Len())); err != nil {
			return err
		}
	}
	if err := b.positions(op, pos, B, T); err != nil {
		return err
	}
	if err := dtypes(op, dwte, dwpe, dout, inp, pos); err != nil {
		return err
	}
	if !noPos && dwpe.Len() < T*C {
		return fmt.Errorf("cuda: %s: dwpe has %d elements, want at least %d", op, dwpe.Len(), T*C)
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.EncoderBackward(b.ptr(dwte), b.ptr(dwpe), b.ptr(dout), b.ptr(inp), b.ptr(pos), B, T, C, V, flag(dout), flag(dwte), st)
	})
}

// LayerNormForward implements backend.Ops (lsp_layernorm_forward).
func (b *Backend) LayerNormForward(s backend.Stream, out, mean, rstd, inp, weight, bias backend.Tensor, N, C int, eps float32) error {
	const op = "LayerNormForward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll(op, f("out", out, N*C), f("mean", mean, N), f("rstd", rstd, N),
		f("inp", inp, N*C), f("weight", weight, C), f("bias", bias, C)); err != nil {
		return err
	}
	if err := dtypes(op, out, mean, rstd, inp, weight, bias); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.LayerNormForward(b.ptr(out), b.ptr(mean), b.ptr(rstd), b.ptr(inp), b.ptr(weight), b.ptr(bias), N, C, eps, flag(inp), st)
	})
}

// LayerNormBackward implements backend.Ops (lsp_layernorm_backward).
func (b *Backend) LayerNormBackward(s backend.Stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch backend.Tensor, N, C int) error {
	const op = "LayerNormBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll(op, f("dinp", dinp, N*C), f("dweight", dweight, C), f("dbias", dbias, C),
		f("dout", dout, N*C), f("inp", inp, N*C), f("weight", weight, C), f("mean", mean, N), f("rstd", rstd, N)); err != nil {
		return err
	}
	if err := b.scratch(op, "scratch", "LayerNormBackwardScratch", scratch, backend.F32, backend.LayerNormBackwardScratch(N, C)); err != nil {
		return err
	}
	if err := dtypes(op, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.LayerNormBackward(b.ptr(dinp), b.ptr(dweight), b.ptr(dbias), b.ptr(dout), b.ptr(inp), b.ptr(weight),
			b.ptr(mean), b.ptr(rstd), b.ptr(scratch), N, C, flag(inp), flag(dout), flag(dweight), st)
	})
}

// Gemm implements backend.Ops (lsp_gemm_bf16: A and B bf16, C fp32 or
// bf16; one batch, no epilogue).
func (b *Backend) Gemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	const op = "Gemm"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "M N K", M, N, K); err != nil {
		return err
	}
	if err := b.needAll(op, f("A", A, M*K), f("B", B, K*N), f("C", C, M*N)); err != nil {
		return err
	}
	if err := dtypes(op, A, B, C); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.GemmBF16(transA, transB, M, N, K, alpha, b.ptr(A), 0, b.ptr(B), 0, beta, b.ptr(C), flag(C), 0, 1, 0, false, st)
	})
}

// AddBias implements backend.Ops (lsp_add_bias).
func (b *Backend) AddBias(s backend.Stream, out, bias backend.Tensor, N, OC int) error {
	const op = "AddBias"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "N OC", N, OC); err != nil {
		return err
	}
	if err := b.needAll(op, f("out", out, N*OC), f("bias", bias, OC)); err != nil {
		return err
	}
	if err := dtypes(op, out, bias); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.AddBias(b.ptr(out), b.ptr(bias), N, OC, flag(out), flag(bias), st)
	})
}

// BiasBackward implements backend.Ops (lsp_bias_backward).
func (b *Backend) BiasBackward(s backend.Stream, dbias, dout backend.Tensor, N, OC int) error {
	const op = "BiasBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "N OC", N, OC); err != nil {
		return err
	}
	if err := b.needAll(op, f("dbias", dbias, OC), f("dout", dout, N*OC)); err != nil {
		return err
	}
	if err := dtypes(op, dbias, dout); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.BiasBackward(b.ptr(dbias), b.ptr(dout), N, OC, flag(dbias), flag(dout), st)
	})
}

// checkHeads checks an attention op's shape (the CPU backend's checks)
// and returns the length of qkv (and dqkv).
func checkHeads(op string, B, T, NH, KVH, HS int, layout backend.QKVLayout) (int, error) {
	if err := checkDims(op, "B T NH KVH HS", B, T, NH, KVH, HS); err != nil {
		return 0, err
	}
	if NH <= 0 || KVH <= 0 || NH%KVH != 0 {
		return 0, fmt.Errorf("cuda: %s: NH=%d query heads not a positive multiple of KVH=%d key/value heads", op, NH, KVH)
	}
	if layout != backend.QKVFused && layout != backend.QKVPlanar {
		return 0, fmt.Errorf("cuda: %s: unknown qkv layout %v", op, layout)
	}
	return B * T * (NH + 2*KVH) * HS, nil
}

// AttentionForward implements backend.Ops (lsp_attention_forward).
func (b *Backend) AttentionForward(s backend.Stream, out, lse, qkv, pos backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	const op = "AttentionForward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n, err := checkHeads(op, B, T, NH, KVH, HS, layout)
	if err != nil {
		return err
	}
	if err := b.needAll(op, f("out", out, B*T*NH*HS), f("lse", lse, B*NH*T), f("qkv", qkv, n)); err != nil {
		return err
	}
	if err := b.positions(op, pos, B, T); err != nil {
		return err
	}
	if err := dtypes(op, out, lse, qkv, pos); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.AttentionForward(b.ptr(out), b.ptr(lse), b.ptr(qkv), b.ptr(pos), B, T, NH, KVH, HS, int(layout), st)
	})
}

// AttentionBackward implements backend.Ops (lsp_attention_backward).
func (b *Backend) AttentionBackward(s backend.Stream, dqkv, dout, qkv, out, lse, pos, scratch backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	const op = "AttentionBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n, err := checkHeads(op, B, T, NH, KVH, HS, layout)
	if err != nil {
		return err
	}
	if err := b.needAll(op, f("dqkv", dqkv, n), f("dout", dout, B*T*NH*HS), f("qkv", qkv, n),
		f("out", out, B*T*NH*HS), f("lse", lse, B*NH*T)); err != nil {
		return err
	}
	if err := b.scratch(op, "scratch", "AttentionBackwardScratch", scratch, backend.F32, backend.AttentionBackwardScratch(B, T, NH)); err != nil {
		return err
	}
	if err := b.positions(op, pos, B, T); err != nil {
		return err
	}
	if err := dtypes(op, dqkv, dout, qkv, out, lse, pos, scratch); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.AttentionBackward(b.ptr(dqkv), b.ptr(dout), b.ptr(qkv), b.ptr(out), b.ptr(lse), b.ptr(pos), b.ptr(scratch),
			B, T, NH, KVH, HS, int(layout), st)
	})
}

// GeluForward implements backend.Ops (lsp_gelu_forward).
func (b *Backend) GeluForward(s backend.Stream, out, inp backend.Tensor) error {
	const op = "GeluForward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := inp.Len()
	if err := b.needAll(op, f("out", out, n), f("inp", inp, n)); err != nil {
		return err
	}
	if err := dtypes(op, out, inp); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.GeluForward(b.ptr(out), b.ptr(inp), int64(n), flag(inp), st)
	})
}

// GeluBackward implements backend.Ops (lsp_gelu_backward).
func (b *Backend) GeluBackward(s backend.Stream, dinp, inp, dout backend.Tensor) error {
	const op = "GeluBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := inp.Len()
	if err := b.needAll(op, f("dinp", dinp, n), f("inp", inp, n), f("dout", dout, n)); err != nil {
		return err
	}
	if err := dtypes(op, dinp, inp, dout); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.GeluBackward(b.ptr(dinp), b.ptr(inp), b.ptr(dout), int64(n), flag(inp), flag(dout), st)
	})
}

// SwiGLUForward implements backend.Ops (lsp_swiglu_forward).
func (b *Backend) SwiGLUForward(s backend.Stream, out, gate, up backend.Tensor) error {
	const op = "SwiGLUForward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := gate.Len()
	if err := b.needAll(op, f("out", out, n), f("gate", gate, n), f("up", up, n)); err != nil {
		return err
	}
	if err := dtypes(op, out, gate, up); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SwiGLUForward(b.ptr(out), b.ptr(gate), b.ptr(up), int64(n), flag(gate), st)
	})
}

// SwiGLUBackward implements backend.Ops (lsp_swiglu_backward).
func (b *Backend) SwiGLUBackward(s backend.Stream, dgate, dup, dout, gate, up backend.Tensor) error {
	const op = "SwiGLUBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := gate.Len()
	if err := b.needAll(op, f("dgate", dgate, n), f("dup", dup, n), f("dout", dout, n), f("gate", gate, n), f("up", up, n)); err != nil {
		return err
	}
	if err := dtypes(op, dgate, dup, dout, gate, up); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SwiGLUBackward(b.ptr(dgate), b.ptr(dup), b.ptr(dout), b.ptr(gate), b.ptr(up), int64(n), flag(gate), flag(dout), st)
	})
}

// RMSNormForward implements backend.Ops (lsp_rmsnorm_forward).
func (b *Backend) RMSNormForward(s backend.Stream, out, rstd, inp, weight backend.Tensor, N, C int, eps float32) error {
	const op = "RMSNormForward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll(op, f("out", out, N*C), f("rstd", rstd, N), f("inp", inp, N*C), f("weight", weight, C)); err != nil {
		return err
	}
	if err := dtypes(op, out, rstd, inp, weight); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.RMSNormForward(b.ptr(out), b.ptr(rstd), b.ptr(inp), b.ptr(weight), N, C, eps, flag(inp), st)
	})
}

// RMSNormBackward implements backend.Ops (lsp_rmsnorm_backward).
func (b *Backend) RMSNormBackward(s backend.Stream, dinp, dweight, dout, inp, weight, rstd, scratch backend.Tensor, N, C int) error {
	const op = "RMSNormBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll(op, f("dinp", dinp, N*C), f("dweight", dweight, C), f("dout", dout, N*C),
		f("inp", inp, N*C), f("weight", weight, C), f("rstd", rstd, N)); err != nil {
		return err
	}
	if err := b.scratch(op, "scratch", "RMSNormBackwardScratch", scratch, backend.F32, backend.RMSNormBackwardScratch(N, C)); err != nil {
		return err
	}
	if err := dtypes(op, dinp, dweight, dout, inp, weight, rstd, scratch); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.RMSNormBackward(b.ptr(dinp), b.ptr(dweight), b.ptr(dout), b.ptr(inp), b.ptr(weight), b.ptr(rstd),
			b.ptr(scratch), N, C, flag(inp), flag(dout), flag(dweight), st)
	})
}

// RoPEForward implements backend.Ops (lsp_rope_forward).
func (b *Backend) RoPEForward(s backend.Stream, out, inp, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	const op = "RoPEForward"
	n, err := b.ropeArgs(op, "out", "inp", out, inp, pos, invFreq, B, T, NH, HS)
	if err != nil || n == 0 {
		return err // nothing to rotate (HS may be 0, which the launcher refuses)
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.RoPEForward(b.ptr(out), b.ptr(inp), b.ptr(pos), b.ptr(invFreq), B, T, NH, HS, flag(inp), st)
	})
}

// RoPEBackward implements backend.Ops (lsp_rope_backward).
func (b *Backend) RoPEBackward(s backend.Stream, dinp, dout, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	const op = "RoPEBackward"
	n, err := b.ropeArgs(op, "dinp", "dout", dinp, dout, pos, invFreq, B, T, NH, HS)
	if err != nil || n == 0 {
		return err // nothing to rotate (HS may be 0, which the launcher refuses)
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.RoPEBackward(b.ptr(dinp), b.ptr(dout), b.ptr(pos), b.ptr(invFreq), B, T, NH, HS, flag(dout), st)
	})
}

// ropeArgs checks the arguments of both RoPE ops, out and inp (dinp and
// dout) [B,T,NH,HS], invFreq [HS/2], HS even, and returns the number of
// elements rotated.
func (b *Backend) ropeArgs(op, outName, inName string, out, inp, pos, invFreq backend.Tensor, B, T, NH, HS int) (int, error) {
	if err := b.onDevice(op); err != nil {
		return 0, err
	}
	if err := checkDims(op, "B T NH HS", B, T, NH, HS); err != nil {
		return 0, err
	}
	if HS%2 != 0 {
		return 0, fmt.Errorf("cuda: %s: head size HS=%d is odd", op, HS)
	}
	n := B * T * NH * HS
	if err := b.needAll(op, f(outName, out, n), f(inName, inp, n), f("invFreq", invFreq, HS/2)); err != nil {
		return 0, err
	}
	if err := b.positions(op, pos, B, T); err != nil {
		return 0, err
	}
	return n, dtypes(op, out, inp, pos, invFreq)
}

// CrossEntropyForwardBackward implements backend.Ops
// (lsp_cross_entropy_forward_backward). Targets are not checked against V
// on the device (the CPU backend checks them on its stream).
func (b *Backend) CrossEntropyForwardBackward(s backend.Stream, losses, logits, targets backend.Tensor, N, V int, scale float32) error {
	const op = "CrossEntropyForwardBackward"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "N V", N, V); err != nil {
		return err
	}
	if err := b.needAll(op, f("losses", losses, N), f("logits", logits, N*V), i32("targets", targets, N)); err != nil {
		return err
	}
	if err := dtypes(op, losses, logits, targets); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.CrossEntropyForwardBackward(b.ptr(losses), b.ptr(logits), b.ptr(targets), N, V, scale, flag(logits), st)
	})
}

// SumSquares implements backend.Ops (lsp_sum_squares).
func (b *Backend) SumSquares(s backend.Stream, out, x, work backend.Tensor) error {
	const op = "SumSquares"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := b.needAll(op, f("out", out, 1), f("x", x, x.Len())); err != nil {
		return err
	}
	if err := b.scratch(op, "work", "SumSquaresWork", work, backend.F64, backend.SumSquaresWork); err != nil {
		return err
	}
	if err := dtypes(op, out, x, work); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SumSquares(b.ptr(out), b.ptr(x), flag(x), int64(x.Len()), b.ptr(work), st)
	})
}

// NonFiniteFlag implements backend.Ops (lsp_non_finite_flag): flag[0] =
// 1 when any element of x is NaN or infinite, else 0.
func (b *Backend) NonFiniteFlag(s backend.Stream, flag, x backend.Tensor) error {
	const op = "NonFiniteFlag"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := b.needAll(op, f("flag", flag, 1), f("x", x, x.Len())); err != nil {
		return err
	}
	if err := dtypes(op, flag, x); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.NonFiniteFlag(b.ptr(flag), b.ptr(x), int64(x.Len()), st)
	})
}

// AdamW implements backend.Ops (lsp_adamw).
func (b *Backend) AdamW(s backend.Stream, param, master, grad, m, v, sumSq, skip backend.Tensor, p backend.AdamParams) error {
	const op = "AdamW"
	if err := b.onDevice(op); err != nil {
		return err
	}
	n := param.Len()
	args := []arg{f("param", param, n), f("grad", grad, n), f("m", m, n), f("v", v, n)}
	if master.Buf != nil {
		args = append(args, f("master", master, n))
	}
	if skip.Buf != nil {
		args = append(args, f("skip", skip, 1))
	}
	if p.MaxNorm > 0 {
		args = append(args, f("sumSq", sumSq, 1))
	}
	if err := b.needAll(op, args...); err != nil {
		return err
	}
	if p.Step < 1 {
		return fmt.Errorf("cuda: %s: step %d, want >= 1", op, p.Step)
	}
	if p.MaxNorm <= 0 {
		sumSq = backend.Tensor{} // not read: absent for the kernel and the table
	}
	if err := dtypes(op, param, master, grad, m, v, sumSq, skip); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.AdamW(b.ptr(param), flag(param), b.ptr(master), b.ptr(grad), flag(grad), b.ptr(m), b.ptr(v), b.ptr(sumSq),
			b.ptr(skip), int64(n), p.LR, p.Beta1, p.Beta2, p.Eps, p.WeightDecay, p.Step, max(p.MaxNorm, 0), st)
	})
}

// SparseCompressA implements backend.Ops (lsp_sparse_compress_a). Index
// contents are trusted (build them with cpu.SparseColumns).
func (b *Backend) SparseCompressA(s backend.Stream, A, X, colptr, rowidx, colval backend.Tensor, BT, m, d int) error {
	const op = "SparseCompressA"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := b.sparseCompressArgs(op, "A", "X", "BT m d", A, X, colptr, rowidx, colval, BT, m, d); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SparseCompressA(b.ptr(A), b.ptr(X), b.ptr(colptr), b.ptr(rowidx), b.ptr(colval), BT, m, d, flag(X), st)
	})
}

// SparseCompressB implements backend.Ops (lsp_sparse_compress_b).
func (b *Backend) SparseCompressB(s backend.Stream, B, dY, colptr, rowidx, colval backend.Tensor, BT, n, d int) error {
	const op = "SparseCompressB"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := b.sparseCompressArgs(op, "B", "dY", "BT n d", B, dY, colptr, rowidx, colval, BT, n, d); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SparseCompressB(b.ptr(B), b.ptr(dY), b.ptr(colptr), b.ptr(rowidx), b.ptr(colval), BT, n, d, flag(dY), st)
	})
}

// sparseCompressArgs checks the arguments of both compress ops: out [d*BT]
// fp32 from x [BT, rows] through a projector of d columns in column
// storage.
func (b *Backend) sparseCompressArgs(op, outName, xName, dims string, out, x, colptr, rowidx, colval backend.Tensor, BT, rows, d int) error {
	if err := checkPositive(op, dims, BT, rows, d); err != nil {
		return err
	}
	nnz := rowidx.Len()
	if err := b.needAll(op, f(outName, out, d*BT), f(xName, x, BT*rows), i32("colptr", colptr, d+1),
		i32("rowidx", rowidx, nnz), f("colval", colval, nnz)); err != nil {
		return err
	}
	return dtypes(op, out, x, colptr, rowidx, colval)
}

// SparseS implements backend.Ops (lsp_sparse_s).
func (b *Backend) SparseS(s backend.Stream, S, A, B backend.Tensor, BT, d int, accumulate bool) error {
	const op = "SparseS"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkPositive(op, "BT d", BT, d); err != nil {
		return err
	}
	if err := b.needAll(op, f("S", S, d*d), f("A", A, d*BT), f("B", B, BT*d)); err != nil {
		return err
	}
	if err := dtypes(op, S, A, B); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SparseS(b.ptr(S), b.ptr(A), b.ptr(B), BT, d, accumulate, st)
	})
}

// SparseApply implements backend.Ops (lsp_sparse_apply). Index contents
// are trusted (check them with cpu.CheckSparseRows).
func (b *Backend) SparseApply(s backend.Stream, W, T, Delta, pidx, pval, qidx, qval, skip backend.Tensor, m, n, d, r int,
	lr, wd float32, seed, step uint64, matrix uint32) error {
	const op = "SparseApply"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkPositive(op, "m n d r", m, n, d, r); err != nil {
		return err
	}
	if r > d {
		return fmt.Errorf("cuda: %s: r=%d > d=%d", op, r, d)
	}
	if err := b.needAll(op, f("W", W, m*n), f("T", T, d*n), f("Delta", Delta, d*d),
		i32("pidx", pidx, m*r), f("pval", pval, m*r), i32("qidx", qidx, n*r), f("qval", qval, n*r)); err != nil {
		return err
	}
	if skip.Buf != nil {
		if err := b.needAll(op, f("skip", skip, 1)); err != nil {
			return err
		}
	}
	if err := dtypes(op, W, T, Delta, pidx, pval, qidx, qval, skip); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.SparseApply(b.ptr(W), b.ptr(T), b.ptr(Delta), b.ptr(pidx), b.ptr(pval), b.ptr(qidx), b.ptr(qval),
			b.ptr(skip), m, n, d, r, lr, wd, seed, step, matrix, flag(W), st)
	})
}

// DenseGemm implements backend.Ops (lsp_dense_gemm: A and B fp32 or bf16
// each, C fp32; non-contracted, so the CPU backend's bits on a GPU too).
func (b *Backend) DenseGemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	const op = "DenseGemm"
	if err := b.denseArgs(op, M, N, K, f("A", A, M*K), f("B", B, K*N), f("C", C, M*N)); err != nil {
		return err
	}
	if err := dtypes(op, A, B, C); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.DenseGemm(transA, transB, M, N, K, alpha, b.ptr(A), flag(A), b.ptr(B), flag(B), beta, b.ptr(C), st)
	})
}

// DenseApply implements backend.Ops (lsp_dense_apply: A and B fp32, W fp32
// or bf16, stochastic rounding as SparseApply's).
func (b *Backend) DenseApply(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, decay float32, W, skip backend.Tensor,
	seed, step uint64, matrix uint32) error {
	const op = "DenseApply"
	args := []arg{f("A", A, M*K), f("B", B, K*N), f("W", W, M*N)}
	if skip.Buf != nil {
		args = append(args, f("skip", skip, 1))
	}
	if err := b.denseArgs(op, M, N, K, args...); err != nil {
		return err
	}
	if err := dtypes(op, A, B, W, skip); err != nil {
		return err
	}
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.DenseApply(transA, transB, M, N, K, alpha, b.ptr(A), b.ptr(B), decay, b.ptr(W), flag(W), b.ptr(skip),
			seed, step, matrix, st)
	})
}

// denseArgs checks what the dense ops share: the device, M, N, K >= 1
// (the CPU backend's rule) and the tensors.
func (b *Backend) denseArgs(op string, M, N, K int, args ...arg) error {
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkPositive(op, "M N K", M, N, K); err != nil {
		return err
	}
	return b.needAll(op, args...)
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

// quantArgs checks a quantized matrix: its tensors' dtypes and lengths for
// its shape (W.Check) and that each is a live view of this backend.
func (b *Backend) quantArgs(op string, W backend.Quant) error {
	if err := W.Check(); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	for _, t := range []struct {
		name string
		t    backend.Tensor
	}{{"W codes", W.Codes}, {"W absmax", W.Absmax}, {"W scale", W.Scale}, {"W book", W.Book}} {
		if err := b.checkTensor(op+" "+t.name, t.t); err != nil {
			return err
		}
	}
	return nil
}

// qPtrs are the launchers' pointers to a quantized matrix: the bytes of
// the I32 views (4-byte aligned: their device address, Off words in),
// the scales and the codebook.
func (b *Backend) qPtrs(W backend.Quant) (codes, absmax, scale, book kernels.Ptr) {
	return b.ptr(W.Codes), b.ptr(W.Absmax), b.ptr(W.Scale), b.ptr(W.Book)
}

// GemmQ implements backend.Ops (lsp_gemm_q): C = alpha A op(W) + beta C
// with W dequantized to bf16 inside the GEMM's operand loads.
func (b *Backend) GemmQ(s backend.Stream, transW bool, M, N, K int, alpha float32, A backend.Tensor, W backend.Quant, beta float32, C backend.Tensor) error {
	const op = "GemmQ"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := checkDims(op, "M N K", M, N, K); err != nil {
		return err
	}
	if err := b.quantArgs(op, W); err != nil {
		return err
	}
	rows, cols := K, N
	if transW {
		rows, cols = N, K
	}
	if W.Rows != rows || W.Cols != cols {
		return fmt.Errorf("cuda: %s: W is %d x %d, want %d x %d (transW %v, N %d, K %d)", op, W.Rows, W.Cols, rows, cols, transW, N, K)
	}
	if err := b.needAll(op, f("A", A, M*K), f("C", C, M*N)); err != nil {
		return err
	}
	if err := dtypes(op, A, C); err != nil {
		return err
	}
	codes, absmax, scale, book := b.qPtrs(W)
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.GemmQ(transW, M, N, K, alpha, b.ptr(A), int(W.Format), codes, absmax, scale, book, beta, b.ptr(C), flag(C), st)
	})
}

// Dequantize implements backend.Ops (lsp_dequantize): elements
// off..off+out.Len() of W into out.
func (b *Backend) Dequantize(s backend.Stream, W backend.Quant, off int, out backend.Tensor) error {
	const op = "Dequantize"
	if err := b.onDevice(op); err != nil {
		return err
	}
	if err := b.quantArgs(op, W); err != nil {
		return err
	}
	if err := b.checkTensor(op+" out", out); err != nil {
		return err
	}
	n := out.Len()
	if off < 0 || off+n > W.Len() {
		return fmt.Errorf("cuda: %s: elements [%d, %d) of a %d x %d matrix", op, off, off+n, W.Rows, W.Cols)
	}
	if err := b.needAll(op, f("out", out, n)); err != nil {
		return err
	}
	if err := dtypes(op, out); err != nil {
		return err
	}
	codes, absmax, scale, book := b.qPtrs(W)
	return b.launch(s, op, func(st kernels.Stream) error {
		return kernels.Dequantize(int(W.Format), codes, absmax, scale, book, int64(W.Len()), int64(off), int64(n), b.ptr(out), flag(out), st)
	})
}
