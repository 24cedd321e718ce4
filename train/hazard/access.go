// What each op of the Backend contract reads and writes: one declaration
// per op, the CPU backend's hazard mode and Wrap both use them. Call them
// only with arguments the op accepted (scratch must hold what the op
// uses): they slice, they do not check. Optional tensors (nil Buf) touch
// nothing; what an op touches only for some arguments (C of a Gemm with
// beta != 0) is declared only then, so that a legal schedule is not
// flagged.

package hazard

import "github.com/lsp-offload/lsp-offload/train/backend"

// Access is what one op reads and writes, named for hazard reports.
type Access struct {
	Name          string
	Reads, Writes []backend.Range
}

// Bytes is the bytes the access reads plus the bytes it writes: a range
// both read and written counts twice (write-allocate is not counted, as in
// STREAM). It is the one byte count of an op that the planner's tracer
// (train/trace) and the CPU calibration (train/calibrate) share, so that
// an efficiency measured by the one applies to the ops recorded by the
// other. Declarations name whole tensors: an op that touches part of one
// (the encoder's rows of the token table) is counted in full.
func (a Access) Bytes() int64 {
	var n int64
	for _, r := range a.Reads {
		n += r.Hi - r.Lo
	}
	for _, r := range a.Writes {
		n += r.Hi - r.Lo
	}
	return n
}

// ranges lists the ranges of the tensors that are present.
func ranges(ts ...backend.Tensor) []backend.Range {
	out := make([]backend.Range, 0, len(ts))
	for _, t := range ts {
		if t.Buf != nil {
			out = append(out, t.Range())
		}
	}
	return out
}

// used is the part of a scratch tensor an op overwrites: its first n
// elements (none when n is 0).
func used(scratch backend.Tensor, n int) backend.Tensor {
	if n == 0 || scratch.Buf == nil {
		return backend.Tensor{}
	}
	return scratch.Slice(0, n)
}

// HostRange is the range of n bytes at off of a host buffer.
func HostRange(h backend.HostBuffer, off, n int) backend.Range {
	return backend.Range{Buf: h.ID(), Lo: int64(off), Hi: int64(off + n)}
}

func Fill(t backend.Tensor) Access { return Access{"fill", nil, ranges(t)} }

func Scale(t backend.Tensor) Access { return Access{"scale", ranges(t), ranges(t)} }

func Add(out, x, y backend.Tensor) Access { return Access{"add", ranges(x, y), ranges(out)} }

func Accumulate(dst, src backend.Tensor) Access {
	return Access{"accumulate", ranges(dst, src), ranges(dst)}
}

func EncoderForward(out, inp, pos, wte, wpe backend.Tensor) Access {
	return Access{"encoder forward", ranges(inp, pos, wte, wpe), ranges(out)}
}

func EncoderBackward(dwte, dwpe, dout, inp, pos backend.Tensor) Access {
	return Access{"encoder backward", ranges(dwte, dwpe, dout, inp, pos), ranges(dwte, dwpe)}
}

func LayerNormForward(out, mean, rstd, inp, weight, bias backend.Tensor) Access {
	return Access{"layernorm forward", ranges(inp, weight, bias), ranges(out, mean, rstd)}
}

func LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch backend.Tensor, N, C int) Access {
	return Access{"layernorm backward", ranges(dinp, dweight, dbias, dout, inp, weight, mean, rstd),
		ranges(dinp, dweight, dbias, used(scratch, backend.LayerNormBackwardScratch(N, C)))}
}

func Gemm(A, B backend.Tensor, beta float32, C backend.Tensor) Access {
	reads := ranges(A, B)
	if beta != 0 {
		reads = append(reads, ranges(C)...)
	}
	return Access{"gemm", reads, ranges(C)}
}

// GemmQ reads A and every tensor of W (backend.Quant).
func GemmQ(A backend.Tensor, W backend.Quant, beta float32, C backend.Tensor) Access {
	reads := ranges(A, W.Codes, W.Absmax, W.Scale, W.Book)
	if beta != 0 {
		reads = append(reads, ranges(C)...)
	}
	return Access{"gemm q", reads, ranges(C)}
}

func Dequantize(W backend.Quant, out backend.Tensor) Access {
	return Access{"dequantize", ranges(W.Codes, W.Absmax, W.Scale, W.Book), ranges(out)}
}

func AddBias(out, bias backend.Tensor) Access {
	return Access{"add bias", ranges(out, bias), ranges(out)}
}

func BiasBackward(dbias, dout backend.Tensor) Access {
	return Access{"bias backward", ranges(dbias, dout), ranges(dbias)}
}

func AttentionForward(out, lse, qkv, pos backend.Tensor) Access {
	return Access{"attention forward", ranges(qkv, pos), ranges(out, lse)}
}

func AttentionBackward(dqkv, dout, qkv, out, lse, pos, scratch backend.Tensor, B, T, NH int) Access {
	return Access{"attention backward", ranges(dout, qkv, out, lse, pos),
		ranges(dqkv, used(scratch, backend.AttentionBackwardScratch(B, T, NH)))}
}

func GeluForward(out, inp backend.Tensor) Access {
	return Access{"gelu forward", ranges(inp), ranges(out)}
}

func GeluBackward(dinp, inp, dout backend.Tensor) Access {
	return Access{"gelu backward", ranges(inp, dout), ranges(dinp)}
}

func SwiGLUForward(out, gate, up backend.Tensor) Access {
	return Access{"swiglu forward", ranges(gate, up), ranges(out)}
}

func SwiGLUBackward(dgate, dup, dout, gate, up backend.Tensor) Access {
	return Access{"swiglu backward", ranges(dout, gate, up), ranges(dgate, dup)}
}

func RMSNormForward(out, rstd, inp, weight backend.Tensor) Access {
	return Access{"rmsnorm forward", ranges(inp, weight), ranges(out, rstd)}
}

func RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, scratch backend.Tensor, N, C int) Access {
	return Access{"rmsnorm backward", ranges(dinp, dweight, dout, inp, weight, rstd),
		ranges(dinp, dweight, used(scratch, backend.RMSNormBackwardScratch(N, C)))}
}

// RoPE is the access of either direction: out (or dinp) written from inp
// (or dout), which may be the same tensor.
func RoPE(op string, out, inp, pos, invFreq backend.Tensor) Access {
	return Access{op, ranges(inp, pos, invFreq), ranges(out)}
}

// CrossEntropyForwardBackward overwrites logits only when scale != 0.
func CrossEntropyForwardBackward(losses, logits, targets backend.Tensor, scale float32) Access {
	writes := ranges(losses)
	if scale != 0 {
		writes = append(writes, ranges(logits)...)
	}
	return Access{"cross entropy", ranges(logits, targets), writes}
}

func SumSquares(out, x, work backend.Tensor) Access {
	return Access{"sum squares", ranges(x), ranges(out, used(work, backend.SumSquaresWork))}
}

func NonFiniteFlag(flag, x backend.Tensor) Access {
	return Access{"non-finite flag", ranges(x), ranges(flag)}
}

// AdamW reads sumSq only when it clips (maxNorm > 0).
func AdamW(param, master, grad, m, v, sumSq, skip backend.Tensor, maxNorm float32) Access {
	reads := ranges(grad, param, m, v, master, skip)
	if maxNorm > 0 {
		reads = append(reads, ranges(sumSq)...)
	}
	return Access{"adamw", reads, ranges(param, m, v, master)}
}

func CopyD2D(dst, src backend.Tensor) Access { return Access{"copy d2d", ranges(src), ranges(dst)} }

func CopyH2D(dst backend.Tensor, src backend.HostBuffer, srcOff int) Access {
	return Access{"copy h2d", []backend.Range{HostRange(src, srcOff, int(dst.Bytes()))}, ranges(dst)}
}

func CopyD2H(dst backend.HostBuffer, dstOff int, src backend.Tensor) Access {
	return Access{"copy d2h", ranges(src), []backend.Range{HostRange(dst, dstOff, int(src.Bytes()))}}
}

func SparseCompressA(A, X, colptr, rowidx, colval backend.Tensor) Access {
	return Access{"sparse compress A", ranges(X, colptr, rowidx, colval), ranges(A)}
}

func SparseCompressB(B, dY, colptr, rowidx, colval backend.Tensor) Access {
	return Access{"sparse compress B", ranges(dY, colptr, rowidx, colval), ranges(B)}
}

// SparseS reads S only when it accumulates.
func SparseS(S, A, B backend.Tensor, accumulate bool) Access {
	reads := ranges(A, B)
	if accumulate {
		reads = append(reads, ranges(S)...)
	}
	return Access{"sparse S", reads, ranges(S)}
}

// DenseGemm reads C only when beta is not 0.
func DenseGemm(A, B backend.Tensor, beta float32, C backend.Tensor) Access {
	reads := ranges(A, B)
	if beta != 0 {
		reads = append(reads, ranges(C)...)
	}
	return Access{"dense gemm", reads, ranges(C)}
}

func DenseApply(A, B, W, skip backend.Tensor) Access {
	return Access{"dense apply", ranges(A, B, W, skip), ranges(W)}
}

func SparseApply(W, T, Delta, pidx, pval, qidx, qval, skip backend.Tensor) Access {
	return Access{"sparse apply", ranges(W, Delta, pidx, pval, qidx, qval, skip), ranges(W, T)}
}

// SparseValueGrad reads out only when it accumulates; an absent Y drops Y
// and M.
func SparseValueGrad(out, Y, M, K, idx, val backend.Tensor, accumulate bool) Access {
	reads := ranges(K, idx, val)
	if Y.Buf != nil {
		reads = append(reads, ranges(Y, M)...)
	}
	if accumulate {
		reads = append(reads, ranges(out)...)
	}
	return Access{"sparse value grad", reads, ranges(out)}
}
