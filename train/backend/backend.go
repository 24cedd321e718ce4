// The Backend interface, its storage types and tensor views.

package backend

import (
	"fmt"
	"time"
)

// DType is a storage type. Arithmetic is always fp32; bf16 is converted at
// load and rounded to nearest even at store.
type DType uint8

// Storage types.
const (
	F32  DType = iota // IEEE binary32
	BF16              // bfloat16, the top half of a binary32
	I32               // token ids and targets
	// F64 is for scratch only (SumSquares' work): no model tensor and no
	// flag has it, and no op computes on it.
	F64
)

// Size is the number of bytes of one element.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16:
		return 2
	case F64:
		return 8
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "fp32"
	case BF16:
		return "bf16"
	case I32:
		return "i32"
	case F64:
		return "fp64"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseDType reads "fp32"/"f32"/"float32" or "bf16"/"bfloat16".
func ParseDType(s string) (DType, error) {
	switch s {
	case "fp32", "f32", "float32":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	}
	return F32, fmt.Errorf("unknown dtype %q (want fp32 or bf16)", s)
}

// Buffer is one device allocation. Tensors are views into it.
type Buffer interface {
	// ID is unique among the live buffers of a backend.
	ID() int
	// Name says what the buffer holds, for errors and memory reports.
	Name() string
	// Bytes is the size of the allocation.
	Bytes() int64
}

// HostBuffer is pinned (page-locked) host memory that device copies read and
// write. Host code may touch it only when ordered after the copies that use
// it (Synchronize, or EventSynchronize on an event recorded after them).
type HostBuffer interface {
	// ID is unique among the live host buffers of a backend.
	ID() int
	Bytes() []byte
	Float32() []float32
	Int32() []int32
	// BF16 views the bytes as bfloat16 values (raw uint16 bits), the
	// model dtype's storage, so no caller builds its own unsafe view.
	BF16() []uint16
}

// Tensor is a view (buffer, element offset, shape, dtype) into a device
// allocation. It is a value; slicing it never copies.
type Tensor struct {
	Buf   Buffer
	Off   int // in elements of DType
	Shape []int
	DType DType
}

// Len is the number of elements.
func (t Tensor) Len() int {
	n := 1
	for _, s := range t.Shape {
		n *= s
	}
	return n
}

// Bytes is the size of the view.
func (t Tensor) Bytes() int64 { return int64(t.Len()) * int64(t.DType.Size()) }

// Slice returns the contiguous view of n elements starting at element off of
// t, shaped as shape (which must hold n elements; empty means [n]).
func (t Tensor) Slice(off, n int, shape ...int) Tensor {
	if len(shape) == 0 {
		shape = []int{n}
	}
	return Tensor{Buf: t.Buf, Off: t.Off + off, Shape: shape, DType: t.DType}
}

// Reshape returns the same elements with another shape.
func (t Tensor) Reshape(shape ...int) Tensor {
	return Tensor{Buf: t.Buf, Off: t.Off, Shape: shape, DType: t.DType}
}

// Range is the byte range of the view, for hazard checks.
func (t Tensor) Range() Range {
	lo := int64(t.Off) * int64(t.DType.Size())
	return Range{Buf: t.Buf.ID(), Lo: lo, Hi: lo + t.Bytes()}
}

func (t Tensor) String() string {
	name := "<nil>"
	if t.Buf != nil {
		name = t.Buf.Name()
	}
	return fmt.Sprintf("%s[%d:]%v%v", name, t.Off, t.Shape, t.DType)
}

// Range is a byte range [Lo, Hi) of one buffer. Device buffers have
// positive ids; host buffers negative ones, so both share one space.
type Range struct {
	Buf    int
	Lo, Hi int64
}

// Overlaps reports whether two ranges share a byte.
func (r Range) Overlaps(o Range) bool { return r.Buf == o.Buf && r.Lo < o.Hi && o.Lo < r.Hi }

// Stream is an ordered queue of device work.
type Stream interface{ Name() string }

// Event marks a point in a stream.
type Event interface{ Name() string }

// MemStats reports device memory.
type MemStats struct {
	InUse, HighWater, Budget int64 // bytes; Budget 0 means unlimited
}

// Traffic counts bytes moved across the host-device link.
type Traffic struct {
	H2D, D2H int64
}

// AdamParams are the hyperparameters of one AdamW update.
type AdamParams struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	Step                               int // 1-based, for bias correction
	// MaxNorm > 0 clips: the gradient is scaled by min(1,
	// MaxNorm/(||g||+1e-6)), as torch's clip_grad_norm_ and the host Adam,
	// with ||g||^2 read from the SumSq tensor passed to AdamW.
	MaxNorm float32
}

// QKVLayout is how an attention op finds q, k and v in its qkv tensor.
type QKVLayout uint8

// The layouts of qkv.
const (
	// QKVFused: each position's q, k and v side by side, [B,T,(NH+2*KVH)*HS].
	QKVFused QKVLayout = iota
	// QKVPlanar: all of q [B,T,NH*HS], then all of k, then all of v
	// ([B,T,KVH*HS] each).
	QKVPlanar
)

func (l QKVLayout) String() string {
	switch l {
	case QKVFused:
		return "fused"
	case QKVPlanar:
		return "planar"
	}
	return fmt.Sprintf("QKVLayout(%d)", uint8(l))
}

// QKVIndex locates q, k and v in a qkv tensor of some layout: query head
// h of position p (= b*T + t) starts at element QBase + p*QRow + h*HS, key
// head g at KBase + p*KVRow + g*HS, value head g at VBase + p*KVRow +
// g*HS.
type QKVIndex struct {
	QBase, KBase, VBase int
	QRow, KVRow         int
}

// Index is l's QKVIndex for B*T positions of NH query and KVH key/value
// heads of HS.
func (l QKVLayout) Index(BT, NH, KVH, HS int) QKVIndex {
	if l == QKVPlanar {
		k := BT * NH * HS
		return QKVIndex{QBase: 0, KBase: k, VBase: k + BT*KVH*HS, QRow: NH * HS, KVRow: KVH * HS}
	}
	row := (NH + 2*KVH) * HS
	return QKVIndex{QBase: 0, KBase: NH * HS, VBase: (NH + KVH) * HS, QRow: row, KVRow: row}
}

// Backend is the device the model runs on. All ops are asynchronous: they
// are enqueued on a stream and return at once; argument errors (shapes,
// dtypes) are returned immediately, failures while running at Synchronize.
// The package doc says which goroutine may call which method.
type Backend interface {
	Name() string

	// Memory.
	Alloc(name string, n int, dt DType) (Tensor, error) // a new zeroed buffer as a 1-D tensor
	Free(t Tensor)                                      // frees t's whole buffer
	MemStats() MemStats
	AllocHost(name string, bytes int) (HostBuffer, error)
	FreeHost(h HostBuffer)
	Traffic() Traffic
	// Staging is the backend's pinned staging buffer, owned by the
	// backend and freed by Close: the blocking transfers (Upload,
	// Download) go through it instead of pinning memory per call.
	Staging() *Staging

	// Streams and events.
	DefaultStream() Stream // the backend's own; it cannot be destroyed
	NewStream(name string) (Stream, error)
	// DestroyStream releases s once the work enqueued on it has run (as
	// cudaStreamDestroy); s may not be used afterwards.
	DestroyStream(s Stream) error
	NewEvent(name string) (Event, error)
	// DestroyEvent releases e; waits already enqueued on it still end
	// when its record is reached. e may not be used afterwards.
	DestroyEvent(e Event) error
	// Record marks the point s has reached: work enqueued on s before it.
	// It fails on an event or stream that is not this backend's or was
	// destroyed, and after Close.
	Record(e Event, s Stream) error
	Wait(s Stream, e Event) error
	Synchronize(s Stream) error     // waits for s; returns its first async error
	EventSynchronize(e Event) error // host waits for the latest record of e
	// ElapsedTime is the device time from the latest record of start to
	// the latest record of end (cudaEventElapsedTime): both must have been
	// recorded and have completed (EventSynchronize first), or it is an
	// error.
	ElapsedTime(start, end Event) (time.Duration, error)
	Close() error // synchronizes every stream and releases everything

	// Copies between device tensors and pinned host memory (byte offsets
	// into the host buffer). The element type is the tensor's.
	CopyH2D(s Stream, dst Tensor, src HostBuffer, srcOff int) error
	CopyD2H(s Stream, dst HostBuffer, dstOff int, src Tensor) error
	CopyD2D(s Stream, dst, src Tensor) error // same length; converts dtypes

	Ops
}

// Ops are the compute ops. Every op has one CPU implementation and one CUDA
// launcher of the same name and argument order (docs/DESIGN.md, "One op, three
// faces"); the dtypes each accepts on every backend are the table of
// KernelDTypes (the package doc shows it). Scratch arguments are sized by the
// functions of scratch.go and allocated by the caller, so that memory plans
// count them. Shapes use llm.c's names: B batch, T time, C channels, NH heads,
// V vocabulary. "+=" marks outputs that are accumulated into, not written.
type Ops interface {
	// Fill sets every element of t to v.
	Fill(s Stream, t Tensor, v float32) error
	// Scale multiplies every element of t by a.
	Scale(s Stream, t Tensor, a float32) error
	// Add writes out = a + b (elementwise, same length).
	Add(s Stream, out, a, b Tensor) error
	// Accumulate adds src into dst: dst += src.
	Accumulate(s Stream, dst, src Tensor) error

	// EncoderForward: out[B,T,C] = wte[inp[b,t]] + wpe[pos[b,t]]; inp is
	// I32 [B,T]. pos (I32 [B,T], see Positions) is each token's position
	// within its document when a row packs several (--pack); absent, it is
	// t. An absent wpe (nil Buf) is no position table (LLaMA): out is the
	// token's row, and EncoderBackward then takes an absent dwpe.
	EncoderForward(s Stream, out, inp, pos, wte, wpe Tensor, B, T, C int) error
	// EncoderBackward: dwte[inp[b,t]] += dout[b,t], dwpe[pos[b,t]] +=
	// dout[b,t], each element adding over (b, t) in increasing order
	// (deterministic).
	EncoderBackward(s Stream, dwte, dwpe, dout, inp, pos Tensor, B, T, C int) error

	// LayerNormForward over the last dim C of N = B*T rows; saves mean and
	// rstd (F32 [N]) for the backward.
	LayerNormForward(s Stream, out, mean, rstd, inp, weight, bias Tensor, N, C int, eps float32) error
	// LayerNormBackward: dinp += ..., dweight += ..., dbias += ...;
	// scratch F32 of at least LayerNormBackwardScratch(N, C) elements,
	// overwritten (its contents are undefined after the op).
	LayerNormBackward(s Stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch Tensor, N, C int) error

	// Gemm: C = alpha*op(A)*op(B) + beta*C, row-major, op(A) M x K, op(B)
	// K x N, contiguous (leading dimensions K or M, N or K, and N).
	Gemm(s Stream, transA, transB bool, M, N, K int, alpha float32, A, B Tensor, beta float32, C Tensor) error
	// GemmQ: C = alpha*A*op(W) + beta*C with W a quantized matrix (Quant),
	// A [M,K], op(W) K x N: W stored K x N, or with transW stored N x K and
	// read transposed. Each value of W is dequantized and rounded to A's
	// dtype as it is read: the forward of a frozen quantized matrix and its
	// input gradient (docs/DESIGN.md, "Quantized base").
	GemmQ(s Stream, transW bool, M, N, K int, alpha float32, A Tensor, W Quant, beta float32, C Tensor) error
	// Dequantize writes elements off..off+out.Len() of W (storage order)
	// to out (F32 or BF16): the export's and the checkpoint's values.
	Dequantize(s Stream, W Quant, off int, out Tensor) error
	// AddBias: out[N,OC] += bias[OC] on every row.
	AddBias(s Stream, out, bias Tensor, N, OC int) error
	// BiasBackward: dbias[OC] += sum over N rows of dout[N,OC].
	BiasBackward(s Stream, dbias, dout Tensor, N, OC int) error

	// AttentionForward: causal attention with NH query heads and KVH
	// key/value heads of HS each (grouped-query when KVH < NH: query head
	// h reads key/value head h/(NH/KVH); NH must be a multiple of KVH).
	// qkv holds, for each of the B*T positions, q (NH*HS), k and v (KVH*HS
	// each), as layout says: QKVFused, one row [q|k|v] per position
	// ([B,T,(NH+2*KVH)*HS], GPT-2's c_attn), or QKVPlanar, q [B,T,NH*HS]
	// then k [B,T,KVH*HS] then v [B,T,KVH*HS] (LLaMA's three
	// projections, each contiguous). out [B,T,NH*HS]; lse F32 [B,NH,T] the
	// log-sum-exp of each softmax row (scale 1/sqrt(HS)), saved for the
	// backward (flash style). pos (Positions) restricts each query to its
	// document: query t attends keys t-pos[b,t]..t; absent, keys 0..t.
	AttentionForward(s Stream, out, lse, qkv, pos Tensor, B, T, NH, KVH, HS int, layout QKVLayout) error
	// AttentionBackward recomputes the scores from qkv and lse and writes
	// dqkv (qkv's shape and layout; not accumulated: a key/value head's
	// gradient sums its query heads in ascending order); scratch F32 of
	// at least AttentionBackwardScratch(B, T, NH) elements, overwritten;
	// pos is the forward's.
	AttentionBackward(s Stream, dqkv, dout, qkv, out, lse, pos, scratch Tensor, B, T, NH, KVH, HS int, layout QKVLayout) error

	// GeluForward: out = gelu(inp), the tanh approximation (HF "gelu_new").
	GeluForward(s Stream, out, inp Tensor) error
	// GeluBackward: dinp = gelu'(inp) * dout (dinp may alias dout).
	GeluBackward(s Stream, dinp, inp, dout Tensor) error

	// SwiGLUForward: out = silu(gate) * up elementwise, silu(g) = g *
	// sigmoid(g) (LLaMA's MLP).
	SwiGLUForward(s Stream, out, gate, up Tensor) error
	// SwiGLUBackward writes (not accumulates) dgate and dup from dout;
	// either may alias dout.
	SwiGLUBackward(s Stream, dgate, dup, dout, gate, up Tensor) error

	// RMSNormForward over the last dim C of N = B*T rows: out = inp *
	// rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps), saved (F32 [N])
	// for the backward.
	RMSNormForward(s Stream, out, rstd, inp, weight Tensor, N, C int, eps float32) error
	// RMSNormBackward: dinp += ..., dweight += ...; scratch F32 of at
	// least RMSNormBackwardScratch(N, C) elements, overwritten.
	RMSNormBackward(s Stream, dinp, dweight, dout, inp, weight, rstd, scratch Tensor, N, C int) error

	// RoPEForward: rotary position embeddings (HF LLaMA's rotate_half) of
	// x [B,T,NH,HS] at positions pos[b,t] (Positions; absent: t): in
	// every head the pairs (i, i+HS/2) are rotated by pos * invFreq[i];
	// invFreq F32 [HS/2] holds the (possibly scaled, see rope_scaling)
	// inverse frequencies. out may be inp (in place). HS even.
	RoPEForward(s Stream, out, inp, pos, invFreq Tensor, B, T, NH, HS int) error
	// RoPEBackward writes dinp, the rotation of dout by -angle; dinp may
	// be dout.
	RoPEBackward(s Stream, dinp, dout, pos, invFreq Tensor, B, T, NH, HS int) error

	// CrossEntropyForwardBackward: fused softmax + cross-entropy over V
	// classes of N rows. losses F32 [N] gets -log p[target] (0 where the
	// target is negative: ignored); logits [N,V] is overwritten by
	// dlogits = scale * (softmax - onehot) (0 on ignored rows). With
	// scale 0 only the losses are computed and logits are kept.
	CrossEntropyForwardBackward(s Stream, losses, logits, targets Tensor, N, V int, scale float32) error

	// SumSquares writes out[0] = sum of x^2, accumulated in float64 in a
	// fixed order; out is F32 [1] (a view); work F64 of at least
	// SumSquaresWork elements, overwritten.
	SumSquares(s Stream, out, x, work Tensor) error
	// NonFiniteFlag writes flag[0] = 1 when some element of x (F32) is NaN
	// or infinite, else 0; flag is F32 [1] (a view). It turns the step's
	// per-token losses into the skip flag the update ops read, on the
	// device, so skipping a step needs no host synchronization.
	NonFiniteFlag(s Stream, flag, x Tensor) error
	// AdamW updates param (and master, an F32 copy of a bf16 param, when
	// master.Buf != nil) from grad with moments m, v (F32), decoupled
	// weight decay, bias correction for p.Step, eps outside the sqrt, and
	// clipping by sumSq (F32 [1], the squared norm the clip uses) when
	// p.MaxNorm > 0. skip (F32 [1], read on the device; nil Buf: never)
	// skips the update when skip[0] != 0: nothing is written (param,
	// master, m and v keep their bits), as for a step whose loss
	// NonFiniteFlag found not finite.
	AdamW(s Stream, param, master, grad, m, v, sumSq, skip Tensor, p AdamParams) error

	// LSP sparse projection (docs/DESIGN.md, "LSP as implemented"). BT tokens,
	// m inputs, n outputs, d the projected size, r non-zeros per projector row.
	// P [m,d] and Q [n,d] are (d,r)-sparse and never dense: column storage
	// (colptr I32 [d+1], rowidx I32 [nnz], colval F32 [nnz], rows strictly
	// ascending within a column) for compress, row storage (idx I32 [rows*r],
	// val F32 [rows*r], distinct columns within a row) for apply. Every sum
	// runs in a fixed order (see train/cpu/ref_sparse.go). The CPU backend
	// validates index contents on the stream (an error at Synchronize); kernels
	// trust them, so build them with cpu.SparseColumns and check them with
	// cpu.CheckSparseRows.

	// SparseCompressA: A [d,BT] F32 = P^T X^T, X [BT,m] (F32 or BF16), P in
	// column storage: colptr I32 [d+1], rowidx I32 [nnz], colval F32 [nnz].
	SparseCompressA(s Stream, A, X, colptr, rowidx, colval Tensor, BT, m, d int) error
	// SparseCompressB: B [BT,d] F32 = dY Q, dY [BT,n] (F32 or BF16), Q in
	// column storage.
	SparseCompressB(s Stream, B, dY, colptr, rowidx, colval Tensor, BT, n, d int) error
	// SparseS: S [d,d] F32 = A B, or S += A B when accumulate, summed over
	// t ascending; A [d,BT] and B [BT,d] F32.
	SparseS(s Stream, S, A, B Tensor, BT, d int, accumulate bool) error
	// SparseApply: W [m,n] <- (1 - lr*wd) W + P Delta Q^T with P, Q in row
	// storage (pidx I32 [m*r], pval F32 [m*r], qidx I32 [n*r], qval F32
	// [n*r]); Delta [d,d] F32; T [d,n] F32 workspace (left holding Delta
	// Q^T); 1 <= r <= d. A BF16 W is written by stochastic rounding keyed
	// by (seed, step, matrix, element i*n+j), bit for bit as the CPU
	// reference (cpu.SparseApply); an F32 W is written exactly (no
	// rounding). skip (F32 [1], read on the device; nil Buf: never) skips
	// the apply when skip[0] != 0: neither W nor T is written (AdamW's
	// skip).
	SparseApply(s Stream, W, T, Delta, pidx, pval, qidx, qval, skip Tensor, m, n, d, r int, lr, wd float32, seed, step uint64, matrix uint32) error
	// SparseValueGrad is the projector fit's gradient gathered at a
	// projector X's positions (train/lsp: bias.go, devicefit.go): X [rows,d]
	// in row storage (idx I32 [rows*r], val F32 [rows*r]); for entry e =
	// i*r+s at column a = idx[e],
	//	g = sum_b Y(i,b) M(a,b) + sum over row i's entries t of val[t] K[idx[t]*d + a]
	// with Y(i,b) = Y[i*d+b], M(a,b) = M[a*d+b] (Y [rows,d]) or, when
	// trans, Y(i,b) = Y[b*rows+i], M(a,b) = M[b*d+a] (Y [d,rows]); an
	// absent Y (nil Buf) drops the first sum (M then unused). out F32
	// [rows*r] gets w*g, or += w*g when accumulate. M and K F32 [d,d].
	// Sums in fixed order: b ascending, then t ascending, in fp32.
	SparseValueGrad(s Stream, out, Y, M, K, idx, val Tensor, rows, d, r int, w float32, trans, accumulate bool) error
	// Dense projection (docs/DESIGN.md, "Projector kinds"): the svd and
	// gaussian projectors' compress and apply, and GaLore's projection of
	// a gradient and its update's way back. The projectors are dense fp32
	// matrices and stay fp32 on every backend (the bf16 GEMM would keep 8
	// bits of them). Every element's sum runs over k ascending from +0 in
	// fp32, each product rounded before it is added (float32(a*b), never
	// an FMA), as cpu.DenseGemm: the CPU backend and the kernels give the
	// same bits.

	// DenseGemm: C [M,N] F32 = alpha*op(A)*op(B) + beta*C, op(A) M x K and
	// op(B) K x N, row-major and contiguous as Gemm; A and B F32 or BF16,
	// each on its own (bf16 widened exactly). Each element is
	// float32(alpha*sum) + float32(beta*C); beta 0 does not read C.
	DenseGemm(s Stream, transA, transB bool, M, N, K int, alpha float32, A, B Tensor, beta float32, C Tensor) error
	// DenseApply: W [M,N] <- decay*W + alpha*op(A)*op(B), op(A) M x K and
	// op(B) K x N F32; each element float32(decay*W) + float32(alpha*sum).
	// A BF16 W is written by stochastic rounding keyed by (seed, step,
	// matrix, element i*N+j), as SparseApply's; an F32 W exactly. skip
	// (F32 [1], read on the device; nil Buf: never) leaves W as it is when
	// skip[0] != 0.
	DenseApply(s Stream, transA, transB bool, M, N, K int, alpha float32, A, B Tensor, decay float32, W, skip Tensor, seed, step uint64, matrix uint32) error
}

// DeviceHeadroom is the device memory a GPU backend leaves to CUDA itself
// (launch resources, library workspaces) when its arena takes the free
// memory without a --device-mem: the larger of 256 MiB and 1/20 of the
// free memory. The CUDA backend sizes its arena by it and the planner
// plans a card's budget by it, so that a plan that fits is a run that
// starts.
func DeviceHeadroom(free int64) int64 { return max(256<<20, free/20) }
