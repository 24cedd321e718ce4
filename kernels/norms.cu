/*
 * norms.cu: LayerNorm (GPT-2) and RMSNorm (LLaMA), forward and backward,
 * over the last dimension C of N = B*T rows.
 *
 *   LayerNorm: out = (x - mean) * rstd * weight + bias,
 *              rstd = 1/sqrt(var + eps), biased variance
 *   RMSNorm:   out = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps)
 *
 * Shapes: out, inp [N, C]; weight, bias [C]; mean, rstd fp32 [N] (saved by
 * the forward for the backward; the forward may be given NULL for them).
 * The backward accumulates: dinp += ..., dweight += ..., dbias += ...
 *
 * Storage: the launchers take the dtype of each group of tensors, as
 * backend.DType values (0 fp32, 1 bf16): x_bf16 for the values (out, inp,
 * weight, bias), and in the backwards g_bf16 for the activation gradients
 * (dinp, dout) and dw_bf16 for the parameter gradients (dweight, dbias).
 * The two gradient flags are apart because a model keeps them apart: the
 * activation gradients in its storage dtype (bf16 on the GPU, as llm.c),
 * the parameter gradients in --grad-dtype (fp32 or bf16). Every mix runs.
 * Arithmetic is fp32; bf16 is widened at load and rounded to nearest even
 * at store, once.
 * Semantics are those of the CPU references cpu.LayerNormForward/Backward
 * and cpu.RMSNormForward/Backward (train/cpu/ref_norms.go).
 *
 * How: the forward and the input gradient give each row to one warp
 * (8 rows per 256-thread block): lane-strided passes over the row, sums by
 * xor-butterfly shuffles (every lane gets the same bits), then the
 * elementwise pass. The LayerNorm forward takes two passes for mean and
 * variance (no E[x^2] - mean^2 cancellation). The weight and bias
 * gradients are column sums over N rows, made deterministic without float
 * atomics in two kernels: P row chunks each write their partial column sums
 * to scratch[P][C] (one thread per column, rows in order), then one thread
 * per column adds the P partials in chunk order to dweight (and dbias). P
 * depends only on N (P = min(ceil(N/32), 512)), never on the device, so the
 * bits are the same on every GPU; lsp_*_backward_scratch_bytes gives the
 * size of the fp32 scratch the caller provides.
 *
 * Limits: N >= 0, C >= 1 (N*C < 2^63); the forward's out may alias inp;
 * in the backward dinp must not alias dout or inp. No barriers: warps never
 * share data.
 */
#include "kernels.h"
#include "ldst.cuh"

#include <stddef.h>

namespace {

constexpr int kRowThreads = 256;                 // threads per block of the row kernels
constexpr int kRowsPerBlock = kRowThreads / 32;  // one warp per row
constexpr int kColThreads = 128;                 // threads per block of the column kernels
constexpr int kMinChunkRows = 32;                // rows per partial column sum, at least
constexpr int kMaxChunks = 512;                  // partial column sums, at most

// warp_sum adds v over the 32 lanes; every lane gets the same bits (each
// butterfly step adds the same two partials, commutatively).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// layernorm_forward_kernel: warp w of block b normalises row b*8 + w.
template <typename X>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(X* out, float* mean, float* rstd, const X* inp, const X* weight, const X* bias, int N,
                             int C, float eps) {
  const int lane = threadIdx.x % 32;
  const long long row = (long long)blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;  // whole warps leave together
  const X* x = inp + row * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += ld(x + i);
  const float m = warp_sum(s) / (float)C;
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float d = ld(x + i) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / (float)C + eps);
  X* o = out + row * C;
  for (int i = lane; i < C; i += 32) st(o + i, ((ld(x + i) - m) * r) * ld(weight + i) + ld(bias + i));
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = r;
  }
}

// rmsnorm_forward_kernel: warp w of block b normalises row b*8 + w.
template <typename X>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(X* out, float* rstd, const X* inp, const X* weight, int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const long long row = (long long)blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const X* x = inp + row * C;
  float ss = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float a = ld(x + i);
    ss += a * a;
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
  X* o = out + row * C;
  for (int i = lane; i < C; i += 32) st(o + i, (ld(x + i) * r) * ld(weight + i));
  if (lane == 0 && rstd != nullptr) rstd[row] = r;
}

// norm_backward_input_kernel: dinp += rstd * (dn - mean(dn) - n*mean(dn*n))
// for LayerNorm (kLN) or rstd * (dn - n*mean(dn*n)) for RMSNorm, with
// n = (x - mean)*rstd or x*rstd and dn = dout*weight; one warp per row.
template <typename X, typename G, bool kLN>
__global__ void __launch_bounds__(kRowThreads)
    norm_backward_input_kernel(G* dinp, const G* dout, const X* inp, const X* weight, const float* mean,
                               const float* rstd, int N, int C) {
  const int lane = threadIdx.x % 32;
  const long long row = (long long)blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const X* x = inp + row * C;
  const G* dy = dout + row * C;
  const float m = kLN ? mean[row] : 0.0f;
  const float r = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float dn = ld(dy + i) * ld(weight + i);
    a += dn;
    b += dn * ((ld(x + i) - m) * r);
  }
  a = kLN ? warp_sum(a) / (float)C : 0.0f;
  b = warp_sum(b) / (float)C;
  G* dx = dinp + row * C;
  for (int i = lane; i < C; i += 32) {
    const float dn = ld(dy + i) * ld(weight + i);
    const float n = (ld(x + i) - m) * r;
    st(dx + i, ld(dx + i) + (dn - a - n * b) * r);
  }
}

// norm_partials_kernel: column c = blockIdx.x*128 + threadIdx.x of row
// chunk p = blockIdx.y sums dout*n (into scratch[p][c]) and, for
// LayerNorm, dout (into scratch[P + p][c]) over the chunk's rows in order.
template <typename X, typename G, bool kLN>
__global__ void __launch_bounds__(kColThreads)
    norm_partials_kernel(float* scratch, const G* dout, const X* inp, const float* mean, const float* rstd, int N,
                         int C, int chunkRows, int P) {
  const int c = blockIdx.x * kColThreads + threadIdx.x;
  if (c >= C) return;
  const int p = blockIdx.y;
  const long long r0 = (long long)p * chunkRows;
  const long long r1 = r0 + chunkRows < N ? r0 + chunkRows : N;
  float dw = 0.0f, db = 0.0f;
  for (long long r = r0; r < r1; r++) {
    const float dy = ld(dout + r * C + c);
    const float m = kLN ? mean[r] : 0.0f;
    dw += dy * ((ld(inp + r * C + c) - m) * rstd[r]);
    db += dy;
  }
  scratch[(size_t)p * C + c] = dw;
  if (kLN) scratch[(size_t)(P + p) * C + c] = db;
}

// norm_params_kernel: dweight[c] += the P partials of column c in chunk
// order (and dbias[c] for LayerNorm). W is the parameter gradients' type.
template <typename W, bool kLN>
__global__ void __launch_bounds__(kColThreads)
    norm_params_kernel(W* dweight, W* dbias, const float* scratch, int C, int P) {
  const int c = blockIdx.x * kColThreads + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int p = 0; p < P; p++) {
    dw += scratch[(size_t)p * C + c];
    if (kLN) db += scratch[(size_t)(P + p) * C + c];
  }
  st(dweight + c, ld(dweight + c) + dw);
  if (kLN) st(dbias + c, ld(dbias + c) + db);
}

// chunks is P, the number of partial column sums over N rows.
int chunks(int N) {
  const int p = (N + kMinChunkRows - 1) / kMinChunkRows;
  return p < kMaxChunks ? p : kMaxChunks;
}

unsigned row_blocks(int N) { return (unsigned)((N + kRowsPerBlock - 1) / kRowsPerBlock); }

template <typename X>
cudaError_t launch_layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                                     const void* bias, int N, int C, float eps, cudaStream_t stream) {
  auto kernel = layernorm_forward_kernel<X>;
  LSP_LAUNCH(kernel, dim3(row_blocks(N)), dim3(kRowThreads), 0, stream, (X*)out, mean, rstd, (const X*)inp,
             (const X*)weight, (const X*)bias, N, C, eps);
  return cudaGetLastError();
}

template <typename X>
cudaError_t launch_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C,
                                   float eps, cudaStream_t stream) {
  auto kernel = rmsnorm_forward_kernel<X>;
  LSP_LAUNCH(kernel, dim3(row_blocks(N)), dim3(kRowThreads), 0, stream, (X*)out, rstd, (const X*)inp,
             (const X*)weight, N, C, eps);
  return cudaGetLastError();
}

// launch_norm_backward enqueues the three backward kernels in order: X is
// the values' type, G the activation gradients', dw_bf16 picks the
// parameter gradients' (only the last kernel stores them).
template <typename X, typename G, bool kLN>
cudaError_t launch_norm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                 const void* weight, const float* mean, const float* rstd, float* scratch, int N,
                                 int C, int dw_bf16, cudaStream_t stream) {
  auto input = norm_backward_input_kernel<X, G, kLN>;
  LSP_LAUNCH(input, dim3(row_blocks(N)), dim3(kRowThreads), 0, stream, (G*)dinp, (const G*)dout, (const X*)inp,
             (const X*)weight, mean, rstd, N, C);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int P = chunks(N);
  const int chunkRows = (N + P - 1) / P;
  const unsigned colBlocks = (unsigned)((C + kColThreads - 1) / kColThreads);
  auto partials = norm_partials_kernel<X, G, kLN>;
  LSP_LAUNCH(partials, dim3(colBlocks, (unsigned)P), dim3(kColThreads), 0, stream, scratch, (const G*)dout,
             (const X*)inp, mean, rstd, N, C, chunkRows, P);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  if (dw_bf16) {
    auto params = norm_params_kernel<__nv_bfloat16, kLN>;
    LSP_LAUNCH(params, dim3(colBlocks), dim3(kColThreads), 0, stream, (__nv_bfloat16*)dweight,
               (__nv_bfloat16*)dbias, (const float*)scratch, C, P);
  } else {
    auto params = norm_params_kernel<float, kLN>;
    LSP_LAUNCH(params, dim3(colBlocks), dim3(kColThreads), 0, stream, (float*)dweight, (float*)dbias,
               (const float*)scratch, C, P);
  }
  return cudaGetLastError();
}

template <bool kLN>
cudaError_t dispatch_norm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                   const void* weight, const float* mean, const float* rstd, float* scratch, int N,
                                   int C, int x_bf16, int g_bf16, int dw_bf16, cudaStream_t stream) {
  typedef __nv_bfloat16 bf;
  if (x_bf16 && g_bf16)
    return launch_norm_backward<bf, bf, kLN>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C,
                                             dw_bf16, stream);
  if (x_bf16)
    return launch_norm_backward<bf, float, kLN>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N,
                                                C, dw_bf16, stream);
  if (g_bf16)
    return launch_norm_backward<float, bf, kLN>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N,
                                                C, dw_bf16, stream);
  return launch_norm_backward<float, float, kLN>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N,
                                                 C, dw_bf16, stream);
}

}  // namespace

extern "C" size_t lsp_layernorm_backward_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return (size_t)2 * chunks(N) * C * sizeof(float);
}

extern "C" size_t lsp_rmsnorm_backward_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return (size_t)chunks(N) * C * sizeof(float);
}

extern "C" cudaError_t lsp_layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                                             const void* weight, const void* bias, int N, int C, float eps,
                                             int x_bf16, cudaStream_t stream) {
  if (N < 0 || C <= 0 || lsp_bad_dtype(x_bf16)) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  if (out == nullptr || inp == nullptr || weight == nullptr || bias == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch_layernorm_forward<__nv_bfloat16>(out, mean, rstd, inp, weight, bias, N, C, eps, stream);
  return launch_layernorm_forward<float>(out, mean, rstd, inp, weight, bias, N, C, eps, stream);
}

extern "C" cudaError_t lsp_layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                              const void* inp, const void* weight, const float* mean,
                                              const float* rstd, float* scratch, int N, int C, int x_bf16,
                                              int g_bf16, int dw_bf16, cudaStream_t stream) {
  if (N < 0 || C <= 0 || lsp_bad_dtype(x_bf16) || lsp_bad_dtype(g_bf16) || lsp_bad_dtype(dw_bf16)) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  if (dinp == nullptr || dweight == nullptr || dbias == nullptr || dout == nullptr || inp == nullptr ||
      weight == nullptr || mean == nullptr || rstd == nullptr || scratch == nullptr)
    return cudaErrorInvalidValue;
  return dispatch_norm_backward<true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C, x_bf16,
                                      g_bf16, dw_bf16, stream);
}

extern "C" cudaError_t lsp_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N,
                                           int C, float eps, int x_bf16, cudaStream_t stream) {
  if (N < 0 || C <= 0 || lsp_bad_dtype(x_bf16)) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  if (out == nullptr || inp == nullptr || weight == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch_rmsnorm_forward<__nv_bfloat16>(out, rstd, inp, weight, N, C, eps, stream);
  return launch_rmsnorm_forward<float>(out, rstd, inp, weight, N, C, eps, stream);
}

extern "C" cudaError_t lsp_rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                                            const void* weight, const float* rstd, float* scratch, int N, int C,
                                            int x_bf16, int g_bf16, int dw_bf16, cudaStream_t stream) {
  if (N < 0 || C <= 0 || lsp_bad_dtype(x_bf16) || lsp_bad_dtype(g_bf16) || lsp_bad_dtype(dw_bf16)) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  if (dinp == nullptr || dweight == nullptr || dout == nullptr || inp == nullptr || weight == nullptr ||
      rstd == nullptr || scratch == nullptr)
    return cudaErrorInvalidValue;
  return dispatch_norm_backward<false>(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, scratch, N, C,
                                       x_bf16, g_bf16, dw_bf16, stream);
}
