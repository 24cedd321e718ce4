// The recorded ops: each validates its arguments, records one Op with its
// FLOPs and bytes (see the package doc for how they are counted) and, when
// wrapping, forwards to the inner backend.

package trace

import (
	"errors"
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// do checks args, forwards (when wrapping) and records op on success, so
// that a wrapped backend's list holds exactly the ops it ran.
func (b *Backend) do(s backend.Stream, op Op, args []arg, fwd func() error) error {
	if err := b.check(s, op.Method, args...); err != nil {
		return err
	}
	for _, v := range op.Shapes {
		for _, d := range v {
			if d < 0 {
				return fmt.Errorf("trace: %s: negative dimension in %v", op.Method, v)
			}
		}
	}
	var ev [2]backend.Event
	if b.inner != nil {
		if b.timed {
			var err error
			if ev[0], err = b.mark(s); err != nil {
				return err
			}
		}
		if err := fwd(); err != nil {
			return err
		}
		if b.timed {
			var err error
			if ev[1], err = b.mark(s); err != nil {
				return err
			}
		}
	}
	i := b.record(s, op)
	if ev[1] != nil {
		b.mu.Lock()
		b.pending = append(b.pending, timing{i, ev})
		b.mu.Unlock()
	}
	return nil
}

// timing is an op's pair of events, resolved by Times.
type timing struct {
	op int // its index counting the ops Reset dropped
	ev [2]backend.Event
}

// mark records a new event on s.
func (b *Backend) mark(s backend.Stream) (backend.Event, error) {
	e, err := b.inner.NewEvent("trace timing")
	if err != nil {
		return nil, fmt.Errorf("trace: timing: %w", err)
	}
	if err := b.inner.Record(e, s); err != nil {
		_ = b.inner.DestroyEvent(e) // the record's error is the one to report
		return nil, fmt.Errorf("trace: timing: %w", err)
	}
	return e, nil
}

// Times waits for the ops recorded so far by WrapTimed to run, sets each
// one's Seconds from its events and returns them (Recorded with times).
func (b *Backend) Times() ([]Op, error) {
	b.mu.Lock()
	pending := b.pending
	b.pending = nil
	b.mu.Unlock()
	var errs []error
	for _, p := range pending {
		if err := b.inner.EventSynchronize(p.ev[1]); err != nil {
			errs = append(errs, err)
			continue
		}
		d, err := b.inner.ElapsedTime(p.ev[0], p.ev[1])
		if err != nil {
			errs = append(errs, err)
		} else {
			b.mu.Lock()
			if i := p.op - b.dropped; i >= 0 && i < len(b.ops) { // not Reset since
				b.ops[i].Seconds = d.Seconds()
			}
			b.mu.Unlock()
		}
		errs = append(errs, b.inner.DestroyEvent(p.ev[0]), b.inner.DestroyEvent(p.ev[1]))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("trace: timing: %w", err)
	}
	return b.Recorded(), nil
}

func dims(op string, vals ...int) error {
	for _, v := range vals {
		if v < 0 {
			return fmt.Errorf("trace: %s: negative dimension %d", op, v)
		}
	}
	return nil
}

// hostLen is the size of a host buffer without giving a traced one memory.
func hostLen(h backend.HostBuffer) int {
	if x, ok := h.(*hostBuffer); ok {
		return x.bytes
	}
	return len(h.Bytes())
}

// Fill implements backend.Ops.
func (b *Backend) Fill(s backend.Stream, t backend.Tensor, v float32) error {
	op := Op{Method: "Fill", Family: Elementwise, DType: t.DType, Shapes: shapes(t), Bytes: hazard.Fill(t).Bytes()}
	return b.do(s, op, []arg{need("t", t, -1)}, func() error { return b.inner.Fill(s, t, v) })
}

// Scale implements backend.Ops.
func (b *Backend) Scale(s backend.Stream, t backend.Tensor, a float32) error {
	op := Op{Method: "Scale", Family: Elementwise, DType: t.DType, Shapes: shapes(t), FLOPs: float64(t.Len()), Bytes: hazard.Scale(t).Bytes()}
	return b.do(s, op, []arg{need("t", t, -1)}, func() error { return b.inner.Scale(s, t, a) })
}

// Add implements backend.Ops.
func (b *Backend) Add(s backend.Stream, out, a, c backend.Tensor) error {
	op := Op{Method: "Add", Family: Elementwise, DType: out.DType, Shapes: shapes(out, a, c), FLOPs: float64(out.Len()), Bytes: hazard.Add(out, a, c).Bytes()}
	n := out.Len()
	return b.do(s, op, []arg{need("out", out, -1), need("a", a, n), need("b", c, n)}, func() error { return b.inner.Add(s, out, a, c) })
}

// Accumulate implements backend.Ops.
func (b *Backend) Accumulate(s backend.Stream, dst, src backend.Tensor) error {
	op := Op{Method: "Accumulate", Family: Elementwise, DType: dst.DType, Shapes: shapes(dst, src), FLOPs: float64(dst.Len()), Bytes: hazard.Accumulate(dst, src).Bytes()}
	return b.do(s, op, []arg{need("dst", dst, -1), need("src", src, dst.Len())}, func() error { return b.inner.Accumulate(s, dst, src) })
}

// EncoderForward implements backend.Ops.
func (b *Backend) EncoderForward(s backend.Stream, out, inp, pos, wte, wpe backend.Tensor, B, T, C int) error {
	if err := dims("EncoderForward", B, T, C); err != nil {
		return err
	}
	BTC := B * T * C
	op := Op{Method: "EncoderForward", Family: Embedding, DType: wte.DType, Shapes: shapes(out, inp, pos, wte, wpe),
		FLOPs: float64(BTC), Bytes: hazard.EncoderForward(out, inp, pos, wte, wpe).Bytes()}
	args := []arg{need("out", out, BTC), need("inp", inp, B*T), maybe("pos", pos, B*T), need("wte", wte, C), maybe("wpe", wpe, T*C)}
	return b.do(s, op, args, func() error { return b.inner.EncoderForward(s, out, inp, pos, wte, wpe, B, T, C) })
}

// EncoderBackward implements backend.Ops.
func (b *Backend) EncoderBackward(s backend.Stream, dwte, dwpe, dout, inp, pos backend.Tensor, B, T, C int) error {
	if err := dims("EncoderBackward", B, T, C); err != nil {
		return err
	}
	BTC := B * T * C
	op := Op{Method: "EncoderBackward", Family: Embedding, DType: dout.DType, Shapes: shapes(dwte, dwpe, dout, inp, pos),
		FLOPs: 2 * float64(BTC), Bytes: hazard.EncoderBackward(dwte, dwpe, dout, inp, pos).Bytes()}
	args := []arg{need("dwte", dwte, C), maybe("dwpe", dwpe, T*C), need("dout", dout, BTC), need("inp", inp, B*T), maybe("pos", pos, B*T)}
	return b.do(s, op, args, func() error { return b.inner.EncoderBackward(s, dwte, dwpe, dout, inp, pos, B, T, C) })
}

// LayerNormForward implements backend.Ops.
func (b *Backend) LayerNormForward(s backend.Stream, out, mean, rstd, inp, weight, bias backend.Tensor, N, C int, eps float32) error {
	if err := dims("LayerNormForward", N, C); err != nil {
		return err
	}
	op := Op{Method: "LayerNormForward", Family: Norm, DType: inp.DType, Shapes: shapes(out, mean, rstd, inp, weight, bias),
		FLOPs: 8 * float64(N*C), Bytes: hazard.LayerNormForward(out, mean, rstd, inp, weight, bias).Bytes()}
	args := []arg{need("out", out, N*C), need("mean", mean, N), need("rstd", rstd, N), need("inp", inp, N*C),
		need("weight", weight, C), need("bias", bias, C)}
	return b.do(s, op, args, func() error { return b.inner.LayerNormForward(s, out, mean, rstd, inp, weight, bias, N, C, eps) })
}

// LayerNormBackward implements backend.Ops.
func (b *Backend) LayerNormBackward(s backend.Stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch backend.Tensor, N, C int) error {
	if err := dims("LayerNormBackward", N, C); err != nil {
		return err
	}
	op := Op{Method: "LayerNormBackward", Family: Norm, DType: inp.DType, Shapes: shapes(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch),
		FLOPs: 14 * float64(N*C), Bytes: hazard.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C).Bytes()}
	args := []arg{need("dinp", dinp, N*C), need("dweight", dweight, C), need("dbias", dbias, C), need("dout", dout, N*C),
		need("inp", inp, N*C), need("weight", weight, C), need("mean", mean, N), need("rstd", rstd, N),
		need("scratch", scratch, backend.LayerNormBackwardScratch(N, C))}
	return b.do(s, op, args, func() error {
		return b.inner.LayerNormBackward(s, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C)
	})
}

// Gemm implements backend.Ops.
func (b *Backend) Gemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	if err := dims("Gemm", M, N, K); err != nil {
		return err
	}
	op := Op{Method: "Gemm", Family: Gemm, DType: A.DType, Shapes: shapes(A, B, C), Gemm: GemmArgs{transA, transB, M, N, K},
		FLOPs: 2 * float64(M) * float64(N) * float64(K), Bytes: hazard.Gemm(A, B, beta, C).Bytes()}
	args := []arg{need("A", A, M*K), need("B", B, K*N), need("C", C, M*N)}
	return b.do(s, op, args, func() error { return b.inner.Gemm(s, transA, transB, M, N, K, alpha, A, B, beta, C) })
}

// GemmQ implements backend.Ops: a Gemm whose B is read quantized (its
// bytes W's codes and scales, not bf16 values), with the dequantization's
// multiply per element of W per row block counted with the GEMM.
func (b *Backend) GemmQ(s backend.Stream, transW bool, M, N, K int, alpha float32, A backend.Tensor, W backend.Quant, beta float32, C backend.Tensor) error {
	if err := dims("GemmQ", M, N, K); err != nil {
		return err
	}
	if err := W.Check(); err != nil {
		return fmt.Errorf("trace: GemmQ: %w", err)
	}
	op := Op{Method: "GemmQ", Family: Gemm, DType: A.DType, Shapes: shapes(A, W.Codes, C), Gemm: GemmArgs{false, transW, M, N, K},
		FLOPs: 2 * float64(M) * float64(N) * float64(K), Bytes: hazard.GemmQ(A, W, beta, C).Bytes()}
	args := []arg{need("A", A, M*K), need("C", C, M*N)}
	return b.do(s, op, args, func() error { return b.inner.GemmQ(s, transW, M, N, K, alpha, A, W, beta, C) })
}

// Dequantize implements backend.Ops.
func (b *Backend) Dequantize(s backend.Stream, W backend.Quant, off int, out backend.Tensor) error {
	if err := W.Check(); err != nil {
		return fmt.Errorf("trace: Dequantize: %w", err)
	}
	op := Op{Method: "Dequantize", Family: Elementwise, DType: out.DType, Shapes: shapes(W.Codes, out),
		FLOPs: float64(out.Len()), Bytes: hazard.Dequantize(W, out).Bytes()}
	return b.do(s, op, []arg{need("out", out, out.Len())}, func() error { return b.inner.Dequantize(s, W, off, out) })
}

// AddBias implements backend.Ops.
func (b *Backend) AddBias(s backend.Stream, out, bias backend.Tensor, N, OC int) error {
	if err := dims("AddBias", N, OC); err != nil {
		return err
	}
	op := Op{Method: "AddBias", Family: Elementwise, DType: out.DType, Shapes: shapes(out, bias),
		FLOPs: float64(N * OC), Bytes: hazard.AddBias(out, bias).Bytes()}
	return b.do(s, op, []arg{need("out", out, N*OC), need("bias", bias, OC)}, func() error { return b.inner.AddBias(s, out, bias, N, OC) })
}

// BiasBackward implements backend.Ops.
func (b *Backend) BiasBackward(s backend.Stream, dbias, dout backend.Tensor, N, OC int) error {
	if err := dims("BiasBackward", N, OC); err != nil {
		return err
	}
	op := Op{Method: "BiasBackward", Family: Reduce, DType: dout.DType, Shapes: shapes(dbias, dout),
		FLOPs: float64(N * OC), Bytes: hazard.BiasBackward(dbias, dout).Bytes()}
	return b.do(s, op, []arg{need("dbias", dbias, OC), need("dout", dout, N*OC)}, func() error { return b.inner.BiasBackward(s, dbias, dout, N, OC) })
}

// attnFLOPs is n matmuls of T x T x HS per head over the causal half
// (query t sees t+1 keys): n * 2 * HS * T(T+1)/2 per head.
func attnFLOPs(n, B, T, NH, HS int) float64 {
	return float64(n) * float64(B) * float64(NH) * float64(T) * float64(T+1) * float64(HS)
}

// AttentionForward implements backend.Ops.
func (b *Backend) AttentionForward(s backend.Stream, out, lse, qkv, pos backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	if err := dims("AttentionForward", B, T, NH, KVH, HS); err != nil {
		return err
	}
	BT := B * T
	nqkv := BT * (NH + 2*KVH) * HS
	// Two matmuls (QK^T and PV), each 2 T^2 HS per head, halved by the mask.
	op := Op{Method: "AttentionForward", Family: Attention, DType: qkv.DType, Shapes: shapes(out, lse, qkv, pos),
		FLOPs: attnFLOPs(2, B, T, NH, HS), Bytes: hazard.AttentionForward(out, lse, qkv, pos).Bytes()}
	args := []arg{need("out", out, BT*NH*HS), need("lse", lse, B*NH*T), need("qkv", qkv, nqkv), maybe("pos", pos, BT)}
	return b.do(s, op, args, func() error {
		return b.inner.AttentionForward(s, out, lse, qkv, pos, B, T, NH, KVH, HS, layout)
	})
}

// AttentionBackward implements backend.Ops.
func (b *Backend) AttentionBackward(s backend.Stream, dqkv, dout, qkv, out, lse, pos, scratch backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	if err := dims("AttentionBackward", B, T, NH, KVH, HS); err != nil {
		return err
	}
	BT := B * T
	nqkv := BT * (NH + 2*KVH) * HS
	// Five matmuls: the scores recomputed, dV, dP, dQ and dK.
	op := Op{Method: "AttentionBackward", Family: Attention, DType: qkv.DType, Shapes: shapes(dqkv, dout, qkv, out, lse, pos, scratch),
		FLOPs: attnFLOPs(5, B, T, NH, HS), Bytes: hazard.AttentionBackward(dqkv, dout, qkv, out, lse, pos, scratch, B, T, NH).Bytes()}
	args := []arg{need("dqkv", dqkv, nqkv), need("dout", dout, BT*NH*HS), need("qkv", qkv, nqkv), need("out", out, BT*NH*HS),
		need("lse", lse, B*NH*T), maybe("pos", pos, BT), need("scratch", scratch, backend.AttentionBackwardScratch(B, T, NH))}
	return b.do(s, op, args, func() error {
		return b.inner.AttentionBackward(s, dqkv, dout, qkv, out, lse, pos, scratch, B, T, NH, KVH, HS, layout)
	})
}

// GeluForward implements backend.Ops.
func (b *Backend) GeluForward(s backend.Stream, out, inp backend.Tensor) error {
	n := inp.Len()
	op := Op{Method: "GeluForward", Family: Activation, DType: inp.DType, Shapes: shapes(out, inp), FLOPs: 10 * float64(n), Bytes: hazard.GeluForward(out, inp).Bytes()}
	return b.do(s, op, []arg{need("out", out, n), need("inp", inp, -1)}, func() error { return b.inner.GeluForward(s, out, inp) })
}

// GeluBackward implements backend.Ops.
func (b *Backend) GeluBackward(s backend.Stream, dinp, inp, dout backend.Tensor) error {
	n := inp.Len()
	op := Op{Method: "GeluBackward", Family: Activation, DType: inp.DType, Shapes: shapes(dinp, inp, dout),
		FLOPs: 15 * float64(n), Bytes: hazard.GeluBackward(dinp, inp, dout).Bytes()}
	return b.do(s, op, []arg{need("dinp", dinp, n), need("inp", inp, -1), need("dout", dout, n)}, func() error { return b.inner.GeluBackward(s, dinp, inp, dout) })
}

// SwiGLUForward implements backend.Ops.
func (b *Backend) SwiGLUForward(s backend.Stream, out, gate, up backend.Tensor) error {
	n := gate.Len()
	op := Op{Method: "SwiGLUForward", Family: Activation, DType: gate.DType, Shapes: shapes(out, gate, up),
		FLOPs: 6 * float64(n), Bytes: hazard.SwiGLUForward(out, gate, up).Bytes()}
	return b.do(s, op, []arg{need("out", out, n), need("gate", gate, -1), need("up", up, n)}, func() error { return b.inner.SwiGLUForward(s, out, gate, up) })
}

// SwiGLUBackward implements backend.Ops.
func (b *Backend) SwiGLUBackward(s backend.Stream, dgate, dup, dout, gate, up backend.Tensor) error {
	n := gate.Len()
	op := Op{Method: "SwiGLUBackward", Family: Activation, DType: gate.DType, Shapes: shapes(dgate, dup, dout, gate, up),
		FLOPs: 10 * float64(n), Bytes: hazard.SwiGLUBackward(dgate, dup, dout, gate, up).Bytes()}
	args := []arg{need("dgate", dgate, n), need("dup", dup, n), need("dout", dout, n), need("gate", gate, -1), need("up", up, n)}
	return b.do(s, op, args, func() error { return b.inner.SwiGLUBackward(s, dgate, dup, dout, gate, up) })
}

// RMSNormForward implements backend.Ops.
func (b *Backend) RMSNormForward(s backend.Stream, out, rstd, inp, weight backend.Tensor, N, C int, eps float32) error {
	if err := dims("RMSNormForward", N, C); err != nil {
		return err
	}
	op := Op{Method: "RMSNormForward", Family: Norm, DType: inp.DType, Shapes: shapes(out, rstd, inp, weight),
		FLOPs: 4 * float64(N*C), Bytes: hazard.RMSNormForward(out, rstd, inp, weight).Bytes()}
	args := []arg{need("out", out, N*C), need("rstd", rstd, N), need("inp", inp, N*C), need("weight", weight, C)}
	return b.do(s, op, args, func() error { return b.inner.RMSNormForward(s, out, rstd, inp, weight, N, C, eps) })
}

// RMSNormBackward implements backend.Ops.
func (b *Backend) RMSNormBackward(s backend.Stream, dinp, dweight, dout, inp, weight, rstd, scratch backend.Tensor, N, C int) error {
	if err := dims("RMSNormBackward", N, C); err != nil {
		return err
	}
	op := Op{Method: "RMSNormBackward", Family: Norm, DType: inp.DType, Shapes: shapes(dinp, dweight, dout, inp, weight, rstd, scratch),
		FLOPs: 8 * float64(N*C), Bytes: hazard.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, scratch, N, C).Bytes()}
	args := []arg{need("dinp", dinp, N*C), need("dweight", dweight, C), need("dout", dout, N*C), need("inp", inp, N*C),
		need("weight", weight, C), need("rstd", rstd, N), need("scratch", scratch, backend.RMSNormBackwardScratch(N, C))}
	return b.do(s, op, args, func() error { return b.inner.RMSNormBackward(s, dinp, dweight, dout, inp, weight, rstd, scratch, N, C) })
}

// RoPEForward implements backend.Ops.
func (b *Backend) RoPEForward(s backend.Stream, out, inp, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	if err := dims("RoPEForward", B, T, NH, HS); err != nil {
		return err
	}
	n := B * T * NH * HS
	op := Op{Method: "RoPEForward", Family: Elementwise, DType: inp.DType, Shapes: shapes(out, inp, pos, invFreq),
		FLOPs: 6 * float64(n), Bytes: hazard.RoPE("rope", out, inp, pos, invFreq).Bytes()}
	args := []arg{need("out", out, n), need("inp", inp, n), maybe("pos", pos, B*T), need("invFreq", invFreq, HS/2)}
	return b.do(s, op, args, func() error { return b.inner.RoPEForward(s, out, inp, pos, invFreq, B, T, NH, HS) })
}

// RoPEBackward implements backend.Ops.
func (b *Backend) RoPEBackward(s backend.Stream, dinp, dout, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	if err := dims("RoPEBackward", B, T, NH, HS); err != nil {
		return err
	}
	n := B * T * NH * HS
	op := Op{Method: "RoPEBackward", Family: Elementwise, DType: dout.DType, Shapes: shapes(dinp, dout, pos, invFreq),
		FLOPs: 6 * float64(n), Bytes: hazard.RoPE("rope", dinp, dout, pos, invFreq).Bytes()}
	args := []arg{need("dinp", dinp, n), need("dout", dout, n), maybe("pos", pos, B*T), need("invFreq", invFreq, HS/2)}
	return b.do(s, op, args, func() error { return b.inner.RoPEBackward(s, dinp, dout, pos, invFreq, B, T, NH, HS) })
}

// CrossEntropyForwardBackward implements backend.Ops.
func (b *Backend) CrossEntropyForwardBackward(s backend.Stream, losses, logits, targets backend.Tensor, N, V int, scale float32) error {
	if err := dims("CrossEntropyForwardBackward", N, V); err != nil {
		return err
	}
	op := Op{Method: "CrossEntropyForwardBackward", Family: Loss, DType: logits.DType, Shapes: shapes(losses, logits, targets),
		FLOPs: 5 * float64(N) * float64(V), Bytes: hazard.CrossEntropyForwardBackward(losses, logits, targets, scale).Bytes()}
	args := []arg{need("losses", losses, N), need("logits", logits, N*V), need("targets", targets, N)}
	return b.do(s, op, args, func() error { return b.inner.CrossEntropyForwardBackward(s, losses, logits, targets, N, V, scale) })
}

// SumSquares implements backend.Ops.
func (b *Backend) SumSquares(s backend.Stream, out, x, work backend.Tensor) error {
	op := Op{Method: "SumSquares", Family: Reduce, DType: x.DType, Shapes: shapes(out, x, work), FLOPs: 2 * float64(x.Len()), Bytes: hazard.SumSquares(out, x, work).Bytes()}
	args := []arg{need("out", out, 1), need("x", x, -1), need("work", work, backend.SumSquaresWork)}
	return b.do(s, op, args, func() error { return b.inner.SumSquares(s, out, x, work) })
}

// NonFiniteFlag implements backend.Ops.
func (b *Backend) NonFiniteFlag(s backend.Stream, flag, x backend.Tensor) error {
	op := Op{Method: "NonFiniteFlag", Family: Reduce, DType: x.DType, Shapes: shapes(flag, x), FLOPs: float64(x.Len()), Bytes: hazard.NonFiniteFlag(flag, x).Bytes()}
	return b.do(s, op, []arg{need("flag", flag, 1), need("x", x, -1)}, func() error { return b.inner.NonFiniteFlag(s, flag, x) })
}

// AdamW implements backend.Ops.
func (b *Backend) AdamW(s backend.Stream, param, master, grad, m, v, sumSq, skip backend.Tensor, p backend.AdamParams) error {
	n := param.Len()
	op := Op{Method: "AdamW", Family: Adam, DType: param.DType, Shapes: shapes(param, master, grad, m, v, sumSq, skip),
		FLOPs: 15 * float64(n), Bytes: hazard.AdamW(param, master, grad, m, v, sumSq, skip, p.MaxNorm).Bytes()}
	args := []arg{need("param", param, -1), maybe("master", master, n), need("grad", grad, n), need("m", m, n), need("v", v, n),
		maybe("sumSq", sumSq, 1), maybe("skip", skip, 1)}
	return b.do(s, op, args, func() error { return b.inner.AdamW(s, param, master, grad, m, v, sumSq, skip, p) })
}

// SparseCompressA implements backend.Ops.
func (b *Backend) SparseCompressA(s backend.Stream, A, X, colptr, rowidx, colval backend.Tensor, BT, m, d int) error {
	if err := dims("SparseCompressA", BT, m, d); err != nil {
		return err
	}
	nnz := colval.Len()
	op := Op{Method: "SparseCompressA", Family: Sparse, DType: X.DType, Shapes: shapes(A, X, colptr, rowidx, colval),
		FLOPs: 2 * float64(BT) * float64(nnz), Bytes: hazard.SparseCompressA(A, X, colptr, rowidx, colval).Bytes()}
	args := []arg{need("A", A, d*BT), need("X", X, BT*m), need("colptr", colptr, d+1), need("rowidx", rowidx, nnz), need("colval", colval, -1)}
	return b.do(s, op, args, func() error { return b.inner.SparseCompressA(s, A, X, colptr, rowidx, colval, BT, m, d) })
}

// SparseCompressB implements backend.Ops.
func (b *Backend) SparseCompressB(s backend.Stream, B, dY, colptr, rowidx, colval backend.Tensor, BT, n, d int) error {
	if err := dims("SparseCompressB", BT, n, d); err != nil {
		return err
	}
	nnz := colval.Len()
	op := Op{Method: "SparseCompressB", Family: Sparse, DType: dY.DType, Shapes: shapes(B, dY, colptr, rowidx, colval),
		FLOPs: 2 * float64(BT) * float64(nnz), Bytes: hazard.SparseCompressB(B, dY, colptr, rowidx, colval).Bytes()}
	args := []arg{need("B", B, BT*d), need("dY", dY, BT*n), need("colptr", colptr, d+1), need("rowidx", rowidx, nnz), need("colval", colval, -1)}
	return b.do(s, op, args, func() error { return b.inner.SparseCompressB(s, B, dY, colptr, rowidx, colval, BT, n, d) })
}

// SparseS implements backend.Ops.
func (b *Backend) SparseS(s backend.Stream, S, A, B backend.Tensor, BT, d int, accumulate bool) error {
	if err := dims("SparseS", BT, d); err != nil {
		return err
	}
	op := Op{Method: "SparseS", Family: Sparse, DType: A.DType, Shapes: shapes(S, A, B),
		FLOPs: 2 * float64(d) * float64(d) * float64(BT), Bytes: hazard.SparseS(S, A, B, accumulate).Bytes()}
	args := []arg{need("S", S, d*d), need("A", A, d*BT), need("B", B, BT*d)}
	return b.do(s, op, args, func() error { return b.inner.SparseS(s, S, A, B, BT, d, accumulate) })
}

// SparseApply implements backend.Ops.
func (b *Backend) SparseApply(s backend.Stream, W, T, Delta, pidx, pval, qidx, qval, skip backend.Tensor, m, n, d, r int, lr, wd float32, seed, step uint64, matrix uint32) error {
	if err := dims("SparseApply", m, n, d, r); err != nil {
		return err
	}
	// T = Delta Q^T (r terms per entry), then W's every entry decayed and
	// added its r terms of P T.
	mn := float64(m) * float64(n)
	op := Op{Method: "SparseApply", Family: Sparse, DType: W.DType, Shapes: shapes(W, T, Delta, pidx, pval, qidx, qval, skip),
		FLOPs: 2*float64(d)*float64(n)*float64(r) + 2*mn*float64(r) + 2*mn,
		Bytes: hazard.SparseApply(W, T, Delta, pidx, pval, qidx, qval, skip).Bytes()}
	args := []arg{need("W", W, m*n), need("T", T, d*n), need("Delta", Delta, d*d), need("pidx", pidx, m*r), need("pval", pval, m*r),
		need("qidx", qidx, n*r), need("qval", qval, n*r), maybe("skip", skip, 1)}
	return b.do(s, op, args, func() error {
		return b.inner.SparseApply(s, W, T, Delta, pidx, pval, qidx, qval, skip, m, n, d, r, lr, wd, seed, step, matrix)
	})
}

// DenseGemm implements backend.Ops: an fp32 product on the ordinary
// cores (family Dense, not Gemm: no tensor cores, no FMA).
func (b *Backend) DenseGemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	if err := dims("DenseGemm", M, N, K); err != nil {
		return err
	}
	op := Op{Method: "DenseGemm", Family: Dense, DType: C.DType, Shapes: shapes(A, B, C), Gemm: GemmArgs{transA, transB, M, N, K},
		FLOPs: 2 * float64(M) * float64(N) * float64(K), Bytes: hazard.DenseGemm(A, B, beta, C).Bytes()}
	args := []arg{need("A", A, M*K), need("B", B, K*N), need("C", C, M*N)}
	return b.do(s, op, args, func() error { return b.inner.DenseGemm(s, transA, transB, M, N, K, alpha, A, B, beta, C) })
}

// DenseApply implements backend.Ops: DenseGemm's product and the update
// of W (its decay and add, 2 flops an element).
func (b *Backend) DenseApply(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, decay float32, W, skip backend.Tensor,
	seed, step uint64, matrix uint32) error {
	if err := dims("DenseApply", M, N, K); err != nil {
		return err
	}
	mn := float64(M) * float64(N)
	op := Op{Method: "DenseApply", Family: Dense, DType: W.DType, Shapes: shapes(A, B, W, skip), Gemm: GemmArgs{transA, transB, M, N, K},
		FLOPs: 2*mn*float64(K) + 2*mn, Bytes: hazard.DenseApply(A, B, W, skip).Bytes()}
	args := []arg{need("A", A, M*K), need("B", B, K*N), need("W", W, M*N), maybe("skip", skip, 1)}
	return b.do(s, op, args, func() error {
		return b.inner.DenseApply(s, transA, transB, M, N, K, alpha, A, B, decay, W, skip, seed, step, matrix)
	})
}

// SparseValueGrad implements backend.Ops.
func (b *Backend) SparseValueGrad(s backend.Stream, out, Y, M, K, idx, val backend.Tensor, rows, d, r int, w float32, trans, accumulate bool) error {
	if err := dims("SparseValueGrad", rows, d, r); err != nil {
		return err
	}
	// Per entry: d terms of Y M (when Y is present) and r of val K.
	per := float64(r)
	if Y.Buf != nil {
		per += float64(d)
	}
	op := Op{Method: "SparseValueGrad", Family: Sparse, DType: out.DType, Shapes: shapes(out, Y, M, K, idx, val),
		FLOPs: 2 * float64(rows) * float64(r) * per, Bytes: hazard.SparseValueGrad(out, Y, M, K, idx, val, accumulate).Bytes()}
	args := []arg{need("out", out, rows*r), maybe("Y", Y, rows*d), maybe("M", M, d*d), need("K", K, d*d), need("idx", idx, rows*r), need("val", val, rows*r)}
	return b.do(s, op, args, func() error {
		return b.inner.SparseValueGrad(s, out, Y, M, K, idx, val, rows, d, r, w, trans, accumulate)
	})
}

// CopyH2D implements backend.Backend.
func (b *Backend) CopyH2D(s backend.Stream, dst backend.Tensor, src backend.HostBuffer, srcOff int) error {
	if src == nil || srcOff < 0 || srcOff+int(dst.Bytes()) > hostLen(src) {
		return fmt.Errorf("trace: CopyH2D: %d bytes at %d out of a host buffer of %d", dst.Bytes(), srcOff, lenOr0(src))
	}
	op := Op{Method: "CopyH2D", Family: Copy, DType: dst.DType, Shapes: shapes(dst), Bytes: by(dst), Link: H2D}
	err := b.do(s, op, []arg{need("dst", dst, -1)}, func() error { return b.inner.CopyH2D(s, dst, src, srcOff) })
	if err == nil && b.inner == nil {
		b.mu.Lock()
		b.traffic.H2D += dst.Bytes()
		b.mu.Unlock()
	}
	return err
}

// CopyD2H implements backend.Backend.
func (b *Backend) CopyD2H(s backend.Stream, dst backend.HostBuffer, dstOff int, src backend.Tensor) error {
	if dst == nil || dstOff < 0 || dstOff+int(src.Bytes()) > hostLen(dst) {
		return fmt.Errorf("trace: CopyD2H: %d bytes at %d out of a host buffer of %d", src.Bytes(), dstOff, lenOr0(dst))
	}
	op := Op{Method: "CopyD2H", Family: Copy, DType: src.DType, Shapes: shapes(src), Bytes: by(src), Link: D2H}
	err := b.do(s, op, []arg{need("src", src, -1)}, func() error { return b.inner.CopyD2H(s, dst, dstOff, src) })
	if err == nil && b.inner == nil {
		b.mu.Lock()
		b.traffic.D2H += src.Bytes()
		b.mu.Unlock()
	}
	return err
}

// CopyD2D implements backend.Backend.
func (b *Backend) CopyD2D(s backend.Stream, dst, src backend.Tensor) error {
	op := Op{Method: "CopyD2D", Family: Copy, DType: src.DType, Shapes: shapes(dst, src), Bytes: hazard.CopyD2D(dst, src).Bytes()}
	return b.do(s, op, []arg{need("dst", dst, -1), need("src", src, dst.Len())}, func() error { return b.inner.CopyD2D(s, dst, src) })
}

func lenOr0(h backend.HostBuffer) int {
	if h == nil {
		return 0
	}
	return hostLen(h)
}

var _ backend.Backend = (*Backend)(nil)
