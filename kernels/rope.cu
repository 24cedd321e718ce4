/*
 * rope.cu: rotary position embeddings (RoPE), forward and backward, in the
 * convention of LLaMA in HF transformers (rotate_half).
 *
 * q or k is [B, T, NH, HS] (call once for q and once for k, whose NH may
 * differ under grouped-query attention). In every head the pairs
 * (i, i + HS/2), i < HS/2, are rotated by angle = t * inv_freq[i] at
 * position t of the sequence, inv_freq[i] = 1 / theta^(2i/HS):
 *
 *   out[i]        = x[i] cos - x[i + HS/2] sin
 *   out[i + HS/2] = x[i + HS/2] cos + x[i] sin
 *
 * The backward is the rotation by -angle (dinp = R^T dout, written, not
 * accumulated). Both work in place (out == inp) or out of place.
 *
 * Precision: as in HF, the exponent 2i/HS and inv_freq are fp32 and the
 * angle is the fp32 product float(t) * inv_freq; cos and sin are fp32 of
 * that angle (sincosf, not the fast __sinf), and the rotation is fp32 with
 * one rounding at the store (HF rounds cos and sin to bf16 first; we do
 * not). inv_freq is computed by the launcher on the host, through a double
 * pow rounded to fp32, exactly as the CPU reference cpu.RoPEForward
 * (train/cpu/ref_rope.go) does, and travels in the kernel parameters.
 * x_bf16 is the dtype of the tensors (backend.DType: 0 fp32, 1 bf16).
 *
 * How: one thread per (row b*T + t, pair i) computes sincosf once and
 * rotates that pair in all NH heads; consecutive threads take consecutive
 * i, so loads and stores are contiguous within a head. The block first
 * copies inv_freq into shared memory (one barrier): indexing the parameter
 * array per lane would serialize on the constant cache.
 *
 * Limits: HS even, 2 <= HS <= 512; theta > 0; B, T, NH >= 0; positions are
 * 0..T-1 in every sequence (no offset for a cache yet); out and inp are
 * the same tensor or do not overlap.
 */
#include "kernels.h"

#include <math.h>

namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 16384;
constexpr int kMaxHalf = 256;  // HS/2 at most

struct InvFreq {
  float f[kMaxHalf];
};

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// rope_kernel rotates by sign * angle; out may equal inp (each thread
// reads both elements of its pairs before writing them).
template <typename X>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(X* out, const X* inp, long long BT, int T, int NH, int HS, InvFreq inv, float sign) {
  __shared__ float freq[kMaxHalf];
  const int h = HS / 2;
  for (int i = threadIdx.x; i < h; i += kThreads) freq[i] = inv.f[i];
  __syncthreads();
  const long long total = BT * h;
  for (long long idx = (long long)blockIdx.x * kThreads + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * kThreads) {
    const int i = (int)(idx % h);
    const long long bt = idx / h;
    const float angle = (float)(int)(bt % T) * freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    s *= sign;
    for (int hd = 0; hd < NH; hd++) {
      const long long o = (bt * NH + hd) * HS + i;
      const float x0 = ld(inp + o), x1 = ld(inp + o + h);
      st(out + o, x0 * c - x1 * s);
      st(out + o + h, x1 * c + x0 * s);
    }
  }
}

template <typename X>
cudaError_t launch_rope(void* out, const void* inp, int B, int T, int NH, int HS, float theta, float sign,
                        cudaStream_t stream) {
  InvFreq inv;
  const int h = HS / 2;
  for (int i = 0; i < kMaxHalf; i++) {
    const float e = (float)(2 * i) / (float)HS;
    inv.f[i] = i < h ? 1.0f / (float)pow((double)theta, (double)e) : 0.0f;
  }
  const long long BT = (long long)B * T;
  const long long blocks = (BT * h + kThreads - 1) / kThreads;
  auto kernel = rope_kernel<X>;
  LSP_LAUNCH(kernel, dim3((unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks)), dim3(kThreads), 0, stream, (X*)out,
             (const X*)inp, BT, T, NH, HS, inv, sign);
  return cudaGetLastError();
}

cudaError_t rope(void* out, const void* inp, int B, int T, int NH, int HS, float theta, int x_bf16, float sign,
                 cudaStream_t stream) {
  if (B < 0 || T < 0 || NH < 0 || HS < 2 || HS % 2 != 0 || HS / 2 > kMaxHalf || !(theta > 0.0f) ||
      lsp_bad_dtype(x_bf16))
    return cudaErrorInvalidValue;
  if ((long long)B * T * NH == 0) return cudaSuccess;
  if (out == nullptr || inp == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch_rope<__nv_bfloat16>(out, inp, B, T, NH, HS, theta, sign, stream);
  return launch_rope<float>(out, inp, B, T, NH, HS, theta, sign, stream);
}

}  // namespace

extern "C" cudaError_t lsp_rope_forward(void* out, const void* inp, int B, int T, int NH, int HS, float theta,
                                        int x_bf16, cudaStream_t stream) {
  return rope(out, inp, B, T, NH, HS, theta, x_bf16, 1.0f, stream);
}

extern "C" cudaError_t lsp_rope_backward(void* dinp, const void* dout, int B, int T, int NH, int HS, float theta,
                                         int x_bf16, cudaStream_t stream) {
  return rope(dinp, dout, B, T, NH, HS, theta, x_bf16, -1.0f, stream);
}
