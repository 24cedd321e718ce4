/*
 * adam.cu: AdamW on the device, the CPU backend's AdamW op (its
 * reference cpu.AdamW, train/cpu/ref_adam.go) step for step, and the
 * non-finite flag that skips a step (cpu.NonFiniteFlag, the same file).
 *
 *   g  = grad * gscale         gscale = min(1, max_norm / (sqrt(sum_sq[0]) + 1e-6))
 *                              when max_norm > 0 (sum_sq read on the device,
 *                              the ratio in double; torch's clip_grad_norm_
 *                              and the host Adam add the same 1e-6), else 1
 *   m  = beta1 m + (1 - beta1) g
 *   v  = beta2 v + (1 - beta2) g g
 *   w  = w (1 - lr wd) - step_size m / (sqrt(v) / sqrt(bc2) + eps)
 *        step_size = lr / bc1, bc_i = 1 - beta_i^step (double, on the host)
 *
 * w is the fp32 master when master != NULL (then param receives a copy, or
 * its round to nearest even when param is bf16), else param itself (bf16
 * widened, updated, rounded to nearest even). grad is fp32 or bf16; m, v
 * and master are fp32; all have n elements.
 *
 * Skipping a step: lsp_non_finite_flag writes flag[0] = 1 when some of
 * the step's per-token losses is NaN or infinite (else 0), on the stream,
 * after the last loss and before any update; lsp_adamw (and
 * lsp_sparse_apply) take that flag as `skip` and, when it is set, every
 * thread returns before touching param, master, m or v. The host never
 * reads the flag to decide, so skipping costs no synchronization.
 *
 * Every fp32 operation is non-contracted (rounding.cuh) and in the CPU's
 * order, beta^step is computed by square-and-multiply like Go's math.Pow
 * for integer exponents, so the result matches the CPU backend bit for bit
 * (where Go does not fuse its float32 expressions into FMAs: amd64 by
 * default; the tests allow a few ulps).
 *
 * Limits: n >= 0 (0 launches nothing); step >= 1; sum_sq may be NULL
 * unless max_norm > 0; skip may be NULL (never skip); param, master, m, v
 * must not overlap grad. One thread per element with a grid-stride loop:
 * elementwise, hence deterministic. lsp_non_finite_flag runs one block,
 * sized for a step's losses (B*T per micro-batch), not for large tensors.
 */
#include "kernels.h"
#include "rounding.cuh"

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 1 << 16;

struct AdamScalars {
  float lr, beta1, beta2, eps, wd;
  float step_size, sqrt_bc2, max_norm;
};

template <bool ParamBF16, bool GradBF16>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(void* __restrict__ param, float* __restrict__ master, const void* __restrict__ grad,
                 float* __restrict__ m, float* __restrict__ v, const float* __restrict__ sum_sq,
                 const float* __restrict__ skip, long long n, AdamScalars p) {
  if (skip != nullptr && *skip != 0.0f) return;  // a step with a non-finite loss: write nothing
  float gscale = 1.0f;
  if (p.max_norm > 0.0f) {
    const double c = static_cast<double>(p.max_norm) / (sqrt(static_cast<double>(*sum_sq)) + 1e-6);
    if (c < 1.0) gscale = static_cast<float>(c);  // a NaN norm leaves g as it is
  }
  const float decay = __fsub_rn(1.0f, __fmul_rn(p.lr, p.wd));
  const float om1 = __fsub_rn(1.0f, p.beta1), om2 = __fsub_rn(1.0f, p.beta2);
  // Not unrolled: the IEEE division and square root call their slow paths
  // as subroutines, and with the loop unrolled ptxas (CUDA 11.8, sm_90,
  // adamw_kernel<false, false>) spilled a 64-bit value live across those
  // calls (an 8-byte stack frame, its loads and stores next to the loop),
  // which the kernel report (make kernel-report) refuses.
  // The loop is memory-bound, and a thread runs it once for n up to
  // kMaxBlocks * kThreads (16.7M elements), where unrolling cannot matter;
  // above that it is not measured yet (no GPU so far).
#pragma unroll 1
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    float w;
    if (master != nullptr) {
      w = master[i];
    } else if (ParamBF16) {
      w = lsp_bf16_to_f32(static_cast<const uint16_t*>(param)[i]);
    } else {
      w = static_cast<const float*>(param)[i];
    }
    const float g = GradBF16 ? lsp_bf16_to_f32(static_cast<const uint16_t*>(grad)[i])
                             : static_cast<const float*>(grad)[i];
    const float gi = __fmul_rn(g, gscale);
    const float mi = __fadd_rn(__fmul_rn(p.beta1, m[i]), __fmul_rn(om1, gi));
    const float vi = __fadd_rn(__fmul_rn(p.beta2, v[i]), __fmul_rn(__fmul_rn(om2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), p.sqrt_bc2), p.eps);
    w = __fsub_rn(__fmul_rn(w, decay), __fdiv_rn(__fmul_rn(p.step_size, mi), denom));
    m[i] = mi;
    v[i] = vi;
    if (master != nullptr) master[i] = w;
    if (ParamBF16) {
      static_cast<uint16_t*>(param)[i] = lsp_f32_to_bf16_rne(w);
    } else {
      static_cast<float*>(param)[i] = w;
    }
  }
}

// beta^step by square-and-multiply, the products Go's math.Pow forms for
// an integer exponent (its frexp renormalisation only rescales by powers of
// two, which does not change a rounding while values stay normal).
double pow_int(double beta, int step) {
  double a = 1.0, x = beta;
  for (unsigned int i = static_cast<unsigned int>(step); i != 0; i >>= 1) {
    if (i & 1u) a *= x;
    x *= x;
  }
  return a;
}

// flag[0] = 1 when some x[i] is NaN or +-Inf (exponent bits all ones),
// else 0; one block of kFlagThreads threads strides over x.
constexpr int kFlagThreads = 1024;

__global__ void __launch_bounds__(kFlagThreads)
    non_finite_flag_kernel(float* __restrict__ flag, const float* __restrict__ x, long long n) {
  int bad = 0;
  for (long long i = threadIdx.x; i < n; i += kFlagThreads)
    bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
  bad = __syncthreads_or(bad);  // every thread's verdict reaches thread 0
  if (threadIdx.x == 0) flag[0] = bad ? 1.0f : 0.0f;
}

}  // namespace

extern "C" cudaError_t lsp_non_finite_flag(float* flag, const float* x, long long n, cudaStream_t stream) {
  if (flag == nullptr || n < 0 || (n > 0 && x == nullptr)) return cudaErrorInvalidValue;
  LSP_LAUNCH(non_finite_flag_kernel, dim3(1), dim3(kFlagThreads), 0, stream, flag, x, n);
  return cudaGetLastError();
}

extern "C" cudaError_t lsp_adamw(void* param, int param_bf16, float* master, const void* grad, int grad_bf16,
                                 float* m, float* v, const float* sum_sq, const float* skip, long long n, float lr,
                                 float beta1, float beta2, float eps, float weight_decay, int step, float max_norm,
                                 cudaStream_t stream) {
  if (n < 0 || step < 1 || (max_norm > 0.0f && sum_sq == nullptr) || lsp_bad_dtype(param_bf16) || lsp_bad_dtype(grad_bf16))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (param == nullptr || grad == nullptr || m == nullptr || v == nullptr) return cudaErrorInvalidValue;
  // volatile: the host compiler must not fuse the last product into 1 - x.
  volatile double p1 = pow_int(beta1, step), p2 = pow_int(beta2, step);
  const double bc1 = 1.0 - p1, bc2 = 1.0 - p2;
  AdamScalars p;
  p.lr = lr;
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.eps = eps;
  p.wd = weight_decay;
  p.step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  p.sqrt_bc2 = static_cast<float>(sqrt(bc2));
  p.max_norm = max_norm;
  long long blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  const dim3 grid(static_cast<unsigned int>(blocks));
  if (param_bf16 && grad_bf16) {
    auto k = adamw_kernel<true, true>;
    LSP_LAUNCH(k, grid, dim3(kThreads), 0, stream, param, master, grad, m, v, sum_sq, skip, n, p);
  } else if (param_bf16) {
    auto k = adamw_kernel<true, false>;
    LSP_LAUNCH(k, grid, dim3(kThreads), 0, stream, param, master, grad, m, v, sum_sq, skip, n, p);
  } else if (grad_bf16) {
    auto k = adamw_kernel<false, true>;
    LSP_LAUNCH(k, grid, dim3(kThreads), 0, stream, param, master, grad, m, v, sum_sq, skip, n, p);
  } else {
    auto k = adamw_kernel<false, false>;
    LSP_LAUNCH(k, grid, dim3(kThreads), 0, stream, param, master, grad, m, v, sum_sq, skip, n, p);
  }
  return cudaGetLastError();
}
