/*
 * dense.cu: the dense fp32 products of the svd and gaussian projectors and
 * of GaLore (docs/DESIGN.md, "Projector kinds"), bit for bit the CPU
 * backend's DenseGemm and DenseApply (train/cpu/ref_dense.go).
 *
 * Row-major and packed, as lsp_gemm_bf16 (gemm.cu): op(A) is M x K, op(B)
 * is K x N, the output M x N (ld N).
 *   A: transA == 0: [M][K]    transA != 0: [K][M]
 *   B: transB == 0: [K][N]    transB != 0: [N][K]
 * Every output (i, j) is one sum over k ascending from +0,
 *   sum = (...((+0 + a(i,0) b(0,j)) + a(i,1) b(1,j)) + ...) + a(i,K-1) b(K-1,j)
 * each product rounded to fp32 before its add (__fmul_rn, __fadd_rn: never
 * contracted into an FMA), then
 *   lsp_dense_gemm   C[i,j] = fl(alpha*sum) + fl(beta*C[i,j])   C fp32 [M, N]
 *                    (beta == 0: C[i,j] = fl(alpha*sum), C not read: NaNs
 *                    there are ignored); A and B fp32 or bf16 each
 *                    (a_bf16, b_bf16: 0 fp32, 1 bf16), bf16 widened
 *                    exactly at load.
 *   lsp_dense_apply  W[i,j] <- store(fl(decay*W[i,j]) + fl(alpha*sum))
 *                    W [M, N]; A and B fp32; W fp32 (w_bf16 0: written
 *                    exactly) or bf16 (1: stochastic rounding keyed by
 *                    (seed, step, matrix, element i*N + j), lsp_sparse_apply's
 *                    rounding, rounding.cuh). skip (fp32 [1] on the device,
 *                    NULL: never): when skip[0] != 0 every block returns at
 *                    once and W is not written (a step whose loss is not
 *                    finite, adam.cu).
 *
 * How: one kernel template for both (dense_kernel<TA, TB, Out>): the
 * tiled product, then the epilogue Out (GemmOut or ApplyOut<W's type>)
 * applied to each finished sum. A 256-thread block owns a 64 x 64 tile of
 * the output, each thread 4 x 4 outputs (rows ty + 16i, columns tx + 16j,
 * tx, ty < 16), kept in registers (tile.cuh, which sparse.cu's S
 * shares). K advances in slices of 16: each slice of op(A) (64 x 16) and
 * op(B) (16 x 64) is staged in shared memory as fp32, 4 values per thread,
 * read along the operand's contiguous dimension (coalesced for either
 * transpose), zero past M, N or K; then every thread adds the slice's 16
 * products to each of its 16 sums in k order. The
 * zeros past K add +0 to a sum that started at +0 and so is never -0: the
 * sum is unchanged, which keeps ragged K exact. Loads and stores are
 * bounds-checked: any M, N, K >= 1 works. The same order on every device:
 * the simulator and a GPU give the CPU's bits (non-contracted fp32).
 *
 * Cost: SIMT fp32, a product and an add per term (no FMA, no tensor
 * cores), so about half the FMA peak of fp32 at best; meant for the dense
 * projectors' products (d of a few hundred to a few thousand), not for the
 * model's GEMMs (gemm.cu). Shared memory: 2 x 16 x 65 floats (8320 bytes)
 * per block, static. ptxas (CUDA 11.8): 75-78 registers a thread on
 * sm_80, 80 on sm_90, 0 bytes stack frame, no spills; no FFMA in the SASS.
 *
 * Limits: M, N, K >= 1; ceil(M/64) <= 65535 (grid y); the output must not
 * overlap A or B. sm_80 or newer like every kernel. Deterministic: each
 * output is summed by one thread in a fixed order, no atomics.
 */
#include "kernels.h"
#include "rounding.cuh"
#include "tile.cuh"

#include <stdint.h>

namespace {

constexpr int kSlice = 16;  // K per shared-memory stage
constexpr int kPerThread = kTile * kSlice / kTileThreads;  // staged values per thread and operand
static_assert(kPerThread * kTileThreads == kTile * kSlice, "a slice must split evenly over the threads");

// A stage: s[kk][r] = op(X)(r0 + r, k0 + kk); the +1 spreads the stores
// of a row-major operand over the banks.
using Stage = float[kSlice][kTile + 1];

// stage_slice loads rows r0.. r0+63 and k0.. k0+15 of an operand with R
// rows (M for op(A), N for op(B)^T) and K columns, stored row-major ([R][K])
// or, kmajor, [K][R]; 0 outside. Consecutive threads read consecutive
// addresses in either storage.
template <typename T>
__device__ __forceinline__ void stage_slice(Stage& s, const T* __restrict__ x, bool kmajor, int R, int K, int r0,
                                            int k0) {
#pragma unroll
  for (int q = 0; q < kPerThread; q++) {
    const int e = q * kTileThreads + threadIdx.x;
    const int r = kmajor ? e % kTile : e / kSlice;
    const int kk = kmajor ? e / kTile : e % kSlice;
    const int gr = r0 + r, gk = k0 + kk;
    float v = 0.0f;
    if (gr < R && gk < K) v = lsp_ld(x + (kmajor ? (long long)gk * R + gr : (long long)gr * K + gk));
    s[kk][r] = v;
  }
}

// GemmOut: C[i,j] = fl(alpha*sum) + fl(beta*C[i,j]); beta 0 reads no C.
struct GemmOut {
  float* C;
  int N;
  float alpha, beta;
  __device__ __forceinline__ bool skipped() const { return false; }
  __device__ __forceinline__ void operator()(int i, int j, float sum) const {
    float* c = C + (long long)i * N + j;
    const float x = __fmul_rn(alpha, sum);
    *c = beta == 0.0f ? x : __fadd_rn(x, __fmul_rn(beta, *c));
  }
};

// ApplyOut: W[i,j] <- store(fl(decay*W[i,j]) + fl(alpha*sum)); Wt is
// float or uint16_t (bf16 bits, stochastic rounding under key).
template <typename Wt>
struct ApplyOut {
  Wt* W;
  const float* skip;  // NULL: never skip
  int N;
  float alpha, decay;
  uint64_t key;
  __device__ __forceinline__ bool skipped() const { return skip != nullptr && *skip != 0.0f; }
  __device__ __forceinline__ void operator()(int i, int j, float sum) const {
    const long long w = (long long)i * N + j;
    lsp_store_w(W, w, __fadd_rn(__fmul_rn(decay, lsp_ld(W + w)), __fmul_rn(alpha, sum)), key);
  }
};

// dense_kernel: out(i, j) of the block's 64 x 64 tile = the sum over k
// ascending of fl(op(A)[i,k] op(B)[k,j]), handed to out. TA and TB are
// float or uint16_t (bf16 bits).
template <typename TA, typename TB, typename Out>
__global__ void __launch_bounds__(kTileThreads)
    dense_kernel(const TA* __restrict__ A, const TB* __restrict__ B, int transA, int transB, int M, int N, int K,
                 Out out) {
  if (out.skipped()) return;  // uniform over the grid, before any barrier
  __shared__ Stage As;  // As[kk][r] = op(A)[m0 + r, k0 + kk]
  __shared__ Stage Bs;  // Bs[kk][c] = op(B)[k0 + kk, n0 + c]
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  float acc[4][4];
  lsp_tile_zero(acc);
  for (int k0 = 0; k0 < K; k0 += kSlice) {
    // op(A) is [M][K] unless transA; op(B)^T is [N][K] only when transB.
    stage_slice(As, A, transA != 0, M, K, m0, k0);
    stage_slice(Bs, B, transB == 0, N, K, n0, k0);
    __syncthreads();  // the slice is staged
    lsp_tile_slice<true>(acc, As, Bs);
    __syncthreads();  // the slice is consumed before the next overwrites it
  }
  lsp_tile_store(acc, m0, n0, M, N, out);
}

// bad_dims: sizes the kernel does not take (see Limits).
bool bad_dims(int M, int N, int K) { return M < 1 || N < 1 || K < 1 || (M + kTile - 1) / kTile > 65535; }

dim3 dense_grid(int M, int N) { return dim3((N + kTile - 1) / kTile, (M + kTile - 1) / kTile); }

// launch_dense enqueues dense_kernel<TA, TB, Out>.
template <typename TA, typename TB, typename Out>
cudaError_t launch_dense(int transA, int transB, int M, int N, int K, const void* A, const void* B, Out out,
                         cudaStream_t stream) {
  auto kernel = dense_kernel<TA, TB, Out>;
  LSP_LAUNCH(kernel, dense_grid(M, N), dim3(kTileThreads), 0, stream, static_cast<const TA*>(A),
             static_cast<const TB*>(B), transA, transB, M, N, K, out);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t lsp_dense_gemm(int transA, int transB, int M, int N, int K, float alpha, const void* A,
                                      int a_bf16, const void* B, int b_bf16, float beta, float* C,
                                      cudaStream_t stream) {
  if (A == nullptr || B == nullptr || C == nullptr || bad_dims(M, N, K) || lsp_bad_dtype(a_bf16) ||
      lsp_bad_dtype(b_bf16))
    return cudaErrorInvalidValue;
  const GemmOut out{C, N, alpha, beta};
  if (a_bf16) {
    if (b_bf16) return launch_dense<uint16_t, uint16_t>(transA, transB, M, N, K, A, B, out, stream);
    return launch_dense<uint16_t, float>(transA, transB, M, N, K, A, B, out, stream);
  }
  if (b_bf16) return launch_dense<float, uint16_t>(transA, transB, M, N, K, A, B, out, stream);
  return launch_dense<float, float>(transA, transB, M, N, K, A, B, out, stream);
}

extern "C" cudaError_t lsp_dense_apply(int transA, int transB, int M, int N, int K, float alpha, const float* A,
                                       const float* B, float decay, void* W, int w_bf16, const float* skip,
                                       unsigned long long seed, unsigned long long step, unsigned int matrix,
                                       cudaStream_t stream) {
  if (A == nullptr || B == nullptr || W == nullptr || bad_dims(M, N, K) || lsp_bad_dtype(w_bf16))
    return cudaErrorInvalidValue;
  const uint64_t key = lsp_sr_key(seed, step, matrix);
  if (w_bf16) {
    const ApplyOut<uint16_t> out{static_cast<uint16_t*>(W), skip, N, alpha, decay, key};
    return launch_dense<float, float>(transA, transB, M, N, K, A, B, out, stream);
  }
  const ApplyOut<float> out{static_cast<float*>(W), skip, N, alpha, decay, key};
  return launch_dense<float, float>(transA, transB, M, N, K, A, B, out, stream);
}
