/*
 * activations.cu: GELU (GPT-2's MLP) and SwiGLU (LLaMA's MLP), forward and
 * backward, elementwise over n values.
 *
 *   GELU:   out = gelu(x), HF's gelu_new, the tanh form
 *           0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 *           computed as x / (1 + exp(-2u)) like the CPU reference
 *           (cpu.GeluForward/GeluBackward, train/cpu/ref_activations.go);
 *           dinp = gelu'(x) * dout (written, not accumulated; dinp may
 *           alias dout).
 *   SwiGLU: out = silu(gate) * up with silu(g) = g * sigmoid(g), for gate
 *           and up [N, H] (n = N*H, separate tensors); dup = dout *
 *           silu(gate), dgate = dout * up * sigmoid(g) (1 + g (1 -
 *           sigmoid(g))) (written; either may alias dout). CPU reference:
 *           cpu.SwiGLUForward/SwiGLUBackward (train/cpu/ref_activations.go).
 *
 * Storage: x_bf16 is the dtype (backend.DType: 0 fp32, 1 bf16) of the values
 * (inp, gate, up, out), g_bf16 that of the gradients (dinp, dgate, dup,
 * dout). Arithmetic is fp32 (expf, not the fast __expf); bf16 is widened at
 * load and rounded to nearest even at store.
 *
 * How: one thread per element, grid-stride over at most 8192 blocks of 256;
 * each element is read before it is written by the same thread, which is
 * what makes the documented aliasing safe. Limits: n >= 0 (64-bit); no
 * other overlaps between inputs and outputs. No barriers.
 */
#include "kernels.h"
#include "ldst.cuh"

namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 8192;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

template <typename X>
__global__ void __launch_bounds__(kThreads) gelu_forward_kernel(X* out, const X* inp, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    const float x = ld(inp + i);
    const float u = kGeluC * (x + 0.044715f * x * x * x);
    st(out + i, x / (1.0f + expf(-2.0f * u)));
  }
}

// gelu'(x) = sig + 0.5 x (1 - th^2) u'(x), sig = sigmoid(2u) = (1+th)/2.
template <typename X, typename G>
__global__ void __launch_bounds__(kThreads) gelu_backward_kernel(G* dinp, const X* inp, const G* dout, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    const float x = ld(inp + i);
    const float u = kGeluC * (x + 0.044715f * x * x * x);
    const float sig = 1.0f / (1.0f + expf(-2.0f * u));
    const float th = 2.0f * sig - 1.0f;
    const float d = sig + 0.5f * x * (1.0f - th * th) * kGeluC * (1.0f + 0.134145f * x * x);  // 3 * 0.044715
    st(dinp + i, d * ld(dout + i));
  }
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename X>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(X* out, const X* gate, const X* up, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    const float g = ld(gate + i);
    st(out + i, g * sigmoidf(g) * ld(up + i));
  }
}

template <typename X, typename G>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(G* dgate, G* dup, const G* dout, const X* gate, const X* up, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads) {
    const float g = ld(gate + i), u = ld(up + i), dy = ld(dout + i);
    const float sg = sigmoidf(g);
    st(dgate + i, dy * u * (sg * (1.0f + g * (1.0f - sg))));
    st(dup + i, dy * (g * sg));
  }
}

dim3 blocks(long long n) {
  const long long b = (n + kThreads - 1) / kThreads;
  return dim3((unsigned)(b < kMaxBlocks ? b : kMaxBlocks));
}

template <typename X>
cudaError_t launch_gelu_forward(void* out, const void* inp, long long n, cudaStream_t stream) {
  auto kernel = gelu_forward_kernel<X>;
  LSP_LAUNCH(kernel, blocks(n), dim3(kThreads), 0, stream, (X*)out, (const X*)inp, n);
  return cudaGetLastError();
}

template <typename X, typename G>
cudaError_t launch_gelu_backward(void* dinp, const void* inp, const void* dout, long long n, cudaStream_t stream) {
  auto kernel = gelu_backward_kernel<X, G>;
  LSP_LAUNCH(kernel, blocks(n), dim3(kThreads), 0, stream, (G*)dinp, (const X*)inp, (const G*)dout, n);
  return cudaGetLastError();
}

template <typename X>
cudaError_t launch_swiglu_forward(void* out, const void* gate, const void* up, long long n, cudaStream_t stream) {
  auto kernel = swiglu_forward_kernel<X>;
  LSP_LAUNCH(kernel, blocks(n), dim3(kThreads), 0, stream, (X*)out, (const X*)gate, (const X*)up, n);
  return cudaGetLastError();
}

template <typename X, typename G>
cudaError_t launch_swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                                   long long n, cudaStream_t stream) {
  auto kernel = swiglu_backward_kernel<X, G>;
  LSP_LAUNCH(kernel, blocks(n), dim3(kThreads), 0, stream, (G*)dgate, (G*)dup, (const G*)dout, (const X*)gate,
             (const X*)up, n);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t lsp_gelu_forward(void* out, const void* inp, long long n, int x_bf16, cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(x_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (out == nullptr || inp == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch_gelu_forward<__nv_bfloat16>(out, inp, n, stream);
  return launch_gelu_forward<float>(out, inp, n, stream);
}

extern "C" cudaError_t lsp_gelu_backward(void* dinp, const void* inp, const void* dout, long long n, int x_bf16,
                                         int g_bf16, cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(x_bf16) || lsp_bad_dtype(g_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dinp == nullptr || inp == nullptr || dout == nullptr) return cudaErrorInvalidValue;
  typedef __nv_bfloat16 bf;
  if (x_bf16 && g_bf16) return launch_gelu_backward<bf, bf>(dinp, inp, dout, n, stream);
  if (x_bf16) return launch_gelu_backward<bf, float>(dinp, inp, dout, n, stream);
  if (g_bf16) return launch_gelu_backward<float, bf>(dinp, inp, dout, n, stream);
  return launch_gelu_backward<float, float>(dinp, inp, dout, n, stream);
}

extern "C" cudaError_t lsp_swiglu_forward(void* out, const void* gate, const void* up, long long n, int x_bf16,
                                          cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(x_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (out == nullptr || gate == nullptr || up == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch_swiglu_forward<__nv_bfloat16>(out, gate, up, n, stream);
  return launch_swiglu_forward<float>(out, gate, up, n, stream);
}

extern "C" cudaError_t lsp_swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                                           long long n, int x_bf16, int g_bf16, cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(x_bf16) || lsp_bad_dtype(g_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dgate == nullptr || dup == nullptr || dout == nullptr || gate == nullptr || up == nullptr)
    return cudaErrorInvalidValue;
  typedef __nv_bfloat16 bf;
  if (x_bf16 && g_bf16) return launch_swiglu_backward<bf, bf>(dgate, dup, dout, gate, up, n, stream);
  if (x_bf16) return launch_swiglu_backward<bf, float>(dgate, dup, dout, gate, up, n, stream);
  if (g_bf16) return launch_swiglu_backward<float, bf>(dgate, dup, dout, gate, up, n, stream);
  return launch_swiglu_backward<float, float>(dgate, dup, dout, gate, up, n, stream);
}
