/*
 * softmax_ce.cu: fused softmax + cross-entropy, forward loss and backward
 * dlogits in one kernel, with no stored probabilities.
 *
 * For each of N rows of logits z [N, V] with target t (int32 [N]):
 *
 *   losses[row] = logsumexp(z) - z[t]                        (fp32 [N])
 *   z <- scale * (softmax(z) - onehot(t))    when scale != 0 (in place)
 *
 * Rows with a negative target are ignored: loss 0 and, when scale != 0,
 * dlogits 0. With scale == 0 only the losses are computed and the logits
 * are not written. x_bf16 is the dtype of the logits (backend.DType: 0 fp32,
 * 1 bf16); the reference is the CPU backend's CrossEntropyForwardBackward
 * (train/cpu/ref_softmax_ce.go), with the same roundings (scale*p, then - scale at the
 * target), in fp32 where the CPU uses float64 for exp and the sum.
 *
 * How: one 256-thread block per row. Pass 1: each thread keeps an online
 * (max, sum of exp(z - max)) over its strided elements; the pairs are
 * merged by an xor-butterfly in each warp (the merge is commutative, so
 * every lane gets the same bits), the warps' pairs go through shared
 * memory (one barrier), and every thread merges them in warp order, so all
 * threads hold the same log-sum-exp. Pass 2 rereads the row (from L2) and
 * writes dlogits. Thread 0 reads z[t] before the barrier, so the in-place
 * writes, which all come after it, cannot clobber it first.
 *
 * Limits: N >= 0, V >= 1 (any V: 50257 is fine), N*V < 2^63. Targets >= V
 * cannot be reported from the device (the CPU backend returns an error):
 * their loss is NaN and their dlogits are scale * softmax (no one-hot), so
 * the fault shows in the loss instead of corrupting memory. Logits of
 * +Inf or NaN give NaN.
 */
#include "kernels.h"
#include "ldst.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// merge folds the online-softmax pair (m2, s2) into (m, s): the result is
// the same bits for (a, b) and (b, a).
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY) {  // both empty (or all -Inf): avoid -Inf - -Inf
    s = 0.0f;
  } else {
    s = s * expf(m - M) + s2 * expf(m2 - M);
  }
  m = M;
}

template <typename X>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(float* losses, X* logits, const int* targets, int V, float scale) {
  __shared__ float warpMax[kWarps], warpSum[kWarps];
  const long long row = blockIdx.x;
  X* z = logits + row * V;
  const int t = targets[row];
  if (t < 0) {  // ignored row (the whole block takes this branch)
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (scale != 0.0f)
      for (int i = threadIdx.x; i < V; i += kThreads) st(z + i, 0.0f);
    return;
  }
  const float zt = (threadIdx.x == 0 && t < V) ? ld(z + t) : 0.0f;
  float m = -INFINITY, s = 0.0f;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float x = ld(z + i);
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else if (m != -INFINITY) {
      s += expf(x - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  if (threadIdx.x % 32 == 0) {
    warpMax[threadIdx.x / 32] = m;
    warpSum[threadIdx.x / 32] = s;
  }
  __syncthreads();
  m = -INFINITY;
  s = 0.0f;
  for (int w = 0; w < kWarps; w++) merge(m, s, warpMax[w], warpSum[w]);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) losses[row] = t < V ? lse - zt : nanf("");
  if (scale == 0.0f) return;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    float d = scale * expf(ld(z + i) - lse);
    if (i == t) d -= scale;
    st(z + i, d);
  }
}

template <typename X>
cudaError_t launch(float* losses, void* logits, const int* targets, int N, int V, float scale, cudaStream_t stream) {
  auto kernel = cross_entropy_kernel<X>;
  LSP_LAUNCH(kernel, dim3((unsigned)N), dim3(kThreads), 0, stream, losses, (X*)logits, targets, V, scale);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t lsp_cross_entropy_forward_backward(float* losses, void* logits, const int* targets, int N,
                                                          int V, float scale, int x_bf16, cudaStream_t stream) {
  if (N < 0 || V <= 0 || lsp_bad_dtype(x_bf16)) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  if (losses == nullptr || logits == nullptr || targets == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch<__nv_bfloat16>(losses, logits, targets, N, V, scale, stream);
  return launch<float>(losses, logits, targets, N, V, scale, stream);
}
