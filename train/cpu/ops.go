// The compute ops of the CPU backend: argument checks, declared accesses,
// and the dtype conversions at load and store, around the references of
// ref_<family>.go (one file per kernels/<family>.cu). bf16 tensors are
// widened to fp32 at load and rounded to nearest even at store, as the
// CUDA kernels do.

package cpu

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

func bytesOf(t backend.Tensor) []byte {
	u := t.Buf.(*buffer)
	lo := t.Off * t.DType.Size()
	return u.data[lo : lo+int(t.Bytes())]
}

func f32View(t backend.Tensor) []float32 {
	b := bytesOf(t)
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

func u16View(t backend.Tensor) []uint16 {
	b := bytesOf(t)
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}

func i32View(t backend.Tensor) []int32 {
	b := bytesOf(t)
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// i32OrNil is i32View(t), or nil for an absent t.
func i32OrNil(t backend.Tensor) []int32 {
	if t.Buf == nil {
		return nil
	}
	return i32View(t)
}

// load returns t as fp32: the memory itself for fp32 tensors (writes go
// straight through), a widened copy for bf16 ones (see store).
func load(t backend.Tensor) []float32 {
	if t.DType == backend.F32 {
		return f32View(t)
	}
	src := u16View(t)
	out := make([]float32, len(src))
	bf16.ToFloat32Slice(out, src)
	return out
}

// store writes v, obtained from load(t), back to t.
func store(t backend.Tensor, v []float32) {
	if t.DType == backend.F32 {
		return
	}
	bf16.FromFloat32Slice(u16View(t), v)
}

// checkTensor checks that t is a view inside a live buffer of this backend
// with a known dtype. Anything else would index out of range, or touch
// memory that is no longer (or never was) this backend's, on the stream.
func (b *Backend) checkTensor(what string, t backend.Tensor) error {
	u, ok := t.Buf.(*buffer)
	if !ok || u == nil {
		return fmt.Errorf("cpu: %s: tensor %v is not a CPU buffer", what, t)
	}
	if t.DType.Size() == 0 {
		return fmt.Errorf("cpu: %s: tensor %v has unknown dtype %v", what, t, t.DType)
	}
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("cpu: %s: tensor %v has a negative shape", what, t)
		}
	}
	if t.Off < 0 || int64(t.Off)*int64(t.DType.Size())+t.Bytes() > int64(len(u.data)) {
		return fmt.Errorf("cpu: %s: view %v outside its buffer of %d bytes", what, t, len(u.data))
	}
	if u.owner != b {
		return fmt.Errorf("cpu: %s: tensor %v belongs to another backend", what, t)
	}
	b.mu.Lock()
	live, closed := b.live[u.id] == u, b.closed
	b.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("cpu: %s: tensor %v: backend is closed", what, t)
	case !live:
		return fmt.Errorf("cpu: %s: tensor %v: its buffer was freed", what, t)
	}
	return nil
}

// checkDims rejects negative sizes: two of them can multiply into a
// plausible element count that then indexes out of range on the stream.
// names lists the sizes' names, separated by spaces.
func checkDims(op, names string, vals ...int) error {
	for i, name := range strings.Fields(names) {
		if vals[i] < 0 {
			return fmt.Errorf("cpu: %s: %s=%d is negative", op, name, vals[i])
		}
	}
	return nil
}

// need checks that t is a valid float tensor (fp32 or bf16; I32 when ints)
// of n elements.
func (b *Backend) need(op, arg string, t backend.Tensor, n int, ints bool) error {
	if err := b.checkTensor(op+" "+arg, t); err != nil {
		return err
	}
	float := t.DType == backend.F32 || t.DType == backend.BF16
	if ints != (t.DType == backend.I32) || !ints && !float {
		return fmt.Errorf("cpu: %s: %s has dtype %v", op, arg, t.DType)
	}
	if t.Len() != n {
		return fmt.Errorf("cpu: %s: %s has %d elements, want %d", op, arg, t.Len(), n)
	}
	return nil
}

type arg struct {
	name string
	t    backend.Tensor
	n    int
	ints bool
}

func (b *Backend) needAll(op string, args ...arg) error {
	for _, a := range args {
		if err := b.need(op, a.name, a.t, a.n, a.ints); err != nil {
			return err
		}
	}
	return nil
}

func f(name string, t backend.Tensor, n int) arg { return arg{name, t, n, false} }

// positions checks an op's pos argument (backend.Positions): absent, or
// I32 with B*T elements. Its values are checked when the op runs
// (posView), since an earlier op on the stream may still write them.
func (b *Backend) positions(op string, pos backend.Tensor, B, T int) error {
	if pos.Buf == nil {
		return nil
	}
	return b.need(op, "pos", pos, B*T, true)
}

// posView is pos's values, checked to be a packing of B rows of T
// tokens, or nil for an absent pos (unpacked rows).
func posView(op string, pos backend.Tensor, B, T int) ([]int32, error) {
	if pos.Buf == nil {
		return nil, nil
	}
	p := i32View(pos)[:B*T]
	if err := backend.CheckPositions(p, B, T); err != nil {
		return nil, fmt.Errorf("cpu: %s: %w", op, err)
	}
	return p, nil
}

// kernelDTypes refuses, in the KernelDTypes mode, what the CUDA kernel of
// op does not take; ts are the op's tensors in its method's order.
func (b *Backend) kernelDTypes(op string, ts ...backend.Tensor) error {
	if !b.cfg.KernelDTypes {
		return nil
	}
	if err := backend.CheckDTypes(op, ts...); err != nil {
		return fmt.Errorf("cpu: refused as the CUDA kernel would: %w", err)
	}
	return nil
}

// scratch checks a scratch argument of dtype dt that the op needs n
// elements of (backend's scratch sizes; none when n is 0, and then t may
// be absent), and returns the range the op overwrites.
func (b *Backend) scratch(op, arg, size string, t backend.Tensor, dt backend.DType, n int) (backend.Tensor, error) {
	if n == 0 {
		return backend.Tensor{}, nil
	}
	if err := b.checkTensor(op+" "+arg, t); err != nil {
		return backend.Tensor{}, err
	}
	if t.DType != dt {
		return backend.Tensor{}, fmt.Errorf("cpu: %s: %s has dtype %v, want %v", op, arg, t.DType, dt)
	}
	if t.Len() < n {
		return backend.Tensor{}, fmt.Errorf("cpu: %s: %s has %d elements, the op needs %d (backend.%s)", op, arg, t.Len(), n, size)
	}
	return t.Slice(0, n), nil
}

// spoil overwrites the scratch an op used with NaN, as the kernel leaves it
// holding its partial sums: the CPU backend needs no scratch, but code that
// expects scratch to survive an op must fail here too.
func spoil(t backend.Tensor) {
	if t.Buf == nil {
		return
	}
	if t.DType == backend.F64 {
		b := bytesOf(t)
		v := unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
		for i := range v {
			v[i] = math.NaN()
		}
		return
	}
	v := f32View(t)
	for i := range v {
		v[i] = float32(math.NaN())
	}
}

// Fill implements backend.Ops.
func (b *Backend) Fill(s backend.Stream, t backend.Tensor, v float32) error {
	if err := b.need("fill", "t", t, t.Len(), false); err != nil {
		return err
	}
	if err := b.kernelDTypes("Fill", t); err != nil {
		return err
	}
	return b.enqueue(s, hazard.Fill(t), func() error {
		x := load(t)
		Fill(x, v)
		store(t, x)
		return nil
	})
}

// Scale implements backend.Ops.
func (b *Backend) Scale(s backend.Stream, t backend.Tensor, a float32) error {
	if err := b.need("scale", "t", t, t.Len(), false); err != nil {
		return err
	}
	if err := b.kernelDTypes("Scale", t); err != nil {
		return err
	}
	return b.enqueue(s, hazard.Scale(t), func() error {
		x := load(t)
		Scale(x, a)
		store(t, x)
		return nil
	})
}

// Add implements backend.Ops.
func (b *Backend) Add(s backend.Stream, out, x, y backend.Tensor) error {
	n := out.Len()
	if err := b.needAll("add", f("out", out, n), f("a", x, n), f("b", y, n)); err != nil {
		return err
	}
	if err := b.kernelDTypes("Add", out, x, y); err != nil {
		return err
	}
	return b.enqueue(s, hazard.Add(out, x, y), func() error {
		o, p, q := load(out), load(x), load(y)
		b.parallel(n, 1<<14, func(lo, hi int) { Add(o[lo:hi], p[lo:hi], q[lo:hi]) })
		store(out, o)
		return nil
	})
}

// Accumulate implements backend.Ops.
func (b *Backend) Accumulate(s backend.Stream, dst, src backend.Tensor) error {
	n := dst.Len()
	if err := b.needAll("accumulate", f("dst", dst, n), f("src", src, n)); err != nil {
		return err
	}
	if err := b.kernelDTypes("Accumulate", dst, src); err != nil {
		return err
	}
	return b.enqueue(s, hazard.Accumulate(dst, src), func() error {
		d, x := load(dst), load(src)
		b.parallel(n, 1<<14, func(lo, hi int) { Accumulate(d[lo:hi], x[lo:hi]) })
		store(dst, d)
		return nil
	})
}

// EncoderForward implements backend.Ops.
func (b *Backend) EncoderForward(s backend.Stream, out, inp, pos, wte, wpe backend.Tensor, B, T, C int) error {
	if err := checkDims("encoder forward", "B T", B, T); err != nil {
		return err
	}
	if C <= 0 {
		return fmt.Errorf("cpu: encoder forward: C=%d, want > 0", C)
	}
	noPos := wpe.Buf == nil // LLaMA: no position table
	if len(wte.Shape) == 0 || wte.Len()%max(C, 1) != 0 || !noPos && wpe.Len() < T*C {
		return fmt.Errorf("cpu: encoder forward: wte %v / wpe %v do not fit C=%d T=%d", wte.Shape, wpe.Shape, C, T)
	}
	V := wte.Len() / C
	if err := b.needAll("encoder forward", f("out", out, B*T*C), arg{"inp", inp, B * T, true}, f("wte", wte, V*C)); err != nil {
		return err
	}
	if !noPos {
		if err := b.needAll("encoder forward", f("wpe", wpe, wpe.Len())); err != nil {
			return err
		}
	}
	if err := b.positions("encoder forward", pos, B, T); err != nil {
		return err
	}
	if err := b.kernelDTypes("EncoderForward", out, inp, pos, wte, wpe); err != nil {
		return err
	}
	return b.enqueue(s, hazard.EncoderForward(out, inp, pos, wte, wpe), func() error {
		o, p := load(out), []float32(nil)
		if !noPos {
			p = load(wpe)
		}
		if err := EncoderForward(o, i32View(inp), i32OrNil(pos), load(wte), p, B, T, C, V); err != nil {
			return err
		}
		store(out, o)
		return nil
	})
}

// EncoderBackward implements backend.Ops.
func (b *Backend) EncoderBackward(s backend.Stream, dwte, dwpe, dout, inp, pos backend.Tensor, B, T, C int) error {
	if err := checkDims("encoder backward", "B T", B, T); err != nil {
		return err
	}
	if C <= 0 {
		return fmt.Errorf("cpu: encoder backward: C=%d, want > 0", C)
	}
	V := dwte.Len() / max(C, 1)
	noPos := dwpe.Buf == nil // LLaMA: no position table
	if err := b.needAll("encoder backward", f("dwte", dwte, V*C), f("dout", dout, B*T*C), arg{"inp", inp, B * T, true}); err != nil {
		return err
	}
	if !noPos {
		if err := b.needAll("encoder backward", f("dwpe", dwpe, dwpe.Len())); err != nil {
			return err
		}
	}
	if err := b.positions("encoder backward", pos, B, T); err != nil {
		return err
	}
	if err := b.kernelDTypes("EncoderBackward", dwte, dwpe, dout, inp, pos); err != nil {
		return err
	}
	if !noPos && dwpe.Len() < T*C {
		return fmt.Errorf("cpu: encoder backward: dwpe has %d elements, want at least %d", dwpe.Len(), T*C)
	}
	return b.enqueue(s, hazard.EncoderBackward(dwte, dwpe, dout, inp, pos), func() error {
		gw, gp := load(dwte), []float32(nil)
		if !noPos {
			gp = load(dwpe)
		}
		dy, ids := load(dout), i32View(inp)
		if err := checkTokens(ids[:B*T], V); err != nil {
			return err
		}
		ps, err := posView("encoder backward", pos, B, T)
		if err != nil {
			return err
		}
		// Channels split over threads, each summing its positions in order.
		b.parallel(C, 32, func(lo, hi int) { encoderBackwardChannels(gw, gp, dy, ids, ps, B, T, C, lo, hi) })
		store(dwte, gw)
		if !noPos {
			store(dwpe, gp)
		}
		return nil
	})
}

// LayerNormForward implements backend.Ops.
func (b *Backend) LayerNormForward(s backend.Stream, out, mean, rstd, inp, weight, bias backend.Tensor, N, C int, eps float32) error {
	if err := checkDims("layernorm forward", "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll("layernorm forward", f("out", out, N*C), f("mean", mean, N), f("rstd", rstd, N),
		f("inp", inp, N*C), f("weight", weight, C), f("bias", bias, C)); err != nil {
		return err
	}
	if err := b.kernelDTypes("LayerNormForward", out, mean, rstd, inp, weight, bias); err != nil {
		return err
	}
	return b.enqueue(s, hazard.LayerNormForward(out, mean, rstd, inp, weight, bias), func() error {
		o, m, r := load(out), load(mean), load(rstd)
		x, w, bb := load(inp), load(weight), load(bias)
		b.parallel(N, 16, func(lo, hi int) {
			LayerNormForward(o[lo*C:hi*C], m[lo:hi], r[lo:hi], x[lo*C:hi*C], w, bb, hi-lo, C, eps)
		})
		store(out, o)
		store(mean, m)
		store(rstd, r)
		return nil
	})
}

// LayerNormBackward implements backend.Ops.
func (b *Backend) LayerNormBackward(s backend.Stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch backend.Tensor, N, C int) error {
	if err := checkDims("layernorm backward", "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll("layernorm backward", f("dinp", dinp, N*C), f("dweight", dweight, C), f("dbias", dbias, C),
		f("dout", dout, N*C), f("inp", inp, N*C), f("weight", weight, C), f("mean", mean, N), f("rstd", rstd, N)); err != nil {
		return err
	}
	used, err := b.scratch("layernorm backward", "scratch", "LayerNormBackwardScratch", scratch, backend.F32, backend.LayerNormBackwardScratch(N, C))
	if err != nil {
		return err
	}
	if err := b.kernelDTypes("LayerNormBackward", dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch); err != nil {
		return err
	}
	return b.enqueue(s, hazard.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C), func() error {
		spoil(used)
		dx, dw, db := load(dinp), load(dweight), load(dbias)
		dy, x, w, m, r := load(dout), load(inp), load(weight), load(mean), load(rstd)
		b.parallel(N, 16, func(lo, hi int) {
			layerNormBackwardInput(dx[lo*C:hi*C], dy[lo*C:hi*C], x[lo*C:hi*C], w, m[lo:hi], r[lo:hi], hi-lo, C)
		})
		b.parallel(C, 64, func(lo, hi int) { layerNormBackwardParams(dw, db, dy, x, m, r, N, C, lo, hi) })
		store(dinp, dx)
		store(dweight, dw)
		store(dbias, db)
		return nil
	})
}

// Gemm implements backend.Ops; the threads are host.Sgemm's own.
func (b *Backend) Gemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	if err := checkDims("gemm", "M N K", M, N, K); err != nil {
		return err
	}
	if err := b.needAll("gemm", f("A", A, M*K), f("B", B, K*N), f("C", C, M*N)); err != nil {
		return err
	}
	if err := b.kernelDTypes("Gemm", A, B, C); err != nil {
		return err
	}
	return b.enqueue(s, hazard.Gemm(A, B, beta, C), func() error {
		a, bb, c := load(A), load(B), load(C)
		if err := Gemm(transA, transB, M, N, K, alpha, a, bb, beta, c); err != nil {
			return err
		}
		store(C, c)
		return nil
	})
}

// AddBias implements backend.Ops.
func (b *Backend) AddBias(s backend.Stream, out, bias backend.Tensor, N, OC int) error {
	if err := checkDims("add bias", "N OC", N, OC); err != nil {
		return err
	}
	if err := b.needAll("add bias", f("out", out, N*OC), f("bias", bias, OC)); err != nil {
		return err
	}
	if err := b.kernelDTypes("AddBias", out, bias); err != nil {
		return err
	}
	return b.enqueue(s, hazard.AddBias(out, bias), func() error {
		o, bb := load(out), load(bias)
		b.parallel(N, 16, func(lo, hi int) { AddBias(o[lo*OC:hi*OC], bb, hi-lo, OC) })
		store(out, o)
		return nil
	})
}

// BiasBackward implements backend.Ops.
func (b *Backend) BiasBackward(s backend.Stream, dbias, dout backend.Tensor, N, OC int) error {
	if err := checkDims("bias backward", "N OC", N, OC); err != nil {
		return err
	}
	if err := b.needAll("bias backward", f("dbias", dbias, OC), f("dout", dout, N*OC)); err != nil {
		return err
	}
	if err := b.kernelDTypes("BiasBackward", dbias, dout); err != nil {
		return err
	}
	return b.enqueue(s, hazard.BiasBackward(dbias, dout), func() error {
		db, dy := load(dbias), load(dout)
		b.parallel(OC, 64, func(lo, hi int) { biasBackwardColumns(db, dy, N, OC, lo, hi) })
		store(dbias, db)
		return nil
	})
}

// AttentionForward implements backend.Ops.
func (b *Backend) AttentionForward(s backend.Stream, out, lse, qkv, pos backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	a, n, err := checkHeads("attention forward", B, T, NH, KVH, HS, layout)
	if err != nil {
		return err
	}
	if err := b.needAll("attention forward", f("out", out, B*T*NH*HS), f("lse", lse, B*NH*T), f("qkv", qkv, n)); err != nil {
		return err
	}
	if err := b.positions("attention forward", pos, B, T); err != nil {
		return err
	}
	if err := b.kernelDTypes("AttentionForward", out, lse, qkv, pos); err != nil {
		return err
	}
	return b.enqueue(s, hazard.AttentionForward(out, lse, qkv, pos), func() error {
		ps, perr := posView("attention forward", pos, B, T)
		if perr != nil {
			return perr
		}
		a := a // this op's shape with its positions
		a.pos = ps
		o, l, q := load(out), load(lse), load(qkv)
		err := b.parallelErr("attention forward", B*NH, 1, func(lo, hi int) error { return host.AttentionForward(o, l, q, a.host(), lo, hi) })
		store(out, o)
		store(lse, l)
		return err
	})
}

// AttentionBackward implements backend.Ops.
func (b *Backend) AttentionBackward(s backend.Stream, dqkv, dout, qkv, out, lse, pos, scratch backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	a, n, err := checkHeads("attention backward", B, T, NH, KVH, HS, layout)
	if err != nil {
		return err
	}
	if err := b.needAll("attention backward", f("dqkv", dqkv, n), f("dout", dout, B*T*NH*HS), f("qkv", qkv, n),
		f("out", out, B*T*NH*HS), f("lse", lse, B*NH*T)); err != nil {
		return err
	}
	used, err := b.scratch("attention backward", "scratch", "AttentionBackwardScratch", scratch, backend.F32, backend.AttentionBackwardScratch(B, T, NH))
	if err != nil {
		return err
	}
	if err := b.positions("attention backward", pos, B, T); err != nil {
		return err
	}
	if err := b.kernelDTypes("AttentionBackward", dqkv, dout, qkv, out, lse, pos, scratch); err != nil {
		return err
	}
	return b.enqueue(s, hazard.AttentionBackward(dqkv, dout, qkv, out, lse, pos, scratch, B, T, NH), func() error {
		spoil(used)
		ps, perr := posView("attention backward", pos, B, T)
		if perr != nil {
			return perr
		}
		a := a // this op's shape with its positions
		a.pos = ps
		dq, dy, q, o, l := load(dqkv), load(dout), load(qkv), load(out), load(lse)
		err := b.parallelErr("attention backward", B*KVH, 1, func(lo, hi int) error { return host.AttentionBackward(dq, dy, q, o, l, a.host(), lo, hi) })
		store(dqkv, dq)
		return err
	})
}

// GeluForward implements backend.Ops.
func (b *Backend) GeluForward(s backend.Stream, out, inp backend.Tensor) error {
	n := inp.Len()
	if err := b.needAll("gelu forward", f("out", out, n), f("inp", inp, n)); err != nil {
		return err
	}
	if err := b.kernelDTypes("GeluForward", out, inp); err != nil {
		return err
	}
	return b.enqueue(s, hazard.GeluForward(out, inp), func() error {
		o, x := load(out), load(inp)
		err := b.parallelErr("gelu forward", n, 1<<12, func(lo, hi int) error { return GeluForward(o[lo:hi], x[lo:hi]) })
		if err != nil {
			return err
		}
		store(out, o)
		return nil
	})
}

// GeluBackward implements backend.Ops.
func (b *Backend) GeluBackward(s backend.Stream, dinp, inp, dout backend.Tensor) error {
	n := inp.Len()
	if err := b.needAll("gelu backward", f("dinp", dinp, n), f("inp", inp, n), f("dout", dout, n)); err != nil {
		return err
	}
	if err := b.kernelDTypes("GeluBackward", dinp, inp, dout); err != nil {
		return err
	}
	return b.enqueue(s, hazard.GeluBackward(dinp, inp, dout), func() error {
		dx, x, dy := load(dinp), load(inp), load(dout)
		err := b.parallelErr("gelu backward", n, 1<<12, func(lo, hi int) error {
			return GeluBackward(dx[lo:hi], x[lo:hi], dy[lo:hi])
		})
		if err != nil {
			return err
		}
		store(dinp, dx)
		return nil
	})
}

// SwiGLUForward implements backend.Ops.
func (b *Backend) SwiGLUForward(s backend.Stream, out, gate, up backend.Tensor) error {
	n := gate.Len()
	if err := b.needAll("swiglu forward", f("out", out, n), f("gate", gate, n), f("up", up, n)); err != nil {
		return err
	}
	if err := b.kernelDTypes("SwiGLUForward", out, gate, up); err != nil {
		return err
	}
	return b.enqueue(s, hazard.SwiGLUForward(out, gate, up), func() error {
		o, g, u := load(out), load(gate), load(up)
		b.parallel(n, 4096, func(lo, hi int) { SwiGLUForward(o[lo:hi], g[lo:hi], u[lo:hi]) })
		store(out, o)
		return nil
	})
}

// SwiGLUBackward implements backend.Ops.
func (b *Backend) SwiGLUBackward(s backend.Stream, dgate, dup, dout, gate, up backend.Tensor) error {
	n := gate.Len()
	if err := b.needAll("swiglu backward", f("dgate", dgate, n), f("dup", dup, n), f("dout", dout, n), f("gate", gate, n), f("up", up, n)); err != nil {
		return err
	}
	if err := b.kernelDTypes("SwiGLUBackward", dgate, dup, dout, gate, up); err != nil {
		return err
	}
	return b.enqueue(s, hazard.SwiGLUBackward(dgate, dup, dout, gate, up), func() error {
		// dgate or dup may alias dout: dout is loaded before either is
		// stored, and a bf16 alias is a separate widened copy.
		dg, du, dy, g, u := load(dgate), load(dup), load(dout), load(gate), load(up)
		b.parallel(n, 4096, func(lo, hi int) { SwiGLUBackward(dg[lo:hi], du[lo:hi], dy[lo:hi], g[lo:hi], u[lo:hi]) })
		store(dgate, dg)
		store(dup, du)
		return nil
	})
}

// RMSNormForward implements backend.Ops.
func (b *Backend) RMSNormForward(s backend.Stream, out, rstd, inp, weight backend.Tensor, N, C int, eps float32) error {
	if err := checkDims("rmsnorm forward", "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll("rmsnorm forward", f("out", out, N*C), f("rstd", rstd, N), f("inp", inp, N*C), f("weight", weight, C)); err != nil {
		return err
	}
	if err := b.kernelDTypes("RMSNormForward", out, rstd, inp, weight); err != nil {
		return err
	}
	return b.enqueue(s, hazard.RMSNormForward(out, rstd, inp, weight), func() error {
		o, r, x, w := load(out), load(rstd), load(inp), load(weight)
		b.parallel(N, 16, func(lo, hi int) {
			RMSNormForward(o[lo*C:hi*C], r[lo:hi], x[lo*C:hi*C], w, hi-lo, C, eps)
		})
		store(out, o)
		store(rstd, r)
		return nil
	})
}

// RMSNormBackward implements backend.Ops.
func (b *Backend) RMSNormBackward(s backend.Stream, dinp, dweight, dout, inp, weight, rstd, scratch backend.Tensor, N, C int) error {
	if err := checkDims("rmsnorm backward", "N C", N, C); err != nil {
		return err
	}
	if err := b.needAll("rmsnorm backward", f("dinp", dinp, N*C), f("dweight", dweight, C), f("dout", dout, N*C),
		f("inp", inp, N*C), f("weight", weight, C), f("rstd", rstd, N)); err != nil {
		return err
	}
	used, err := b.scratch("rmsnorm backward", "scratch", "RMSNormBackwardScratch", scratch, backend.F32, backend.RMSNormBackwardScratch(N, C))
	if err != nil {
		return err
	}
	if err := b.kernelDTypes("RMSNormBackward", dinp, dweight, dout, inp, weight, rstd, scratch); err != nil {
		return err
	}
	return b.enqueue(s, hazard.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, scratch, N, C), func() error {
		spoil(used)
		dx, dw := load(dinp), load(dweight)
		dy, x, w, r := load(dout), load(inp), load(weight), load(rstd)
		b.parallel(N, 16, func(lo, hi int) {
			rmsNormBackwardInput(dx[lo*C:hi*C], dy[lo*C:hi*C], x[lo*C:hi*C], w, r[lo:hi], hi-lo, C)
		})
		b.parallel(C, 64, func(lo, hi int) { rmsNormBackwardWeight(dw, dy, x, r, N, C, lo, hi) })
		store(dinp, dx)
		store(dweight, dw)
		return nil
	})
}

// rope checks a RoPE op's arguments and enqueues it: out (or dinp) gets
// inp (or dout) rotated by sign * angle.
func (b *Backend) rope(op string, s backend.Stream, out, inp, pos, invFreq backend.Tensor, B, T, NH, HS int, sign float32) error {
	if err := checkDims(op, "B T NH HS", B, T, NH, HS); err != nil {
		return err
	}
	if HS%2 != 0 {
		return fmt.Errorf("cpu: %s: head size HS=%d is odd", op, HS)
	}
	n := B * T * NH * HS
	names := [2]string{"out", "inp"}
	if sign < 0 {
		names = [2]string{"dinp", "dout"}
	}
	if err := b.needAll(op, f(names[0], out, n), f(names[1], inp, n), f("invFreq", invFreq, HS/2)); err != nil {
		return err
	}
	if err := b.positions(op, pos, B, T); err != nil {
		return err
	}
	kop := "RoPEForward"
	if sign < 0 {
		kop = "RoPEBackward"
	}
	if err := b.kernelDTypes(kop, out, inp, pos, invFreq); err != nil {
		return err
	}
	return b.enqueue(s, hazard.RoPE(op, out, inp, pos, invFreq), func() error {
		ps, err := posView(op, pos, B, T)
		if err != nil {
			return err
		}
		// In place (out == inp): at fp32 x and o are the same memory and
		// each pair is read before it is written; at bf16 they are two
		// widened copies, and o is rounded back once.
		x, o, inv := load(inp), load(out), load(invFreq)
		b.parallel(B*T, 16, func(lo, hi int) { ropeRows(o, x, ps, inv, lo, hi, T, NH, HS, sign) })
		store(out, o)
		return nil
	})
}

// RoPEForward implements backend.Ops.
func (b *Backend) RoPEForward(s backend.Stream, out, inp, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	return b.rope("rope forward", s, out, inp, pos, invFreq, B, T, NH, HS, 1)
}

// RoPEBackward implements backend.Ops.
func (b *Backend) RoPEBackward(s backend.Stream, dinp, dout, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	return b.rope("rope backward", s, dinp, dout, pos, invFreq, B, T, NH, HS, -1)
}

// CrossEntropyForwardBackward implements backend.Ops.
func (b *Backend) CrossEntropyForwardBackward(s backend.Stream, losses, logits, targets backend.Tensor, N, V int, scale float32) error {
	if err := checkDims("cross entropy", "N V", N, V); err != nil {
		return err
	}
	if err := b.needAll("cross entropy", f("losses", losses, N), f("logits", logits, N*V), arg{"targets", targets, N, true}); err != nil {
		return err
	}
	if err := b.kernelDTypes("CrossEntropyForwardBackward", losses, logits, targets); err != nil {
		return err
	}
	return b.enqueue(s, hazard.CrossEntropyForwardBackward(losses, logits, targets, scale), func() error {
		l, z, tg := load(losses), load(logits), i32View(targets)
		if err := checkTargets(tg[:N], V); err != nil {
			return err
		}
		err := b.parallelErr("cross entropy", N, 4, func(lo, hi int) error {
			return host.CrossEntropy(l[:N], z[:N*V], tg[:N], V, scale, lo, hi)
		})
		if err != nil {
			return err
		}
		store(losses, l)
		if scale != 0 {
			store(logits, z)
		}
		return nil
	})
}

// SumSquares implements backend.Ops.
func (b *Backend) SumSquares(s backend.Stream, out, x, work backend.Tensor) error {
	if err := b.needAll("sum squares", f("out", out, 1), f("x", x, x.Len())); err != nil {
		return err
	}
	used, err := b.scratch("sum squares", "work", "SumSquaresWork", work, backend.F64, backend.SumSquaresWork)
	if err != nil {
		return err
	}
	if err := b.kernelDTypes("SumSquares", out, x, work); err != nil {
		return err
	}
	return b.enqueue(s, hazard.SumSquares(out, x, work), func() error {
		spoil(used)
		o := load(out)
		o[0] = float32(sumSquares(load(x), b.parallel))
		store(out, o)
		return nil
	})
}

// NonFiniteFlag implements backend.Ops.
func (b *Backend) NonFiniteFlag(s backend.Stream, flag, x backend.Tensor) error {
	const op = "non-finite flag"
	if err := b.needAll(op, f("flag", flag, 1), f("x", x, x.Len())); err != nil {
		return err
	}
	if err := needF32(op, f("flag", flag, 1), f("x", x, x.Len())); err != nil {
		return err
	}
	return b.enqueue(s, hazard.NonFiniteFlag(flag, x), func() error {
		NonFiniteFlag(f32View(flag), f32View(x))
		return nil
	})
}

// needSkip checks an update op's optional skip flag: none (nil Buf) or an
// F32 [1].
func (b *Backend) needSkip(op string, skip backend.Tensor) error {
	if skip.Buf == nil {
		return nil
	}
	if err := b.need(op, "skip", skip, 1, false); err != nil {
		return err
	}
	return needF32(op, f("skip", skip, 1))
}

// skipped reads an update op's skip flag on the stream: set means the op
// writes nothing.
func skipped(skip backend.Tensor) bool { return skip.Buf != nil && f32View(skip)[0] != 0 }

// AdamW implements backend.Ops.
func (b *Backend) AdamW(s backend.Stream, param, master, grad, m, v, sumSq, skip backend.Tensor, p backend.AdamParams) error {
	n := param.Len()
	args := []arg{f("param", param, n), f("grad", grad, n), f("m", m, n), f("v", v, n)}
	if master.Buf != nil {
		args = append(args, f("master", master, n))
	}
	if p.MaxNorm > 0 {
		args = append(args, f("sumSq", sumSq, 1))
	}
	if err := b.needAll("adamw", args...); err != nil {
		return err
	}
	if err := b.needSkip("adamw", skip); err != nil {
		return err
	}
	if m.DType != backend.F32 || v.DType != backend.F32 || (master.Buf != nil && master.DType != backend.F32) {
		return fmt.Errorf("cpu: adamw: moments and master must be fp32")
	}
	if p.Step < 1 {
		return fmt.Errorf("cpu: adamw: step %d, want >= 1", p.Step)
	}
	return b.enqueue(s, hazard.AdamW(param, master, grad, m, v, sumSq, skip, p.MaxNorm), func() error {
		if skipped(skip) {
			return nil
		}
		w, out16 := load(param), []uint16(nil)
		if master.Buf != nil {
			w = f32View(master)
		}
		if param.DType == backend.BF16 {
			// bf16(w), rounded to nearest even, in the update's pass: the
			// master's copy, or the param's own widened values rounded back.
			out16 = u16View(param)
		}
		var g host.AdamGrad
		if grad.DType == backend.BF16 {
			g.BF16 = u16View(grad)
		} else {
			g.F32 = f32View(grad)
		}
		mm, vv := f32View(m), f32View(v)
		var sq float32 // read only when clipping, as the kernel does
		if p.MaxNorm > 0 {
			sq = load(sumSq)[0]
		}
		copyParam := master.Buf != nil && param.DType == backend.F32
		var mu sync.Mutex
		var err error
		// Elements split over threads: each is updated on its own.
		b.parallel(n, 1<<16, func(lo, hi int) {
			gg := host.AdamGrad{F32: sub(g.F32, lo, hi), BF16: sub(g.BF16, lo, hi)}
			if e := AdamW(w[lo:hi], sub(out16, lo, hi), gg, mm[lo:hi], vv[lo:hi], sq, p); e != nil {
				mu.Lock()
				err = e
				mu.Unlock()
				return
			}
			if copyParam {
				copy(f32View(param)[lo:hi], w[lo:hi])
			}
		})
		return err
	})
}

// sub is x[lo:hi], or nil for a nil x (an unused view).
func sub[T any](x []T, lo, hi int) []T {
	if x == nil {
		return nil
	}
	return x[lo:hi]
}

// CopyD2D implements backend.Backend: same length, converting dtypes (I32
// only to I32).
func (b *Backend) CopyD2D(s backend.Stream, dst, src backend.Tensor) error {
	ints := src.DType == backend.I32
	if err := b.needAll("copy d2d", arg{"dst", dst, src.Len(), ints}, arg{"src", src, src.Len(), ints}); err != nil {
		return err
	}
	return b.enqueue(s, hazard.CopyD2D(dst, src), func() error {
		if ints || src.DType == dst.DType {
			copy(bytesOf(dst), bytesOf(src))
			return nil
		}
		// Through a copy of src, read whole before dst is written.
		if dst.DType == backend.BF16 {
			CastF32ToBF16(u16View(dst), slices.Clone(f32View(src)))
			return nil
		}
		w := make([]float32, src.Len())
		CastBF16ToF32(w, u16View(src))
		copy(f32View(dst), w)
		return nil
	})
}

// quantArgs checks W's tensors as this backend's (backend.Quant.Check).
func (b *Backend) quantArgs(op string, W backend.Quant) error {
	if err := W.Check(); err != nil {
		return fmt.Errorf("cpu: %s: %w", op, err)
	}
	for _, t := range []backend.Tensor{W.Codes, W.Absmax, W.Scale, W.Book} {
		if err := b.checkTensor(op+" W", t); err != nil {
			return err
		}
	}
	return nil
}

// GemmQ implements backend.Ops: W dequantized whole (ref_quant.go), then
// the Gemm reference.
func (b *Backend) GemmQ(s backend.Stream, transW bool, M, N, K int, alpha float32, A backend.Tensor, W backend.Quant, beta float32, C backend.Tensor) error {
	if err := checkDims("gemm q", "M N K", M, N, K); err != nil {
		return err
	}
	if err := b.quantArgs("gemm q", W); err != nil {
		return err
	}
	if rows, cols := qShape(transW, N, K); W.Rows != rows || W.Cols != cols {
		return fmt.Errorf("cpu: gemm q: W is %d x %d, want %d x %d (transW %v, N %d, K %d)", W.Rows, W.Cols, rows, cols, transW, N, K)
	}
	if err := b.needAll("gemm q", f("A", A, M*K), f("C", C, M*N)); err != nil {
		return err
	}
	if err := b.kernelDTypes("GemmQ", A, C); err != nil {
		return err
	}
	return b.enqueue(s, hazard.GemmQ(A, W, beta, C), func() error {
		w := dequantize(W, 0, W.Len(), A.DType)
		a, c := load(A), load(C)
		if err := Gemm(false, transW, M, N, K, alpha, a, w, beta, c); err != nil {
			return err
		}
		store(C, c)
		return nil
	})
}

// qShape is the stored shape of GemmQ's W: K x N, or N x K with transW.
func qShape(transW bool, N, K int) (rows, cols int) {
	if transW {
		return N, K
	}
	return K, N
}

// Dequantize implements backend.Ops.
func (b *Backend) Dequantize(s backend.Stream, W backend.Quant, off int, out backend.Tensor) error {
	if err := b.quantArgs("dequantize", W); err != nil {
		return err
	}
	if err := b.checkTensor("dequantize out", out); err != nil {
		return err
	}
	if off < 0 || off+out.Len() > W.Len() {
		return fmt.Errorf("cpu: dequantize: elements [%d, %d) of a %d x %d matrix", off, off+out.Len(), W.Rows, W.Cols)
	}
	if err := b.needAll("dequantize", f("out", out, out.Len())); err != nil {
		return err
	}
	if err := b.kernelDTypes("Dequantize", out); err != nil {
		return err
	}
	return b.enqueue(s, hazard.Dequantize(W, out), func() error {
		o := load(out)
		copy(o, dequantize(W, off, out.Len(), backend.F32))
		store(out, o)
		return nil
	})
}
