/*
 * fit.cu: the one product of the projector fit (docs/DESIGN.md,
 * "Learning the projectors"; train/lsp/devicefit.go) that no other kernel
 * computes: the bias objective's gradient gathered at a sparse projector's
 * positions. X [rows, d] is in row storage (idx[rows*r] int32, val[rows*r]
 * fp32); for entry e = i*r + s at column a = idx[e]
 *
 *   g = sum_b Y(i,b) M(a,b)          b ascending from 0 (none when Y == NULL)
 *   g += val[t] * K[idx[t]*d + a]    row i's entries t ascending
 *   out[e] = w*g, or out[e] += w*g when accumulate
 *
 * with Y(i,b) = Y[i*d + b], M(a,b) = M[a*d + b] (Y [rows, d]: the gradient
 * in P's values, Y = G Q) or, when trans, Y(i,b) = Y[b*rows + i],
 * M(a,b) = M[b*d + a] (Y [d, rows]: in Q's values, Y = P^T G). M, K
 * [d, d]. Semantics and order are the CPU backend's (train/cpu/ref_fit.go).
 *
 * How: one warp per row i (WARPS rows per block); the warp's lanes split
 * nothing, each lane owns entries s = lane, lane + 32, ... of the row and
 * sums its d + r terms alone in the fixed order, so every output is one
 * thread's plain fp32 sum, non-contracted (__fmul_rn, __fadd_rn) so that
 * the device matches the CPU op bit for bit. With trans the lanes read Y's
 * column i (stride rows): fine for the fit's sizes (d <= a few thousand,
 * run once per check), not a streaming kernel.
 *
 * Limits: rows, d >= 1, 1 <= r <= d, rows*r < 2^31; indices trusted
 * (train/cpu CheckSparseRows). Deterministic, no atomics. sm_80 or newer.
 */
#include "kernels.h"

#include <stdint.h>

namespace {

constexpr int kVWarps = 4;  // rows per block

__global__ void __launch_bounds__(kVWarps * 32)
    sparse_value_grad_kernel(float* __restrict__ out, const float* __restrict__ Y, const float* __restrict__ M,
                             const float* __restrict__ K, const int32_t* __restrict__ idx,
                             const float* __restrict__ val, int rows, int d, int r, float w, int trans,
                             int accumulate) {
  const int i = blockIdx.x * kVWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= rows) return;
  const long long row = (long long)i * r;
  for (int s = lane; s < r; s += 32) {
    const long long e = row + s;
    const int a = idx[e];
    float g = 0.0f;
    if (Y != nullptr) {
      if (trans) {
        for (int b = 0; b < d; b++) g = __fadd_rn(g, __fmul_rn(Y[(long long)b * rows + i], M[(long long)b * d + a]));
      } else {
        const float* yi = Y + (long long)i * d;
        const float* ma = M + (long long)a * d;
        for (int b = 0; b < d; b++) g = __fadd_rn(g, __fmul_rn(yi[b], ma[b]));
      }
    }
    for (int t = 0; t < r; t++) g = __fadd_rn(g, __fmul_rn(val[row + t], K[(long long)idx[row + t] * d + a]));
    const float wg = __fmul_rn(w, g);
    out[e] = accumulate ? __fadd_rn(out[e], wg) : wg;
  }
}

}  // namespace

extern "C" cudaError_t lsp_sparse_value_grad(float* out, const float* Y, const float* M, const float* K,
                                             const int* idx, const float* val, int rows, int d, int r, float w,
                                             int trans, int accumulate, cudaStream_t stream) {
  if (out == nullptr || K == nullptr || idx == nullptr || val == nullptr || (Y != nullptr && M == nullptr) ||
      rows < 1 || d < 1 || r < 1 || r > d || (long long)rows * r > INT32_MAX)
    return cudaErrorInvalidValue;
  const int blocks = (rows + kVWarps - 1) / kVWarps;
  LSP_LAUNCH(sparse_value_grad_kernel, dim3(blocks), dim3(kVWarps * 32), 0, stream, out, Y, M, K, idx, val, rows, d,
             r, w, trans, accumulate);
  return cudaGetLastError();
}
