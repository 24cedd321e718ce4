/*
 * kernels.h: the extern "C" launchers of every CUDA kernel of lsp-offload.
 *
 * Each launcher enqueues its kernel on `stream` and returns the CUDA error
 * of the launch (cudaErrorInvalidValue for bad sizes). Storage types are in
 * the signatures: a `void*` tensor is fp32 or bf16 as the launcher's int
 * argument for it says (those named *_bf16: 0 fp32, 1 bf16, as backend.DType
 * numbers them), and the other pointers have a fixed type
 * (`__nv_bfloat16*`, `float*`, `int*` for int32). bf16 is widened exactly at
 * load and, unless a launcher says otherwise, rounded to nearest even at
 * store; arithmetic and accumulation are fp32 (lsp_sum_squares sums in
 * double). Shapes use llm.c's short names: B batch, T time, C channels, NH
 * (query) heads, KVH key/value heads, HS head size, V vocabulary; m, n, d,
 * r for the LSP projectors.
 *
 * The same declarations serve nvcc builds (libkernels.a) and the CPU
 * simulator (kernels/sim), which compiles the same .cu files with g++.
 */
#ifndef LSP_KERNELS_H
#define LSP_KERNELS_H

#include "common.cuh"

#ifdef __cplusplus
extern "C" {
#endif

// BEGIN gemm
// C[b] = gelu?(alpha * op(A[b]) op(B[b]) + beta * C[b] + bias?) for b < batch
// on tensor cores: row-major op(A) M x K, op(B) K x N, C M x N (see
// gemm.cu). A is [M][K] or, with transA, [K][M]; B is [K][N] or, with
// transB, [N][K]. Strides are in elements between batches (0 broadcasts A
// or B). C is float* or, with c_is_bf16, __nv_bfloat16* (rounded to nearest
// even); beta == 0 does not read C. bias (length N, may be NULL) and gelu
// (tanh form) are the optional epilogue.
cudaError_t lsp_gemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const __nv_bfloat16* A,
                          long long strideA, const __nv_bfloat16* B, long long strideB, float beta, void* C,
                          int c_is_bf16, long long strideC, int batch, const __nv_bfloat16* bias, int gelu,
                          cudaStream_t stream);
// C = alpha * A op(W) + beta * C with W a quantized matrix (backend.Quant,
// read as quant.cuh says), dequantized to bf16 (nearest even) inside the
// operand loads of the same tensor-core GEMM (gemm.cu): A [M][K] bf16; W
// stored [K][N] or, with transW, [N][K] (K*N elements, its scale groups
// derived from that); format 1 NF4, 2 Int8 (backend.QFormat); codes and
// absmax are bytes, scale fp32 [groups+1] (the offset last), book fp32
// [272] (the dynamic map, then the NF4 levels). C is float* or, with
// c_is_bf16, __nv_bfloat16*; beta == 0 does not read C.
cudaError_t lsp_gemm_q(int transW, int M, int N, int K, float alpha, const __nv_bfloat16* A, int format,
                       const unsigned char* codes, const unsigned char* absmax, const float* scale, const float* book,
                       float beta, void* C, int c_is_bf16, cudaStream_t stream);
// END gemm

// BEGIN attention
// Fused causal attention (attention.cu) with NH query heads and KVH
// key/value heads of HS <= 256 each (grouped-query: query head h reads
// key/value head h / (NH/KVH); NH % KVH == 0), scale 1/sqrt(HS); HS 64 and
// 128 run on tensor cores when the bf16 pointers are 16-byte aligned, other
// head sizes on a generic path. qkv holds q (NH*HS), k and v (KVH*HS each)
// of the B*T positions as layout says (backend.QKVLayout): 0 fused, one
// [q | k | v] row per position, [B,T,(NH+2*KVH)*HS]; 1 planar, all q
// [B,T,NH*HS] then all k [B,T,KVH*HS] then all v.
// pos int32 [B,T] (NULL: 0..T-1) is each token's position within its
// document (packed rows): query t attends keys t - pos[b,t] .. t.
// Forward: out [B,T,NH*HS] bf16 and lse [B,NH,T] fp32 (natural log-sum-exp
// of each scaled score row) from qkv bf16.
cudaError_t lsp_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const int* pos, int B,
                                  int T, int NH, int KVH, int HS, int layout, cudaStream_t stream);
// Backward: dqkv bf16 in qkv's layout (written, not accumulated; a
// key/value head's gradient sums its query heads in ascending order) from
// dout [B,T,NH*HS], qkv, the forward's out and lse; scratch: B*NH*T floats
// (D). Deterministic, no atomics.
cudaError_t lsp_attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                   const __nv_bfloat16* out, const float* lse, const int* pos, float* scratch, int B,
                                   int T, int NH, int KVH, int HS, int layout, cudaStream_t stream);
// END attention

// BEGIN sparse
// LSP sparse projection (sparse.cu): P [m, d] and Q [n, d] are (d,r)-sparse
// (r non-zeros per row). Column storage colptr[d+1], rowidx[nnz] (strictly
// ascending within a column), colval[nnz]; row storage idx[rows*r],
// val[rows*r]; indices are int (int32). fp32 sums in fixed orders, no atomics.
// x_bf16, dy_bf16, w_bf16 are the dtypes (backend.DType: 0 fp32, 1 bf16) of
// X, dY and W; bf16 is widened exactly at load.
// A [d, BT] fp32 = P^T X^T from X [BT, m] (P by column).
cudaError_t lsp_sparse_compress_a(float* A, const void* X, const int* colptr, const int* rowidx, const float* colval,
                                  int BT, int m, int d, int x_bf16, cudaStream_t stream);
// B [BT, d] fp32 = dY Q from dY [BT, n] (Q by column).
cudaError_t lsp_sparse_compress_b(float* B, const void* dY, const int* colptr, const int* rowidx, const float* colval,
                                  int BT, int n, int d, int dy_bf16, cudaStream_t stream);
// S [d, d] = A B (accumulate == 0) or S += A B, summed over t ascending.
cudaError_t lsp_sparse_s(float* S, const float* A, const float* B, int BT, int d, int accumulate,
                         cudaStream_t stream);
// W [m, n] <- (1 - lr*wd) W + P Delta Q^T (P, Q by row), written exactly
// when fp32, by stochastic rounding keyed by (seed, step, matrix, i*n + j)
// when bf16; T: d*n floats of workspace (left holding Delta Q^T). skip
// (fp32 [1] on the device, NULL: never): when skip[0] != 0 nothing is
// written, neither W nor T (lsp_non_finite_flag's flag).
cudaError_t lsp_sparse_apply(void* W, float* T, const float* Delta, const int* pidx, const float* pval,
                             const int* qidx, const float* qval, const float* skip, int m, int n, int d, int r,
                             float lr, float wd, unsigned long long seed, unsigned long long step, unsigned int matrix,
                             int w_bf16, cudaStream_t stream);
// END sparse

// BEGIN dense
// Dense projection (dense.cu): the svd and gaussian projectors and
// GaLore's, dense fp32 matrices. Row-major as lsp_gemm_bf16: op(A) M x K
// ([M][K], or [K][M] with transA), op(B) K x N ([K][N], or [N][K] with
// transB). Each element's sum runs over k ascending from +0, every product
// rounded before its add (non-contracted fp32): the CPU backend's op bit
// for bit. a_bf16, b_bf16, w_bf16 are the dtypes (0 fp32, 1 bf16) of A, B
// and W; bf16 is widened exactly at load.
// C [M, N] fp32 = alpha*sum + beta*C, each term rounded before the add;
// beta == 0 does not read C.
cudaError_t lsp_dense_gemm(int transA, int transB, int M, int N, int K, float alpha, const void* A, int a_bf16,
                           const void* B, int b_bf16, float beta, float* C, cudaStream_t stream);
// W [M, N] <- decay*W + alpha*sum (each term rounded before the add) from
// A and B fp32, written exactly when fp32, by stochastic rounding keyed by
// (seed, step, matrix, i*N + j) when bf16 (lsp_sparse_apply's rounding).
// skip (fp32 [1] on the device, NULL: never): when skip[0] != 0 nothing is
// written.
cudaError_t lsp_dense_apply(int transA, int transB, int M, int N, int K, float alpha, const float* A, const float* B,
                            float decay, void* W, int w_bf16, const float* skip, unsigned long long seed,
                            unsigned long long step, unsigned int matrix, cudaStream_t stream);
// END dense

// BEGIN fit
// The projector fit's value gradient (fit.cu): X [rows, d] in row storage
// (idx int32, val fp32, r per row); for entry e = i*r+s at column a =
// idx[e], g = sum_b Y(i,b) M(a,b) (b ascending; skipped when Y is NULL)
// plus val[t] * K[idx[t]*d + a] over row i's entries t ascending, and
// out[e] = w*g (+= when accumulate). Y(i,b) = Y[i*d+b], M(a,b) = M[a*d+b]
// (Y [rows, d]) or, with trans, Y[b*rows+i] and M[b*d+a] (Y [d, rows]).
// M, K [d, d] fp32. Non-contracted fp32: the CPU backend's op bit for bit.
cudaError_t lsp_sparse_value_grad(float* out, const float* Y, const float* M, const float* K, const int* idx,
                                  const float* val, int rows, int d, int r, float w, int trans, int accumulate,
                                  cudaStream_t stream);
// END fit

// BEGIN norms
// LayerNorm and RMSNorm over the last dim C of N rows (see norms.cu).
// x_bf16 / g_bf16 / dw_bf16 are the dtypes (backend.DType: 0 fp32, 1 bf16)
// of the values (out, inp, weight, bias), of the activation gradients
// (dinp, dout) and of the parameter gradients (dweight, dbias), in any mix;
// mean and rstd are fp32 [N] (NULL allowed in the forwards).
// The backwards accumulate (+=) and need an fp32 scratch of
// lsp_*_backward_scratch_bytes(N, C) bytes, used only by that launch.
size_t lsp_layernorm_backward_scratch_bytes(int N, int C);
size_t lsp_rmsnorm_backward_scratch_bytes(int N, int C);
cudaError_t lsp_layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                                  const void* bias, int N, int C, float eps, int x_bf16, cudaStream_t stream);
cudaError_t lsp_layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                   const void* weight, const float* mean, const float* rstd, float* scratch, int N,
                                   int C, int x_bf16, int g_bf16, int dw_bf16, cudaStream_t stream);
cudaError_t lsp_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C, float eps,
                                int x_bf16, cudaStream_t stream);
cudaError_t lsp_rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* weight,
                                 const float* rstd, float* scratch, int N, int C, int x_bf16, int g_bf16,
                                 int dw_bf16, cudaStream_t stream);
// END norms

// BEGIN activations
// GELU (tanh form, gelu_new) and SwiGLU (out = silu(gate) * up), over n
// elements (see activations.cu). x_bf16 / g_bf16: dtypes (backend.DType:
// 0 fp32, 1 bf16) of the values (inp, gate, up, out) and of the gradients
// (dinp, dgate, dup, dout). Backwards write (not accumulate); dinp, dgate
// or dup may alias dout.
cudaError_t lsp_gelu_forward(void* out, const void* inp, long long n, int x_bf16, cudaStream_t stream);
cudaError_t lsp_gelu_backward(void* dinp, const void* inp, const void* dout, long long n, int x_bf16, int g_bf16,
                              cudaStream_t stream);
cudaError_t lsp_swiglu_forward(void* out, const void* gate, const void* up, long long n, int x_bf16,
                               cudaStream_t stream);
cudaError_t lsp_swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                                long long n, int x_bf16, int g_bf16, cudaStream_t stream);
// END activations

// BEGIN rope
// RoPE (HF LLaMA rotate_half) on q or k [B, T, NH, HS] at positions
// pos int32 [B,T] (NULL: 0..T-1; a packed row's positions restart at each
// document): the pairs (i, i + HS/2) are rotated by angle pos * inv_freq[i],
// inv_freq fp32 [HS/2] on the device (1/theta^(2i/HS), or scaled by the
// model's rope_scaling); the backward rotates by -angle and writes dinp.
// In place (out == inp) or not. x_bf16: dtype (backend.DType: 0 fp32, 1
// bf16). HS even, <= 512.
cudaError_t lsp_rope_forward(void* out, const void* inp, const int* pos, const float* inv_freq, int B, int T, int NH,
                             int HS, int x_bf16, cudaStream_t stream);
cudaError_t lsp_rope_backward(void* dinp, const void* dout, const int* pos, const float* inv_freq, int B, int T,
                              int NH, int HS, int x_bf16, cudaStream_t stream);
// END rope

// BEGIN embedding
// Token + position embedding (see embedding.cu): out[B,T,C] =
// wte[inp[b,t]] + wpe[pos[b,t]] (pos int32 [B,T], each token's position in
// its document; NULL: t) (x_bf16: dtype of out, wte, wpe); the backward
// accumulates dwte[inp[b,t]] += dout[b,t], dwpe[pos[b,t]] += dout[b,t]
// (g_bf16: dtype of dout; dw_bf16: of dwte and dwpe; any mix)
// deterministically, bit-identical to the CPU backend. inp is int32 [B, T];
// ids outside [0, V) give NaN rows (forward) and are skipped for dwte
// (backward). wpe and dwpe may be NULL: no position table (LLaMA).
cudaError_t lsp_encoder_forward(void* out, const int* inp, const int* pos, const void* wte, const void* wpe, int B,
                                int T, int C, int V, int x_bf16, cudaStream_t stream);
cudaError_t lsp_encoder_backward(void* dwte, void* dwpe, const void* dout, const int* inp, const int* pos, int B,
                                 int T, int C, int V, int g_bf16, int dw_bf16, cudaStream_t stream);
// END embedding

// BEGIN softmax_ce
// Fused softmax + cross-entropy over N rows of V logits (see
// softmax_ce.cu): losses fp32 [N] = logsumexp(z) - z[target] (0 where the
// target is negative); with scale != 0 the logits [N, V] (x_bf16: dtype,
// backend.DType 0 fp32, 1 bf16) are overwritten in place by
// scale * (softmax - onehot) (0 on ignored rows).
cudaError_t lsp_cross_entropy_forward_backward(float* losses, void* logits, const int* targets, int N, int V,
                                               float scale, int x_bf16, cudaStream_t stream);
// END softmax_ce

// BEGIN adam
// AdamW (adam.cu), the CPU backend's AdamW op bit for bit: param (bf16 when
// param_bf16, else fp32) updated from grad (bf16 when grad_bf16) with fp32
// moments m, v and, when master != NULL, an fp32 master copy (param then
// receives it, rounded to nearest even if bf16). Decoupled weight decay,
// bias correction for step >= 1, eps outside the sqrt; when max_norm > 0
// the gradient is scaled by min(1, max_norm / (sqrt(sum_sq[0]) + 1e-6)), sum_sq read
// on the device. n elements each. skip (fp32 [1] on the device, NULL:
// never): when skip[0] != 0 nothing is written (param, master, m and v
// keep their bits), for a step whose loss is not finite.
cudaError_t lsp_adamw(void* param, int param_bf16, float* master, const void* grad, int grad_bf16, float* m,
                      float* v, const float* sum_sq, const float* skip, long long n, float lr, float beta1,
                      float beta2, float eps, float weight_decay, int step, float max_norm, cudaStream_t stream);
// The step's skip flag (the CPU backend's NonFiniteFlag): flag[0] = 1 when
// some of x[0..n) is NaN or +-Inf, else 0 (written; n = 0 gives 0); one
// block, for vectors the size of a step's per-token losses.
cudaError_t lsp_non_finite_flag(float* flag, const float* x, long long n, cudaStream_t stream);
// END adam

// BEGIN cast
// Casts (cast.cu) of n elements: fp32 -> bf16 round to nearest even, bf16
// -> fp32 exact (the CPU backend's CopyD2D), and fp32 -> bf16 stochastic
// rounding with the counter-based bits of (seed, step, matrix, element i)
// (train/cpu StochasticRoundBF16Slice).
cudaError_t lsp_cast_f32_to_bf16(__nv_bfloat16* out, const float* in, long long n, cudaStream_t stream);
cudaError_t lsp_cast_bf16_to_f32(float* out, const __nv_bfloat16* in, long long n, cudaStream_t stream);
cudaError_t lsp_stochastic_round_bf16(__nv_bfloat16* out, const float* in, long long n, unsigned long long seed,
                                      unsigned long long step, unsigned int matrix, cudaStream_t stream);
// Gradient norm: out[0] = sum of x[i]^2 as fp32 (x bf16 when x_bf16), the
// CPU backend's SumSquares; double accumulation in a fixed order (two
// passes, no atomics); work: LSP_SUM_SQUARES_WORK doubles of scratch.
#define LSP_SUM_SQUARES_WORK 1024
cudaError_t lsp_sum_squares(float* out, const void* x, int x_bf16, long long n, double* work, cudaStream_t stream);
// END cast

// BEGIN elementwise
// The small ops of Backend.Ops (elementwise.cu), each the CPU backend's op
// bit for bit (a NaN made by arithmetic is NaN, its payload may differ).
// Every tensor has its own dtype flag, named after it (backend.DType: 0
// fp32, 1 bf16), in any mix; bf16 is rounded to nearest even at store.
// n elements (64-bit); out [N, OC] and dout [N, OC] row-major, bias and
// dbias [OC]. out may alias a or b, src may alias dst (same dtype); no
// other overlaps. Deterministic, no atomics.
// t = v.
cudaError_t lsp_fill(void* t, float v, long long n, int t_bf16, cudaStream_t stream);
// t = t * a.
cudaError_t lsp_scale(void* t, float a, long long n, int t_bf16, cudaStream_t stream);
// out = a + b.
cudaError_t lsp_add(void* out, const void* a, const void* b, long long n, int out_bf16, int a_bf16, int b_bf16,
                    cudaStream_t stream);
// dst += src.
cudaError_t lsp_accumulate(void* dst, const void* src, long long n, int dst_bf16, int src_bf16, cudaStream_t stream);
// out[r, :] += bias for every row r < N.
cudaError_t lsp_add_bias(void* out, const void* bias, int N, int OC, int out_bf16, int bias_bf16,
                         cudaStream_t stream);
// dbias += the column sums of dout, each summed over rows 0..N-1 in order
// from +0 in fp32 (the CPU's order; N == 0 adds +0).
cudaError_t lsp_bias_backward(void* dbias, const void* dout, int N, int OC, int dbias_bf16, int dout_bf16,
                              cudaStream_t stream);
// END elementwise

// BEGIN quant
// Elements off .. off+n of a quantized matrix of len elements (quant.cu;
// the storage as lsp_gemm_q's W) decoded into out: float* or, with
// out_bf16, __nv_bfloat16* (rounded to nearest even). fp32 values are
// train/quant.Decode's bit for bit.
cudaError_t lsp_dequantize(int format, const unsigned char* codes, const unsigned char* absmax, const float* scale,
                           const float* book, long long len, long long off, long long n, void* out, int out_bf16,
                           cudaStream_t stream);
// END quant

#ifdef __cplusplus
}
#endif

#endif
