/*
 * cast.cu: dtype casts, stochastic rounding and gradient norms.
 *
 *   lsp_cast_f32_to_bf16       out[i] = RNE(in[i])         n elements
 *   lsp_cast_bf16_to_f32       out[i] = in[i] (exact)
 *       (the CPU backend's CopyD2D between fp32 and bf16, bit for bit,
 *       NaN included: RNE is train/bf16 FromFloat32, see rounding.cuh)
 *   lsp_stochastic_round_bf16  out[i] = SR(in[i]) with the bits of element
 *       i of (seed, step, matrix) (train/cpu StochasticRoundBF16Slice, bit
 *       for bit; the same bits lsp_sparse_apply uses for element i)
 *   lsp_sum_squares            out[0] = sum of x[i]^2 (x fp32 or bf16) as
 *       fp32, the CPU backend's SumSquares (train/cpu/ref_cast.go, as the
 *       casts and stochastic rounding). Two passes, no atomics: G
 *       blocks (G depends on n only: min(1024, ceil(n/2048))) each sum a
 *       fixed grid-stride subset in double per thread, reduce the block
 *       with warp shuffles and one shared-memory step, and write work[b];
 *       one block then reduces work[0..G) the same way. The order is fixed
 *       by n, so results are reproducible; they differ from the CPU's
 *       (sequential float64 chunks) only in float64 rounding, far below
 *       the final fp32 rounding.
 *
 * Limits: n >= 0 (0 casts nothing; the sum of nothing is 0); work holds
 * LSP_SUM_SQUARES_WORK (1024) doubles; out must not overlap in or work.
 * Elementwise kernels use a grid-stride loop over at most 65536 blocks.
 */
#include "kernels.h"
#include "rounding.cuh"

#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 1 << 16;
constexpr int kSumBlocks = LSP_SUM_SQUARES_WORK;  // most blocks of pass 1
constexpr int kSumPerThread = 8;                  // fewest elements a thread of pass 1 reads

dim3 grid_for(long long n) {
  long long b = (n + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned int>(b < kMaxBlocks ? b : kMaxBlocks));
}

__global__ void __launch_bounds__(kThreads) f32_to_bf16_kernel(uint16_t* __restrict__ out,
                                                               const float* __restrict__ in, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads)
    out[i] = lsp_f32_to_bf16_rne(in[i]);
}

__global__ void __launch_bounds__(kThreads) bf16_to_f32_kernel(float* __restrict__ out,
                                                               const uint16_t* __restrict__ in, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads)
    out[i] = lsp_bf16_to_f32(in[i]);
}

__global__ void __launch_bounds__(kThreads) sr_kernel(uint16_t* __restrict__ out, const float* __restrict__ in,
                                                      long long n, uint64_t key) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads)
    out[i] = lsp_f32_to_bf16_sr(in[i], lsp_sr_bits(key, static_cast<uint64_t>(i)));
}

// block_sum returns the sum of s over the block (256 threads) in a fixed
// tree order, valid in thread 0.
__device__ double block_sum(double s) {
  __shared__ double warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = s;
  __syncthreads();  // the warp sums are visible to warp 0
  if (warp == 0) {
    s = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  return s;
}

template <bool BF16>
__global__ void __launch_bounds__(kThreads) sum_squares_partial_kernel(double* __restrict__ work,
                                                                       const void* __restrict__ x, long long n) {
  double s = 0.0;
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    const double v = BF16 ? lsp_bf16_to_f32(static_cast<const uint16_t*>(x)[i])
                          : static_cast<const float*>(x)[i];
    s += v * v;  // exact in double; an FMA here is exact too
  }
  s = block_sum(s);
  if (threadIdx.x == 0) work[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads) sum_squares_final_kernel(float* __restrict__ out,
                                                                     const double* __restrict__ work, int parts) {
  double s = 0.0;
  for (int i = threadIdx.x; i < parts; i += kThreads) s += work[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = static_cast<float>(s);
}

}  // namespace

extern "C" cudaError_t lsp_cast_f32_to_bf16(__nv_bfloat16* out, const float* in, long long n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (out == nullptr || in == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  LSP_LAUNCH(f32_to_bf16_kernel, grid_for(n), dim3(kThreads), 0, stream, reinterpret_cast<uint16_t*>(out), in, n);
  return cudaGetLastError();
}

extern "C" cudaError_t lsp_cast_bf16_to_f32(float* out, const __nv_bfloat16* in, long long n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (out == nullptr || in == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  LSP_LAUNCH(bf16_to_f32_kernel, grid_for(n), dim3(kThreads), 0, stream, out, reinterpret_cast<const uint16_t*>(in),
             n);
  return cudaGetLastError();
}

extern "C" cudaError_t lsp_stochastic_round_bf16(__nv_bfloat16* out, const float* in, long long n,
                                                 unsigned long long seed, unsigned long long step,
                                                 unsigned int matrix, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (out == nullptr || in == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const uint64_t key = lsp_sr_key(seed, step, matrix);
  LSP_LAUNCH(sr_kernel, grid_for(n), dim3(kThreads), 0, stream, reinterpret_cast<uint16_t*>(out), in, n, key);
  return cudaGetLastError();
}

extern "C" cudaError_t lsp_sum_squares(float* out, const void* x, int x_bf16, long long n, double* work,
                                       cudaStream_t stream) {
  if (out == nullptr || work == nullptr || n < 0 || (n > 0 && x == nullptr) || lsp_bad_dtype(x_bf16))
    return cudaErrorInvalidValue;
  long long g = (n + kThreads * kSumPerThread - 1) / (kThreads * kSumPerThread);
  if (g > kSumBlocks) g = kSumBlocks;
  if (g < 1) g = 1;  // n == 0: one block writes work[0] = 0
  if (x_bf16) {
    auto k = sum_squares_partial_kernel<true>;
    LSP_LAUNCH(k, dim3(static_cast<unsigned int>(g)), dim3(kThreads), 0, stream, work, x, n);
  } else {
    auto k = sum_squares_partial_kernel<false>;
    LSP_LAUNCH(k, dim3(static_cast<unsigned int>(g)), dim3(kThreads), 0, stream, work, x, n);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  LSP_LAUNCH(sum_squares_final_kernel, dim3(1), dim3(kThreads), 0, stream, out, work, static_cast<int>(g));
  return cudaGetLastError();
}
