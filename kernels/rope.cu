/*
 * rope.cu: rotary position embeddings (RoPE), forward and backward, in the
 * convention of LLaMA in HF transformers (rotate_half).
 *
 * q or k is [B, T, NH, HS] (call once for q and once for k, whose NH may
 * differ under grouped-query attention). In every head the pairs
 * (i, i + HS/2), i < HS/2, are rotated by angle = p * inv_freq[i] at
 * position p, the token's position within its document: pos[b,t] (int32
 * [B,T], backend.Positions: packed rows restart it at each document), or
 * t when pos is NULL:
 *
 *   out[i]        = x[i] cos - x[i + HS/2] sin
 *   out[i + HS/2] = x[i + HS/2] cos + x[i] sin
 *
 * inv_freq fp32 [HS/2] is a device tensor the caller fills: 1 /
 * theta^(2i/HS) (cpu.RoPEInvFreq), or those frequencies rescaled by the
 * model's rope_scaling (llama3, linear), so that no scaling rule lives in
 * the kernel. The backward is the rotation by -angle (dinp = R^T dout,
 * written, not accumulated). Both work in place (out == inp) or out of
 * place.
 *
 * Precision: as in HF, the angle is the fp32 product float(t) *
 * inv_freq[i]; cos and sin are fp32 of that angle (sincosf, not the fast
 * __sinf), and the rotation is fp32 with one rounding at the store (HF
 * rounds cos and sin to bf16 first; we do not), as the CPU reference
 * (train/cpu/ref_rope.go) does. x_bf16 is the dtype of the tensors
 * (backend.DType: 0 fp32, 1 bf16).
 *
 * How: one thread per (row b*T + t, pair i) reads inv_freq[i] (HS/2
 * floats, cached), computes sincosf once and rotates that pair in all NH
 * heads; consecutive threads take consecutive i, so loads and stores are
 * contiguous within a head.
 *
 * Limits: HS even, 2 <= HS <= 512; B, T, NH >= 0; no offset for a cache
 * yet; pos is trusted (the CPU backend checks it); out and inp are the same
 * tensor or do not overlap, and neither overlaps inv_freq.
 *
 * stack frame (rope_kernel): 32 bytes for sincosf's exact argument
 * reduction of large angles (|angle| > 105615, Payne-Hanek, a local array
 * of the reduced argument's words), which long contexts reach (position
 * times inv_freq[0] = 1); smaller angles never touch it. No spills.
 */
#include "kernels.h"
#include "ldst.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 16384;
constexpr int kMaxHalf = 256;  // HS/2 at most

// rope_kernel rotates by sign * angle; out may equal inp (each thread
// reads both elements of its pairs before writing them).
template <typename X>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(X* out, const X* inp, const int* __restrict__ pos, const float* __restrict__ inv_freq, long long BT,
                int T, int NH, int HS, float sign) {
  const int h = HS / 2;
  const long long total = BT * h;
  for (long long idx = (long long)blockIdx.x * kThreads + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * kThreads) {
    const int i = (int)(idx % h);
    const long long bt = idx / h;
    const int p = pos ? pos[bt] : (int)(bt % T);
    const float angle = (float)p * inv_freq[i];
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
cudaError_t launch_rope(void* out, const void* inp, const int* pos, const float* inv_freq, int B, int T, int NH, int HS,
                        float sign, cudaStream_t stream) {
  const long long BT = (long long)B * T;
  const long long blocks = (BT * (HS / 2) + kThreads - 1) / kThreads;
  auto kernel = rope_kernel<X>;
  LSP_LAUNCH(kernel, dim3((unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks)), dim3(kThreads), 0, stream, (X*)out,
             (const X*)inp, pos, inv_freq, BT, T, NH, HS, sign);
  return cudaGetLastError();
}

cudaError_t rope(void* out, const void* inp, const int* pos, const float* inv_freq, int B, int T, int NH, int HS,
                 int x_bf16, float sign, cudaStream_t stream) {
  if (B < 0 || T < 0 || NH < 0 || HS < 2 || HS % 2 != 0 || HS / 2 > kMaxHalf || lsp_bad_dtype(x_bf16))
    return cudaErrorInvalidValue;
  if ((long long)B * T * NH == 0) return cudaSuccess;
  if (out == nullptr || inp == nullptr || inv_freq == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch_rope<__nv_bfloat16>(out, inp, pos, inv_freq, B, T, NH, HS, sign, stream);
  return launch_rope<float>(out, inp, pos, inv_freq, B, T, NH, HS, sign, stream);
}

}  // namespace

extern "C" cudaError_t lsp_rope_forward(void* out, const void* inp, const int* pos, const float* inv_freq, int B,
                                        int T, int NH, int HS, int x_bf16, cudaStream_t stream) {
  return rope(out, inp, pos, inv_freq, B, T, NH, HS, x_bf16, 1.0f, stream);
}

extern "C" cudaError_t lsp_rope_backward(void* dinp, const void* dout, const int* pos, const float* inv_freq, int B,
                                         int T, int NH, int HS, int x_bf16, cudaStream_t stream) {
  return rope(dinp, dout, pos, inv_freq, B, T, NH, HS, x_bf16, -1.0f, stream);
}
