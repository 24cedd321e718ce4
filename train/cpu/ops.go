// The compute ops of the CPU backend: each method hands its call to op
// (stream.go: the op table's checks, the same as the CUDA backend's, and
// its declared accesses) with the dtype conversions at load and store
// around the references of ref_<family>.go (one file per
// kernels/<family>.cu). bf16 tensors are widened to fp32 at load and
// rounded to nearest even at store, as the CUDA kernels do.

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

func f32View(t backend.Tensor) []float32 { return backend.Float32View(bytesOf(t)) }
func u16View(t backend.Tensor) []uint16  { return backend.BF16View(bytesOf(t)) }
func i32View(t backend.Tensor) []int32   { return backend.Int32View(bytesOf(t)) }

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

// bufferState is what the view checks (b.views) need to know of t's
// buffer, or ok false when it is not a CPU buffer: a tensor that is not a
// live view of this backend would index out of range, or touch memory
// that is no longer (or never was) this backend's, on the stream.
func (b *Backend) bufferState(t backend.Tensor) (st backend.BufferState, ok bool) {
	u, ok := t.Buf.(*buffer)
	if !ok || u == nil {
		return st, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.BufferState{Bytes: int64(len(u.data)), Foreign: u.owner != b, Live: b.live[u.id] == u, Closed: b.closed}, true
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

// scratchUsed is the part of a scratch tensor an op overwrites: its first
// n elements (none when n is 0).
func scratchUsed(t backend.Tensor, n int) backend.Tensor {
	if n == 0 || t.Buf == nil {
		return backend.Tensor{}
	}
	return t.Slice(0, n)
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
	return b.op(s, backend.Calls.Fill(t, v), func() error {
		x := load(t)
		Fill(x, v)
		store(t, x)
		return nil
	})
}

// Scale implements backend.Ops.
func (b *Backend) Scale(s backend.Stream, t backend.Tensor, a float32) error {
	return b.op(s, backend.Calls.Scale(t, a), func() error {
		x := load(t)
		Scale(x, a)
		store(t, x)
		return nil
	})
}

// Add implements backend.Ops.
func (b *Backend) Add(s backend.Stream, out, x, y backend.Tensor) error {
	n := out.Len()
	return b.op(s, backend.Calls.Add(out, x, y), func() error {
		o, p, q := load(out), load(x), load(y)
		b.parallel(n, 1<<14, func(lo, hi int) { Add(o[lo:hi], p[lo:hi], q[lo:hi]) })
		store(out, o)
		return nil
	})
}

// Accumulate implements backend.Ops.
func (b *Backend) Accumulate(s backend.Stream, dst, src backend.Tensor) error {
	n := dst.Len()
	return b.op(s, backend.Calls.Accumulate(dst, src), func() error {
		d, x := load(dst), load(src)
		b.parallel(n, 1<<14, func(lo, hi int) { Accumulate(d[lo:hi], x[lo:hi]) })
		store(dst, d)
		return nil
	})
}

// EncoderForward implements backend.Ops.
func (b *Backend) EncoderForward(s backend.Stream, out, inp, pos, wte, wpe backend.Tensor, B, T, C int) error {
	return b.op(s, backend.Calls.EncoderForward(out, inp, pos, wte, wpe, B, T, C), func() error {
		V, noPos := wte.Len()/C, wpe.Buf == nil // C > 0: checked at enqueue
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
	return b.op(s, backend.Calls.EncoderBackward(dwte, dwpe, dout, inp, pos, B, T, C), func() error {
		V, noPos := dwte.Len()/C, dwpe.Buf == nil // C > 0: checked at enqueue
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
	return b.op(s, backend.Calls.LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps), func() error {
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
	return b.op(s, backend.Calls.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C), func() error {
		spoil(scratchUsed(scratch, backend.LayerNormBackwardScratch(N, C)))
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
	return b.op(s, backend.Calls.Gemm(transA, transB, M, N, K, alpha, A, B, beta, C), func() error {
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
	return b.op(s, backend.Calls.AddBias(out, bias, N, OC), func() error {
		o, bb := load(out), load(bias)
		b.parallel(N, 16, func(lo, hi int) { AddBias(o[lo*OC:hi*OC], bb, hi-lo, OC) })
		store(out, o)
		return nil
	})
}

// BiasBackward implements backend.Ops.
func (b *Backend) BiasBackward(s backend.Stream, dbias, dout backend.Tensor, N, OC int) error {
	return b.op(s, backend.Calls.BiasBackward(dbias, dout, N, OC), func() error {
		db, dy := load(dbias), load(dout)
		b.parallel(OC, 64, func(lo, hi int) { biasBackwardColumns(db, dy, N, OC, lo, hi) })
		store(dbias, db)
		return nil
	})
}

// AttentionForward implements backend.Ops.
func (b *Backend) AttentionForward(s backend.Stream, out, lse, qkv, pos backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	return b.op(s, backend.Calls.AttentionForward(out, lse, qkv, pos, B, T, NH, KVH, HS, layout), func() error {
		ps, perr := posView("attention forward", pos, B, T)
		if perr != nil {
			return perr
		}
		a, _, aerr := checkHeads("attention forward", B, T, NH, KVH, HS, layout) // its shape (checked at enqueue)
		if aerr != nil {
			return aerr
		}
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
	return b.op(s, backend.Calls.AttentionBackward(dqkv, dout, qkv, out, lse, pos, scratch, B, T, NH, KVH, HS, layout), func() error {
		spoil(scratchUsed(scratch, backend.AttentionBackwardScratch(B, T, NH)))
		ps, perr := posView("attention backward", pos, B, T)
		if perr != nil {
			return perr
		}
		a, _, aerr := checkHeads("attention backward", B, T, NH, KVH, HS, layout) // its shape (checked at enqueue)
		if aerr != nil {
			return aerr
		}
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
	return b.op(s, backend.Calls.GeluForward(out, inp), func() error {
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
	return b.op(s, backend.Calls.GeluBackward(dinp, inp, dout), func() error {
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
	return b.op(s, backend.Calls.SwiGLUForward(out, gate, up), func() error {
		o, g, u := load(out), load(gate), load(up)
		b.parallel(n, 4096, func(lo, hi int) { SwiGLUForward(o[lo:hi], g[lo:hi], u[lo:hi]) })
		store(out, o)
		return nil
	})
}

// SwiGLUBackward implements backend.Ops.
func (b *Backend) SwiGLUBackward(s backend.Stream, dgate, dup, dout, gate, up backend.Tensor) error {
	n := gate.Len()
	return b.op(s, backend.Calls.SwiGLUBackward(dgate, dup, dout, gate, up), func() error {
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
	return b.op(s, backend.Calls.RMSNormForward(out, rstd, inp, weight, N, C, eps), func() error {
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
	return b.op(s, backend.Calls.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, scratch, N, C), func() error {
		spoil(scratchUsed(scratch, backend.RMSNormBackwardScratch(N, C)))
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

// rope enqueues a RoPE op: out (or dinp) gets inp (or dout) rotated by
// sign * angle.
func (b *Backend) rope(op string, s backend.Stream, out, inp, pos, invFreq backend.Tensor, B, T, NH, HS int, sign float32) error {
	call := backend.Calls.RoPEForward(out, inp, pos, invFreq, B, T, NH, HS)
	if sign < 0 {
		call = backend.Calls.RoPEBackward(out, inp, pos, invFreq, B, T, NH, HS)
	}
	return b.op(s, call, func() error {
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
	return b.op(s, backend.Calls.CrossEntropyForwardBackward(losses, logits, targets, N, V, scale), func() error {
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
	return b.op(s, backend.Calls.SumSquares(out, x, work), func() error {
		spoil(scratchUsed(work, backend.SumSquaresWork))
		o := load(out)
		o[0] = float32(sumSquares(load(x), b.parallel))
		store(out, o)
		return nil
	})
}

// NonFiniteFlag implements backend.Ops.
func (b *Backend) NonFiniteFlag(s backend.Stream, flag, x backend.Tensor) error {
	const op = "non-finite flag"
	return b.op(s, backend.Calls.NonFiniteFlag(flag, x), func() error {
		NonFiniteFlag(f32View(flag), f32View(x))
		return nil
	})
}

// skipped reads an update op's skip flag on the stream: set means the op
// writes nothing.
func skipped(skip backend.Tensor) bool { return skip.Buf != nil && f32View(skip)[0] != 0 }

// AdamW implements backend.Ops.
func (b *Backend) AdamW(s backend.Stream, param, master, grad, m, v, sumSq, skip backend.Tensor, p backend.AdamParams) error {
	n := param.Len()
	return b.op(s, backend.Calls.AdamW(param, master, grad, m, v, sumSq, skip, p), func() error {
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
	if err := b.views.Copy("copy d2d", dst, src); err != nil {
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

// GemmQ implements backend.Ops: W dequantized whole (ref_quant.go), then
// the Gemm reference.
func (b *Backend) GemmQ(s backend.Stream, transW bool, M, N, K int, alpha float32, A backend.Tensor, W backend.Quant, beta float32, C backend.Tensor) error {
	return b.op(s, backend.Calls.GemmQ(transW, M, N, K, alpha, A, W, beta, C), func() error {
		w := dequantize(W, 0, W.Len(), A.DType)
		a, c := load(A), load(C)
		if err := Gemm(false, transW, M, N, K, alpha, a, w, beta, c); err != nil {
			return err
		}
		store(C, c)
		return nil
	})
}

// Dequantize implements backend.Ops.
func (b *Backend) Dequantize(s backend.Stream, W backend.Quant, off int, out backend.Tensor) error {
	return b.op(s, backend.Calls.Dequantize(W, off, out), func() error {
		o := load(out)
		copy(o, dequantize(W, off, out.Len(), backend.F32))
		store(out, o)
		return nil
	})
}
