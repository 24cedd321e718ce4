// The op table: every Backend op described once, as data (docs/DESIGN.md,
// "The op table"), in the manner of ggml's op table. The faces that do the
// same thing for every op read it instead of repeating the op:
//
//   - the storage types (Groups) the CUDA backend checks at enqueue and the
//     CPU backend in its KernelDTypes mode (dtypes.go), and the package
//     doc's table;
//   - what each op reads and writes (Reads, Writes), which the hazard
//     checks declare (train/hazard) and whose bytes the tracer records and
//     the calibration divides by (train/trace, train/calibrate);
//   - the tensors' element counts (Args) and the rules (Rule, Positive)
//     every backend checks (check.go), the FLOP count (FLOPs), family and
//     dtype the tracer records;
//   - the launcher in kernels/kernels.h, whose call cuda/ops_gen.go makes.
//
// Each entry also holds the op's parameters (Params) and, in the comment
// above it, its contract: opgen makes the Ops interface of them, with
// OpsFunc, Calls and Call.Run (ops_gen.go), and cuda's opsgen the CUDA
// launches. TestOpTable holds the entries well formed; TestEveryOpTested
// every op to its CPU test, its simulator test and its calibration case.

package backend

import (
	"fmt"
	"strings"
)

// OpDef is one op of the table.
type OpDef struct {
	Name string // the Ops method
	// Params is the method's parameters after its stream, as Go writes
	// them; with the comment above the entry, the op's contract, they make
	// the Ops interface (ops_gen.go).
	Params string
	Short  string // its name in hazard reports
	// Family is the op's cost family, the tracer's (train/trace.Family):
	// ops of a family share an efficiency.
	Family   string
	Launcher string // its function in kernels/kernels.h
	// Args is the op's tensor parameters, in order, space separated, as
	// "name:count": count is the tensor's elements (an expression for
	// Call.Eval; none: any), ">=count" at least that many (scratch);
	// "name?:count" an optional one (nil Buf: absent). The CUDA backend
	// holds a tensor to its count exactly, the tracer to at least it.
	Args string
	// Positive names the int parameters that must be at least 1; the
	// others must not be negative.
	Positive string
	// DType is the tensor whose storage type is the op's in a trace.
	DType string
	// FLOPs is the op's floating-point operations, an expression for
	// Call.Eval ("" none).
	FLOPs string
	// Reads and Writes are what the op touches (Call.Uses): "t" the whole
	// of tensor t, "t?c" t only when c holds (a bool that is true, a float
	// that is not 0, a tensor that is present, MaxNorm above 0), "t:n" the
	// first n elements of t (scratch), "W.*" every tensor of the quantized
	// matrix W. What an op touches only for some arguments is declared only
	// then, so that a legal schedule is not flagged.
	Reads, Writes string
	// Groups is the storage types of the op's tensors (dtypes.go).
	Groups []DTypeGroup
	// Rule checks what the counts do not say (check.go): it returns why a
	// call is refused ("" if it is not) and whether it has nothing to do.
	Rule func(c *Call) (skip bool, why string)

	args     []TensorArg // Args parsed (init)
	positive []string    // Positive split (init)
}

// init parses each entry's Args and Positive once, for the checks every
// enqueue makes.
func init() {
	for i := range opTable {
		d := &opTable[i]
		d.args = d.parseArgs()
		d.positive = strings.Fields(d.Positive)
	}
}

// TensorArg is one tensor parameter of an op as Args declares it.
type TensorArg struct {
	Name     string
	Count    string // "" when any length will do
	AtLeast  bool   // Count is a least length (">=")
	Optional bool
}

// TensorArgs is Args parsed (do not modify the slice).
func (d *OpDef) TensorArgs() []TensorArg {
	if d.args == nil {
		return d.parseArgs()
	}
	return d.args
}

func (d *OpDef) parseArgs() []TensorArg {
	var out []TensorArg
	for _, f := range strings.Fields(d.Args) {
		name, count, _ := strings.Cut(f, ":")
		name, opt := strings.CutSuffix(name, "?")
		count, least := strings.CutPrefix(count, ">=")
		out = append(out, TensorArg{name, count, least, opt})
	}
	return out
}

// The op families (train/trace.Family).
const (
	famGemm        = "gemm"
	famAttention   = "attention"
	famNorm        = "norm"
	famActivation  = "activation"
	famElementwise = "elementwise"
	famSparse      = "sparse"
	famDense       = "dense"
	famEmbedding   = "embedding"
	famLoss        = "loss"
	famAdam        = "adam"
	famReduce      = "reduce"
)

// opTable is the table, in the order of the Ops methods. The comment just
// above an entry is its method's doc: the op's contract, in the generated
// Ops interface. Shapes use llm.c's names: B batch, T time, C channels, NH
// heads, V vocabulary. "+=" marks outputs that are accumulated into, not
// written. Scratch arguments are sized by the functions of scratch.go and
// allocated by the caller, so that memory plans count them.
var opTable = []OpDef{
	// Fill sets every element of t to v.
	{Name: "Fill", Params: "t Tensor, v float32",
		Short: "fill", Family: famElementwise, Launcher: "lsp_fill",
		Args: "t", DType: "t", Writes: "t", Groups: each("t")},
	// Scale multiplies every element of t by a.
	{Name: "Scale", Params: "t Tensor, a float32",
		Short: "scale", Family: famElementwise, Launcher: "lsp_scale",
		Args: "t", DType: "t", FLOPs: "len(t)", Reads: "t", Writes: "t", Groups: each("t")},
	// Add writes out = a + b (elementwise, same length).
	{Name: "Add", Params: "out, a, b Tensor",
		Short: "add", Family: famElementwise, Launcher: "lsp_add",
		Args: "out a:len(out) b:len(out)", DType: "out", FLOPs: "len(out)", Reads: "a b", Writes: "out", Groups: each("out", "a", "b")},
	// Accumulate adds src into dst: dst += src.
	{Name: "Accumulate", Params: "dst, src Tensor",
		Short: "accumulate", Family: famElementwise, Launcher: "lsp_accumulate",
		Args: "dst src:len(dst)", DType: "dst", FLOPs: "len(dst)", Reads: "dst src", Writes: "dst", Groups: each("dst", "src")},
	// EncoderForward: out[B,T,C] = wte[inp[b,t]] + wpe[pos[b,t]]; inp is
	// I32 [B,T]. pos (I32 [B,T], see Positions) is each token's position
	// within its document when a row packs several (--pack); absent, it is
	// t. An absent wpe (nil Buf) is no position table (LLaMA): out is the
	// token's row, and EncoderBackward then takes an absent dwpe.
	{Name: "EncoderForward", Params: "out, inp, pos, wte, wpe Tensor, B, T, C int",
		Short: "encoder forward", Family: famEmbedding, Launcher: "lsp_encoder_forward",
		Rule: encoderRule, Positive: "C",
		Args: "out:B*T*C inp:B*T pos?:B*T wte:>=C wpe?:>=T*C", DType: "wte", FLOPs: "B*T*C",
		Reads: "inp pos wte wpe", Writes: "out",
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "wte", "wpe"), grp(onlyI32, "", "inp", "pos")}},
	// EncoderBackward: dwte[inp[b,t]] += dout[b,t], dwpe[pos[b,t]] +=
	// dout[b,t], each element adding over (b, t) in increasing order
	// (deterministic).
	{Name: "EncoderBackward", Params: "dwte, dwpe, dout, inp, pos Tensor, B, T, C int",
		Short: "encoder backward", Family: famEmbedding, Launcher: "lsp_encoder_backward",
		Rule: encoderRule, Positive: "C",
		Args: "dwte:>=C dwpe?:>=T*C dout:B*T*C inp:B*T pos?:B*T", DType: "dout", FLOPs: "2*B*T*C",
		Reads: "dwte dwpe dout inp pos", Writes: "dwte dwpe",
		Groups: []DTypeGroup{grp(storage, "dw_bf16", "dwte", "dwpe"), grp(storage, "g_bf16", "dout"), grp(onlyI32, "", "inp", "pos")}},
	// LayerNormForward over the last dim C of N = B*T rows; saves mean and
	// rstd (F32 [N]) for the backward.
	{Name: "LayerNormForward", Params: "out, mean, rstd, inp, weight, bias Tensor, N, C int, eps float32",
		Short: "layernorm forward", Family: famNorm, Launcher: "lsp_layernorm_forward",
		Args: "out:N*C mean:N rstd:N inp:N*C weight:C bias:C", DType: "inp", FLOPs: "8*N*C",
		Reads: "inp weight bias", Writes: "out mean rstd",
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp", "weight", "bias"), grp(onlyF32, "", "mean", "rstd")}},
	// LayerNormBackward: dinp += ..., dweight += ..., dbias += ...;
	// scratch F32 of at least LayerNormBackwardScratch(N, C) elements,
	// overwritten (its contents are undefined after the op).
	{Name: "LayerNormBackward", Params: "dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch Tensor, N, C int",
		Short: "layernorm backward", Family: famNorm, Launcher: "lsp_layernorm_backward",
		Args:  "dinp:N*C dweight:C dbias:C dout:N*C inp:N*C weight:C mean:N rstd:N scratch:>=LayerNormBackwardScratch(N,C)",
		DType: "inp", FLOPs: "14*N*C",
		Reads: "dinp dweight dbias dout inp weight mean rstd", Writes: "dinp dweight dbias scratch:LayerNormBackwardScratch(N,C)",
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dinp", "dout"), grp(storage, "dw_bf16", "dweight", "dbias"),
			grp(storage, "x_bf16", "inp", "weight"), grp(onlyF32, "", "mean", "rstd", "scratch")}},
	// Gemm: C = alpha*op(A)*op(B) + beta*C, row-major, op(A) M x K, op(B)
	// K x N, contiguous (leading dimensions K or M, N or K, and N).
	{Name: "Gemm", Params: "transA, transB bool, M, N, K int, alpha float32, A, B Tensor, beta float32, C Tensor",
		Short: "gemm", Family: famGemm, Launcher: "lsp_gemm_bf16",
		Args: "A:M*K B:K*N C:M*N", DType: "A", FLOPs: "2*M*N*K", Reads: "A B C?beta", Writes: "C",
		Groups: []DTypeGroup{grp(onlyBF16, "", "A", "B"), grp(storage, "c_is_bf16", "C")}},
	// GemmQ: C = alpha*A*op(W) + beta*C with W a quantized matrix (Quant),
	// A [M,K], op(W) K x N: W stored K x N, or with transW stored N x K and
	// read transposed. Each value of W is dequantized and rounded to A's
	// dtype as it is read: the forward of a frozen quantized matrix and its
	// input gradient (docs/DESIGN.md, "Quantized base").
	{Name: "GemmQ", Params: "transW bool, M, N, K int, alpha float32, A Tensor, W Quant, beta float32, C Tensor",
		Short: "gemm q", Family: famGemm, Launcher: "lsp_gemm_q",
		Rule: gemmQRule,
		Args: "A:M*K C:M*N", DType: "A", FLOPs: "2*M*N*K", Reads: "A W.* C?beta", Writes: "C",
		Groups: []DTypeGroup{grp(onlyBF16, "", "A"), grp(storage, "c_is_bf16", "C")}},
	// Dequantize writes elements off..off+out.Len() of W (storage order)
	// to out (F32 or BF16): the export's and the checkpoint's values.
	{Name: "Dequantize", Params: "W Quant, off int, out Tensor",
		Short: "dequantize", Family: famElementwise, Launcher: "lsp_dequantize",
		Rule: dequantizeRule,
		Args: "out", DType: "out", FLOPs: "len(out)", Reads: "W.*", Writes: "out", Groups: each("out")},
	// AddBias: out[N,OC] += bias[OC] on every row.
	{Name: "AddBias", Params: "out, bias Tensor, N, OC int",
		Short: "add bias", Family: famElementwise, Launcher: "lsp_add_bias",
		Args: "out:N*OC bias:OC", DType: "out", FLOPs: "N*OC", Reads: "out bias", Writes: "out", Groups: each("out", "bias")},
	// BiasBackward: dbias[OC] += sum over N rows of dout[N,OC].
	{Name: "BiasBackward", Params: "dbias, dout Tensor, N, OC int",
		Short: "bias backward", Family: famReduce, Launcher: "lsp_bias_backward",
		Args: "dbias:OC dout:N*OC", DType: "dout", FLOPs: "N*OC", Reads: "dbias dout", Writes: "dbias", Groups: each("dbias", "dout")},
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
	{Name: "AttentionForward", Params: "out, lse, qkv, pos Tensor, B, T, NH, KVH, HS int, layout QKVLayout",
		Short: "attention forward", Family: famAttention, Launcher: "lsp_attention_forward",
		Rule: attentionRule,
		Args: "out:B*T*NH*HS lse:B*NH*T qkv:B*T*(NH+2*KVH)*HS pos?:B*T", DType: "qkv", FLOPs: "2*B*NH*T*(T+1)*HS", // QK^T and PV, 2 T^2 HS a head each, halved by the causal mask

		Reads: "qkv pos", Writes: "out lse",
		Groups: []DTypeGroup{grp(onlyBF16, "", "out", "qkv"), grp(onlyF32, "", "lse"), grp(onlyI32, "", "pos")}},
	// AttentionBackward recomputes the scores from qkv and lse and writes
	// dqkv (qkv's shape and layout; not accumulated: a key/value head's
	// gradient sums its query heads in ascending order); scratch F32 of
	// at least AttentionBackwardScratch(B, T, NH) elements, overwritten;
	// pos is the forward's.
	{Name: "AttentionBackward", Params: "dqkv, dout, qkv, out, lse, pos, scratch Tensor, B, T, NH, KVH, HS int, layout QKVLayout",
		Short: "attention backward", Family: famAttention, Launcher: "lsp_attention_backward",
		Rule: attentionRule,
		Args: "dqkv:B*T*(NH+2*KVH)*HS dout:B*T*NH*HS qkv:B*T*(NH+2*KVH)*HS out:B*T*NH*HS lse:B*NH*T pos?:B*T " +
			"scratch:>=AttentionBackwardScratch(B,T,NH)",
		DType: "qkv", FLOPs: "5*B*NH*T*(T+1)*HS", // the scores again, dV, dP, dQ and dK

		Reads: "dout qkv out lse pos", Writes: "dqkv scratch:AttentionBackwardScratch(B,T,NH)",
		Groups: []DTypeGroup{grp(onlyBF16, "", "dqkv", "dout", "qkv", "out"), grp(onlyF32, "", "lse", "scratch"), grp(onlyI32, "", "pos")}},
	// GeluForward: out = gelu(inp), the tanh approximation (HF "gelu_new").
	{Name: "GeluForward", Params: "out, inp Tensor",
		Short: "gelu forward", Family: famActivation, Launcher: "lsp_gelu_forward",
		Args: "out:len(inp) inp", DType: "inp", FLOPs: "10*len(inp)", Reads: "inp", Writes: "out",
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp")}},
	// GeluBackward: dinp = gelu'(inp) * dout (dinp may alias dout).
	{Name: "GeluBackward", Params: "dinp, inp, dout Tensor",
		Short: "gelu backward", Family: famActivation, Launcher: "lsp_gelu_backward",
		Args: "dinp:len(inp) inp dout:len(inp)", DType: "inp", FLOPs: "15*len(inp)", Reads: "inp dout", Writes: "dinp",
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dinp", "dout"), grp(storage, "x_bf16", "inp")}},
	// SwiGLUForward: out = silu(gate) * up elementwise, silu(g) = g *
	// sigmoid(g) (LLaMA's MLP).
	{Name: "SwiGLUForward", Params: "out, gate, up Tensor",
		Short: "swiglu forward", Family: famActivation, Launcher: "lsp_swiglu_forward",
		Args: "out:len(gate) gate up:len(gate)", DType: "gate", FLOPs: "6*len(gate)", Reads: "gate up", Writes: "out",
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "gate", "up")}},
	// SwiGLUBackward writes (not accumulates) dgate and dup from dout;
	// either may alias dout.
	{Name: "SwiGLUBackward", Params: "dgate, dup, dout, gate, up Tensor",
		Short: "swiglu backward", Family: famActivation, Launcher: "lsp_swiglu_backward",
		Args: "dgate:len(gate) dup:len(gate) dout:len(gate) gate up:len(gate)", DType: "gate", FLOPs: "10*len(gate)",
		Reads: "dout gate up", Writes: "dgate dup",
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dgate", "dup", "dout"), grp(storage, "x_bf16", "gate", "up")}},
	// RMSNormForward over the last dim C of N = B*T rows: out = inp *
	// rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps), saved (F32 [N])
	// for the backward.
	{Name: "RMSNormForward", Params: "out, rstd, inp, weight Tensor, N, C int, eps float32",
		Short: "rmsnorm forward", Family: famNorm, Launcher: "lsp_rmsnorm_forward",
		Args: "out:N*C rstd:N inp:N*C weight:C", DType: "inp", FLOPs: "4*N*C", Reads: "inp weight", Writes: "out rstd",
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp", "weight"), grp(onlyF32, "", "rstd")}},
	// RMSNormBackward: dinp += ..., dweight += ...; scratch F32 of at
	// least RMSNormBackwardScratch(N, C) elements, overwritten.
	{Name: "RMSNormBackward", Params: "dinp, dweight, dout, inp, weight, rstd, scratch Tensor, N, C int",
		Short: "rmsnorm backward", Family: famNorm, Launcher: "lsp_rmsnorm_backward",
		Args: "dinp:N*C dweight:C dout:N*C inp:N*C weight:C rstd:N scratch:>=RMSNormBackwardScratch(N,C)", DType: "inp", FLOPs: "8*N*C",
		Reads: "dinp dweight dout inp weight rstd", Writes: "dinp dweight scratch:RMSNormBackwardScratch(N,C)",
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dinp", "dout"), grp(storage, "dw_bf16", "dweight"),
			grp(storage, "x_bf16", "inp", "weight"), grp(onlyF32, "", "rstd", "scratch")}},
	// RoPEForward: rotary position embeddings (HF LLaMA's rotate_half) of
	// x [B,T,NH,HS] at positions pos[b,t] (Positions; absent: t): in
	// every head the pairs (i, i+HS/2) are rotated by pos * invFreq[i];
	// invFreq F32 [HS/2] holds the (possibly scaled, see rope_scaling)
	// inverse frequencies. out may be inp (in place). HS even.
	{Name: "RoPEForward", Params: "out, inp, pos, invFreq Tensor, B, T, NH, HS int",
		Short: "rope forward", Family: famElementwise, Launcher: "lsp_rope_forward",
		Rule: ropeRule,
		Args: "out:B*T*NH*HS inp:B*T*NH*HS pos?:B*T invFreq:HS/2", DType: "inp", FLOPs: "6*B*T*NH*HS",
		Reads: "inp pos invFreq", Writes: "out",
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp"), grp(onlyF32, "", "invFreq"), grp(onlyI32, "", "pos")}},
	// RoPEBackward writes dinp, the rotation of dout by -angle; dinp may
	// be dout.
	{Name: "RoPEBackward", Params: "dinp, dout, pos, invFreq Tensor, B, T, NH, HS int",
		Short: "rope backward", Family: famElementwise, Launcher: "lsp_rope_backward",
		Rule: ropeRule,
		Args: "dinp:B*T*NH*HS dout:B*T*NH*HS pos?:B*T invFreq:HS/2", DType: "dout", FLOPs: "6*B*T*NH*HS",
		Reads: "dout pos invFreq", Writes: "dinp",
		Groups: []DTypeGroup{grp(storage, "x_bf16", "dinp", "dout"), grp(onlyF32, "", "invFreq"), grp(onlyI32, "", "pos")}},
	// CrossEntropyForwardBackward: fused softmax + cross-entropy over V
	// classes of N rows. losses F32 [N] gets -log p[target] (0 where the
	// target is negative: ignored); logits [N,V] is overwritten by
	// dlogits = scale * (softmax - onehot) (0 on ignored rows). With
	// scale 0 only the losses are computed and logits are kept.
	{Name: "CrossEntropyForwardBackward", Params: "losses, logits, targets Tensor, N, V int, scale float32",
		Short: "cross entropy", Family: famLoss, Launcher: "lsp_cross_entropy_forward_backward",
		Args: "losses:N logits:N*V targets:N", DType: "logits", FLOPs: "5*N*V", Reads: "logits targets", Writes: "losses logits?scale",
		Groups: []DTypeGroup{grp(onlyF32, "", "losses"), grp(storage, "x_bf16", "logits"), grp(onlyI32, "", "targets")}},
	// SumSquares writes out[0] = sum of x^2, accumulated in float64 in a
	// fixed order; out is F32 [1] (a view); work F64 of at least
	// SumSquaresWork elements, overwritten.
	{Name: "SumSquares", Params: "out, x, work Tensor",
		Short: "sum squares", Family: famReduce, Launcher: "lsp_sum_squares",
		Args: "out:1 x work:>=SumSquaresWork", DType: "x", FLOPs: "2*len(x)", Reads: "x", Writes: "out work:SumSquaresWork",
		Groups: []DTypeGroup{grp(onlyF32, "", "out"), grp(storage, "x_bf16", "x"), grp(onlyF64, "", "work")}},
	// NonFiniteFlag writes flag[0] = 1 when some element of x (F32) is NaN
	// or infinite, else 0; flag is F32 [1] (a view). It turns the step's
	// per-token losses into the skip flag the update ops read, on the
	// device, so skipping a step needs no host synchronization.
	{Name: "NonFiniteFlag", Params: "flag, x Tensor",
		Short: "non-finite flag", Family: famReduce, Launcher: "lsp_non_finite_flag",
		Args: "flag:1 x", DType: "x", FLOPs: "len(x)", Reads: "x", Writes: "flag",
		Groups: []DTypeGroup{grp(onlyF32, "", "flag", "x")}},
	// AdamW updates param (and master, an F32 copy of a bf16 param, when
	// master.Buf != nil) from grad with moments m, v (F32), decoupled
	// weight decay, bias correction for p.Step, eps outside the sqrt, and
	// clipping by sumSq (F32 [1], the squared norm the clip uses) when
	// p.MaxNorm > 0. skip (F32 [1], read on the device; nil Buf: never)
	// skips the update when skip[0] != 0: nothing is written (param,
	// master, m and v keep their bits), as for a step whose loss
	// NonFiniteFlag found not finite.
	{Name: "AdamW", Params: "param, master, grad, m, v, sumSq, skip Tensor, p AdamParams",
		Short: "adamw", Family: famAdam, Launcher: "lsp_adamw",
		Rule:  adamRule,
		Args:  "param master?:len(param) grad:len(param) m:len(param) v:len(param) sumSq?:1 skip?:1",
		DType: "param", FLOPs: "15*len(param)",
		Reads: "grad param m v master skip sumSq?MaxNorm", Writes: "param m v master",
		Groups: []DTypeGroup{grp(storage, "param_bf16", "param"), grp(storage, "grad_bf16", "grad"),
			grp(onlyF32, "", "master", "m", "v", "sumSq", "skip")}},
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
	{Name: "SparseCompressA", Params: "A, X, colptr, rowidx, colval Tensor, BT, m, d int",
		Short: "sparse compress A", Family: famSparse, Launcher: "lsp_sparse_compress_a", Positive: "BT m d",
		Args: "A:d*BT X:BT*m colptr:d+1 rowidx colval:len(rowidx)", DType: "X", FLOPs: "2*BT*len(colval)",
		Reads: "X colptr rowidx colval", Writes: "A",
		Groups: []DTypeGroup{grp(onlyF32, "", "A", "colval"), grp(storage, "x_bf16", "X"), grp(onlyI32, "", "colptr", "rowidx")}},
	// SparseCompressB: B [BT,d] F32 = dY Q, dY [BT,n] (F32 or BF16), Q in
	// column storage.
	{Name: "SparseCompressB", Params: "B, dY, colptr, rowidx, colval Tensor, BT, n, d int",
		Short: "sparse compress B", Family: famSparse, Launcher: "lsp_sparse_compress_b", Positive: "BT n d",
		Args: "B:BT*d dY:BT*n colptr:d+1 rowidx colval:len(rowidx)", DType: "dY", FLOPs: "2*BT*len(colval)",
		Reads: "dY colptr rowidx colval", Writes: "B",
		Groups: []DTypeGroup{grp(onlyF32, "", "B", "colval"), grp(storage, "dy_bf16", "dY"), grp(onlyI32, "", "colptr", "rowidx")}},
	// SparseS: S [d,d] F32 = A B, or S += A B when accumulate, summed over
	// t ascending; A [d,BT] and B [BT,d] F32.
	{Name: "SparseS", Params: "S, A, B Tensor, BT, d int, accumulate bool",
		Short: "sparse S", Family: famSparse, Launcher: "lsp_sparse_s", Positive: "BT d",
		Args: "S:d*d A:d*BT B:BT*d", DType: "A", FLOPs: "2*d*d*BT", Reads: "A B S?accumulate", Writes: "S",
		Groups: []DTypeGroup{grp(onlyF32, "", "S", "A", "B")}},
	// SparseApply: W [m,n] <- (1 - lr*wd) W + P Delta Q^T with P, Q in row
	// storage (pidx I32 [m*r], pval F32 [m*r], qidx I32 [n*r], qval F32
	// [n*r]); Delta [d,d] F32; T [d,n] F32 workspace (left holding Delta
	// Q^T); 1 <= r <= d. A BF16 W is written by stochastic rounding keyed
	// by (seed, step, matrix, element i*n+j), bit for bit as the CPU
	// reference (cpu.SparseApply); an F32 W is written exactly (no
	// rounding). skip (F32 [1], read on the device; nil Buf: never) skips
	// the apply when skip[0] != 0: neither W nor T is written (AdamW's
	// skip).
	{Name: "SparseApply", Params: "W, T, Delta, pidx, pval, qidx, qval, skip Tensor, m, n, d, r int, lr, wd float32, seed, step uint64, matrix uint32",
		Short: "sparse apply", Family: famSparse, Launcher: "lsp_sparse_apply",
		Rule: sparseApplyRule, Positive: "m n d r",
		Args:  "W:m*n T:d*n Delta:d*d pidx:m*r pval:m*r qidx:n*r qval:n*r skip?:1",
		DType: "W", FLOPs: "2*d*n*r+2*m*n*r+2*m*n", // T = Delta Q^T, r terms an entry; W decayed and added r terms of P T

		Reads: "W Delta pidx pval qidx qval skip", Writes: "W T",
		Groups: []DTypeGroup{grp(storage, "w_bf16", "W"), grp(onlyF32, "", "T", "Delta", "pval", "qval", "skip"), grp(onlyI32, "", "pidx", "qidx")}},
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
	{Name: "SparseValueGrad", Params: "out, Y, M, K, idx, val Tensor, rows, d, r int, w float32, trans, accumulate bool",
		Short: "sparse value grad", Family: famSparse, Launcher: "lsp_sparse_value_grad",
		Rule: valueGradRule, Positive: "rows d r",
		Args: "out:rows*r Y?:rows*d M?:d*d K:d*d idx:rows*r val:rows*r", DType: "out", FLOPs: "2*rows*r*(r+has(Y)*d)", // an entry: d terms of Y M (with Y), r of val K

		Reads: "K idx val Y?Y M?Y out?accumulate", Writes: "out",
		Groups: []DTypeGroup{grp(onlyF32, "", "out", "Y", "M", "K", "val"), grp(onlyI32, "", "idx")}},
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
	{Name: "DenseGemm", Params: "transA, transB bool, M, N, K int, alpha float32, A, B Tensor, beta float32, C Tensor",
		Short: "dense gemm", Family: famDense, Launcher: "lsp_dense_gemm", Positive: "M N K",
		Args: "A:M*K B:K*N C:M*N", DType: "C", FLOPs: "2*M*N*K", Reads: "A B C?beta", Writes: "C",
		Groups: []DTypeGroup{grp(storage, "a_bf16", "A"), grp(storage, "b_bf16", "B"), grp(onlyF32, "", "C")}},
	// DenseApply: W [M,N] <- decay*W + alpha*op(A)*op(B), op(A) M x K and
	// op(B) K x N F32; each element float32(decay*W) + float32(alpha*sum).
	// A BF16 W is written by stochastic rounding keyed by (seed, step,
	// matrix, element i*N+j), as SparseApply's; an F32 W exactly. skip
	// (F32 [1], read on the device; nil Buf: never) leaves W as it is when
	// skip[0] != 0.
	{Name: "DenseApply", Params: "transA, transB bool, M, N, K int, alpha float32, A, B Tensor, decay float32, W, skip Tensor, seed, step uint64, matrix uint32",
		Short: "dense apply", Family: famDense, Launcher: "lsp_dense_apply", Positive: "M N K",
		Args: "A:M*K B:K*N W:M*N skip?:1", DType: "W", FLOPs: "2*M*N*K+2*M*N", // the product, then W decayed and added
		Reads: "A B W skip", Writes: "W",
		Groups: []DTypeGroup{grp(onlyF32, "", "A", "B", "skip"), grp(storage, "w_bf16", "W")}},
}

// each is the groups of an op whose launcher has one *_bf16 flag per
// tensor (the elementwise family): every argument fp32 or bf16 on its
// own, as on the CPU backend.
func each(args ...string) []DTypeGroup {
	var gs []DTypeGroup
	for _, a := range args {
		gs = append(gs, grp(storage, a+"_bf16", a))
	}
	return gs
}

// OpTable returns the table (the entries are shared: do not modify them).
func OpTable() []OpDef { return opTable }

// OpSignatures returns every op's parameters, in the table's order.
func OpSignatures() []Signature { return opSignatures }

// LookupOp is op's entry in the table.
func LookupOp(op string) (*OpDef, error) {
	if i, ok := opIndex[op]; ok && i < len(opTable) && opTable[i].Name == op {
		return &opTable[i], nil
	}
	return nil, fmt.Errorf("%s: no such op in the op table", op)
}
