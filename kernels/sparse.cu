/*
 * sparse.cu: the LSP sparse projection (docs/DESIGN.md, "LSP as
 * implemented") without ever forming the dense projectors P (m x d) or
 * Q (n x d), with no atomics.
 *
 * A linear layer y = x W has W [m, n] (m = in, n = out) and gradient
 * G = X^T dY over BT tokens. P and Q are (d,r)-sparse: each row has exactly
 * r non-zeros at distinct columns, stored twice:
 *   by row     idx[rows*r] int32, val[rows*r] fp32 (row i at [i*r, (i+1)*r))
 *   by column  colptr[d+1], rowidx[nnz], colval[nnz] int32/int32/fp32, the
 *              entries of column a at [colptr[a], colptr[a+1]) with rowidx
 *              STRICTLY ASCENDING (the compress kernels walk rows in chunks
 *              and rely on it; train/cpu CheckSparseColumns validates it).
 *
 *   compress A  A [d, BT] = P^T X^T     A[a,t] = sum_k colval[k] X[t, rowidx[k]]
 *   compress B  B [BT, d] = dY Q        B[t,a] = sum_k colval[k] dY[t, rowidx[k]]
 *               (X [BT, m], dY [BT, n] fp32 or bf16; A, B fp32; column
 *               storage; k over column a's entries in order)
 *   S           S [d, d] (+)= A B       summed over t ascending from 0 in fp32,
 *               then added to S (accumulate != 0: micro-batches sum) or written
 *   apply       W <- (1 - lr*wd) W + P Delta Q^T, Delta [d, d] fp32, W [m, n]
 *               fp32 or bf16: first T [d, n] = Delta Q^T (T[a,j] = sum over
 *               row j's entries s of Delta[a, qidx] * qval, row storage of
 *               Q), then x = decay * W[i,j] + sum over row i's entries s of
 *               pval * T[pidx, j] (row storage of P), stored as it is in an
 *               fp32 W and by stochastic rounding in a bf16 W, SR keyed by
 *               (seed, step, matrix, element i*n + j), see rounding.cuh.
 *               skip (fp32 [1] on the device, may be NULL): when skip[0]
 *               != 0 both kernels return at once and neither T nor W is
 *               written (a step whose loss is not finite, adam.cu).
 *
 * Storage: the launchers take the dtype of X (x_bf16), dY (dy_bf16) and W
 * (w_bf16) as backend.DType values (0 fp32, 1 bf16), like the norms
 * launchers: the model feeds model-dtype activations and weights and fp32
 * activation gradients. bf16 is widened exactly at load, so both dtypes
 * share every summation order; only the store of W differs. Semantics are
 * those of the CPU backend's ops (train/cpu/ops_sparse.go), whose bf16 case
 * is train/cpu/ref_sparse.go.
 *
 * How:
 *   compress: a block owns kCT = 8 tokens and 128 columns (one per thread);
 *     it stages the tokens' rows of X through shared memory in chunks of
 *     kCM = 1024 inputs (32 KiB fp32, whatever X's dtype), and each thread
 *     walks its column's entries that fall in the chunk, keeping 8 fp32 sums
 *     in registers. X is read once per 128 columns; the gathers hit shared
 *     memory.
 *   S: a 256-thread block owns a 64 x 64 tile of S, each thread 4 x 4
 *     entries (rows ty + 16i, columns tx + 16j: tile.cuh's register tile,
 *     which dense.cu shares), with A and B staged through
 *     shared memory 16 tokens at a time (zero-filled past BT: adding +-0 to
 *     a sum leaves it unchanged, so the sum is the plain one over t).
 *   apply: T is one thread per (a, j); W is one thread per (i, j), rows
 *     striding by gridDim.y. Both use non-contracted fp32 (rounding.cuh), so
 *     apply matches the CPU op bit for bit on the device too, in either
 *     dtype of W; compress and S may be FMA-contracted by nvcc (they match
 *     the CPU op bit for bit in the simulator, to rounding on a GPU).
 *
 * Limits: BT, m, n, d >= 1, 1 <= r <= d, d <= 65535 and ceil(BT/8) <=
 * 2^31-1; m*r and n*r below 2^31 (int32 indices); T holds d*n floats; W
 * must not overlap T, Delta or the projectors. sm_80 or newer.
 * Deterministic: every output is summed by one thread in a fixed order.
 */
#include "kernels.h"
#include "rounding.cuh"
#include "tile.cuh"

#include <stdint.h>

namespace {

// ---------------------------------------------------------------- compress

constexpr int kCT = 8;          // tokens per block
constexpr int kCM = 1024;       // inputs (rows of P or Q) staged per chunk
constexpr int kCThreads = 128;  // columns per block

// out[a*sa + t*st] = sum over column a's entries of colval * x[t, rowidx];
// X is float or uint16_t (bf16 bits).
template <typename X>
__global__ void __launch_bounds__(kCThreads)
    sparse_gather_kernel(float* __restrict__ out, const X* __restrict__ x,
                         const int32_t* __restrict__ colptr, const int32_t* __restrict__ rowidx,
                         const float* __restrict__ colval, int BT, int rows, int d, long long sa, long long st) {
  __shared__ float xs[kCT][kCM];
  const int t0 = blockIdx.x * kCT;
  const int nt = min(kCT, BT - t0);
  const int a = blockIdx.y * kCThreads + threadIdx.x;
  int k = 0, kend = 0;
  if (a < d) {
    k = __ldg(colptr + a);
    kend = __ldg(colptr + a + 1);
  }
  float acc[kCT];
#pragma unroll
  for (int tt = 0; tt < kCT; tt++) acc[tt] = 0.0f;

  for (int c0 = 0; c0 < rows; c0 += kCM) {
    const int cn = min(kCM, rows - c0);
    // Stage rows t0..t0+kCT of x, inputs c0..c0+cn (0 past BT).
    for (int tt = 0; tt < kCT; tt++) {
      const X* src = x + (long long)(t0 + tt) * rows + c0;
      for (int c = threadIdx.x; c < cn; c += kCThreads) xs[tt][c] = tt < nt ? lsp_ld(src + c) : 0.0f;
    }
    __syncthreads();  // the chunk is staged
    const int cend = c0 + cn;
    for (; k < kend; k++) {
      const int i = __ldg(rowidx + k);
      if (i >= cend) break;  // ascending: the rest lies in later chunks
      const float v = __ldg(colval + k);
      const int ci = i - c0;
#pragma unroll
      for (int tt = 0; tt < kCT; tt++) acc[tt] += v * xs[tt][ci];
    }
    __syncthreads();  // everyone is done with the chunk before it is overwritten
  }
  if (a < d) {
    for (int tt = 0; tt < nt; tt++) out[a * sa + (long long)(t0 + tt) * st] = acc[tt];
  }
}

// launch_gather checks the arguments of both compress launchers and
// enqueues the gather for x's dtype (x_bf16: 0 fp32, 1 bf16).
cudaError_t launch_gather(float* out, const void* x, const int32_t* colptr, const int32_t* rowidx,
                          const float* colval, int BT, int rows, int d, long long sa, long long st, int x_bf16,
                          cudaStream_t stream) {
  if (out == nullptr || x == nullptr || colptr == nullptr || rowidx == nullptr || colval == nullptr || BT < 1 ||
      rows < 1 || d < 1 || d > 65535 * kCThreads || lsp_bad_dtype(x_bf16))
    return cudaErrorInvalidValue;
  const dim3 grid((BT + kCT - 1) / kCT, (d + kCThreads - 1) / kCThreads);
  if (x_bf16) {
    auto kernel = sparse_gather_kernel<uint16_t>;
    LSP_LAUNCH(kernel, grid, dim3(kCThreads), 0, stream, out, static_cast<const uint16_t*>(x), colptr, rowidx,
               colval, BT, rows, d, sa, st);
  } else {
    auto kernel = sparse_gather_kernel<float>;
    LSP_LAUNCH(kernel, grid, dim3(kCThreads), 0, stream, out, static_cast<const float*>(x), colptr, rowidx,
               colval, BT, rows, d, sa, st);
  }
  return cudaGetLastError();
}

// ----------------------------------------------------------------------- S

constexpr int kSK = 16;  // tokens per stage; the tile is tile.cuh's (64 x 64, 256 threads)

// S[a,b] (+)= sum_t A[a,t] B[t,b] for the block's 64 x 64 tile.
__global__ void __launch_bounds__(kTileThreads)
    sparse_s_kernel(float* __restrict__ S, const float* __restrict__ A, const float* __restrict__ B, int BT, int d,
                    int accumulate) {
  __shared__ float As[kSK][kTile + 1];  // As[k][a] = A[a0+a, t0+k]; +1 spreads the transposed stores over banks
  __shared__ float Bs[kSK][kTile];      // Bs[k][b] = B[t0+k, b0+b]
  const int a0 = blockIdx.y * kTile, b0 = blockIdx.x * kTile;
  float acc[4][4];
  lsp_tile_zero(acc);
  for (int t0 = 0; t0 < BT; t0 += kSK) {
    // 64 x 16 floats of each operand, 4 per thread, coalesced along the
    // contiguous dimension (t for A, b for B).
#pragma unroll
    for (int e = threadIdx.x; e < kTile * kSK; e += kTileThreads) {
      const int ar = e / kSK, ak = e % kSK;
      const int ga = a0 + ar, gt = t0 + ak;
      As[ak][ar] = (ga < d && gt < BT) ? A[(long long)ga * BT + gt] : 0.0f;
      const int bk = e / kTile, bc = e % kTile;
      const int gb = b0 + bc, gu = t0 + bk;
      Bs[bk][bc] = (gb < d && gu < BT) ? B[(long long)gu * d + gb] : 0.0f;
    }
    __syncthreads();  // the stage is loaded
    lsp_tile_slice<false>(acc, As, Bs);
    __syncthreads();  // the stage is consumed before the next overwrites it
  }
  lsp_tile_store(acc, a0, b0, d, d, [=](int a, int b, float sum) {
    float* s = S + (long long)a * d + b;
    *s = accumulate ? sum + *s : sum;
  });
}

// ------------------------------------------------------------------- apply

constexpr int kAThreads = 256;

// T[a, j] = sum over row j's entries s of Delta[a, qidx[j*r+s]] * qval[j*r+s].
__global__ void __launch_bounds__(kAThreads)
    sparse_t_kernel(float* __restrict__ T, const float* __restrict__ Delta, const int32_t* __restrict__ qidx,
                    const float* __restrict__ qval, const float* __restrict__ skip, int n, int d, int r) {
  if (skip != nullptr && *skip != 0.0f) return;
  const int j = blockIdx.x * kAThreads + threadIdx.x;
  const int a = blockIdx.y;
  if (j >= n) return;
  const float* da = Delta + (long long)a * d;
  const long long e = (long long)j * r;
  float acc = 0.0f;
  for (int s = 0; s < r; s++) acc = __fadd_rn(acc, __fmul_rn(__ldg(da + __ldg(qidx + e + s)), __ldg(qval + e + s)));
  T[(long long)a * n + j] = acc;
}

// W[i, j] = store(decay * W[i, j] + sum over row i's entries of pval *
// T[pidx, j]); Wt is float or uint16_t (bf16 bits).
template <typename Wt>
__global__ void __launch_bounds__(kAThreads)
    sparse_w_kernel(Wt* __restrict__ W, const float* __restrict__ T, const int32_t* __restrict__ pidx,
                    const float* __restrict__ pval, const float* __restrict__ skip, int m, int n, int r, float lr,
                    float wd, uint64_t key) {
  if (skip != nullptr && *skip != 0.0f) return;
  const int j = blockIdx.x * kAThreads + threadIdx.x;
  if (j >= n) return;
  const float decay = __fsub_rn(1.0f, __fmul_rn(lr, wd));
  for (int i = blockIdx.y; i < m; i += gridDim.y) {
    const long long e = (long long)i * r;
    float upd = 0.0f;
    for (int s = 0; s < r; s++)
      upd = __fadd_rn(upd, __fmul_rn(__ldg(pval + e + s), __ldg(T + (long long)__ldg(pidx + e + s) * n + j)));
    const long long w = (long long)i * n + j;
    lsp_store_w(W, w, __fadd_rn(__fmul_rn(decay, lsp_ld(W + w)), upd), key);
  }
}

}  // namespace

extern "C" cudaError_t lsp_sparse_compress_a(float* A, const void* X, const int* colptr, const int* rowidx,
                                             const float* colval, int BT, int m, int d, int x_bf16,
                                             cudaStream_t stream) {
  return launch_gather(A, X, colptr, rowidx, colval, BT, m, d, BT, 1, x_bf16, stream);
}

extern "C" cudaError_t lsp_sparse_compress_b(float* B, const void* dY, const int* colptr, const int* rowidx,
                                             const float* colval, int BT, int n, int d, int dy_bf16,
                                             cudaStream_t stream) {
  return launch_gather(B, dY, colptr, rowidx, colval, BT, n, d, 1, d, dy_bf16, stream);
}

extern "C" cudaError_t lsp_sparse_s(float* S, const float* A, const float* B, int BT, int d, int accumulate,
                                    cudaStream_t stream) {
  if (S == nullptr || A == nullptr || B == nullptr || BT < 1 || d < 1 || d > 65535 * kTile)
    return cudaErrorInvalidValue;
  const dim3 grid((d + kTile - 1) / kTile, (d + kTile - 1) / kTile);
  LSP_LAUNCH(sparse_s_kernel, grid, dim3(kTileThreads), 0, stream, S, A, B, BT, d, accumulate);
  return cudaGetLastError();
}

extern "C" cudaError_t lsp_sparse_apply(void* W, float* T, const float* Delta, const int* pidx, const float* pval,
                                        const int* qidx, const float* qval, const float* skip, int m, int n, int d,
                                        int r, float lr, float wd, unsigned long long seed, unsigned long long step,
                                        unsigned int matrix, int w_bf16, cudaStream_t stream) {
  if (W == nullptr || T == nullptr || Delta == nullptr || pidx == nullptr || pval == nullptr || qidx == nullptr ||
      qval == nullptr || m < 1 || n < 1 || d < 1 || d > 65535 || r < 1 || r > d ||
      (long long)m * r > INT32_MAX || (long long)n * r > INT32_MAX || lsp_bad_dtype(w_bf16))
    return cudaErrorInvalidValue;
  const int cols = (n + kAThreads - 1) / kAThreads;
  LSP_LAUNCH(sparse_t_kernel, dim3(cols, d), dim3(kAThreads), 0, stream, T, Delta, qidx, qval, skip, n, d, r);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const uint64_t key = lsp_sr_key(seed, step, matrix);
  const dim3 grid(cols, m < 65535 ? m : 65535);
  if (w_bf16) {
    auto kernel = sparse_w_kernel<uint16_t>;
    LSP_LAUNCH(kernel, grid, dim3(kAThreads), 0, stream, static_cast<uint16_t*>(W), T, pidx, pval, skip, m, n, r, lr,
               wd, key);
  } else {
    auto kernel = sparse_w_kernel<float>;
    LSP_LAUNCH(kernel, grid, dim3(kAThreads), 0, stream, static_cast<float*>(W), T, pidx, pval, skip, m, n, r, lr,
               wd, key);
  }
  return cudaGetLastError();
}
