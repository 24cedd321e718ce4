/*
 * quant.cu: dequantization of a quantized frozen matrix (backend.Quant,
 * lora --base-dtype nf4|int8) into fp32 or bf16: the device side of the
 * Dequantize op (its CPU reference is train/cpu/ref_quant.go, whose values
 * are train/quant.Decode's).
 *
 *   out[j] = value(off + j)    j < n, elements off .. off+n of len
 *
 * value(i) is quant.cuh's reading of the storage (the codebook value of
 * element i's code times its block's absmax, that absmax decoded from its
 * 8-bit code, its group's scale and the offset), fp32 with each operation
 * rounded on its own, so fp32 output is train/quant.Decode's bit for bit;
 * bf16 output is that value rounded to nearest even once.
 *
 * Launcher (declared in kernels.h):
 *   cudaError_t lsp_dequantize(int format, const unsigned char* codes,
 *       const unsigned char* absmax, const float* scale, const float* book,
 *       long long len, long long off, long long n, void* out, int out_bf16,
 *       cudaStream_t stream);
 * format 1 NF4, 2 Int8 (backend.QFormat); codes are (len+1)/2 (NF4) or len
 * bytes, absmax ceil(len/64) bytes, scale groups+1 floats with groups =
 * ceil(ceil(len/64)/256), book 272 floats. out is float* (out_bf16 == 0)
 * or __nv_bfloat16*.
 *
 * How: one thread per chunk of 8 elements of the matrix (8-aligned, hence
 * in one 64-block), grid-stride: a chunk wholly inside off .. off+n with a
 * 4-byte aligned codes pointer reads its codes as one (NF4) or two (Int8)
 * 32-bit words and decodes them with one absmax; the chunks at the ends of
 * the range (off and n need no alignment) and every chunk of an unaligned
 * codes pointer decode element by element. The codebook is read through
 * the read-only cache, not staged in shared memory: no barrier, and the
 * op is bound by its stores. The GEMM that decodes a quantized operand
 * inside its loads is lsp_gemm_q in gemm.cu, beside the tiles it shares
 * with lsp_gemm_bf16; the decoding both use is quant.cuh.
 *
 * Limits: 0 <= off, 0 <= n, off + n <= len; out must not overlap the
 * quantized matrix. Deterministic (each output written once).
 */
#include "kernels.h"
#include "quant.cuh"

#include <stdint.h>

namespace {

constexpr int kDequantThreads = 256;

struct DequantParams {
  const unsigned char* codes;
  const unsigned char* absmax;
  const float* scale;
  const float* book;
  void* out;
  long long off, n, groups;
  long long first, chunks;  // the chunks (8-element) that overlap off .. off+n
  int format, outBF16, vec;
};

__device__ __forceinline__ void put(const DequantParams& p, long long j, float x) {
  if (p.outBF16) {
    static_cast<uint16_t*>(p.out)[j] = lsp_f32_to_bf16_rne(x);
  } else {
    static_cast<float*>(p.out)[j] = x;
  }
}

__global__ void __launch_bounds__(kDequantThreads) dequantize_kernel(DequantParams p) {
  const long long end = p.off + p.n;
  for (long long ch = (long long)blockIdx.x * blockDim.x + threadIdx.x; ch < p.chunks;
       ch += (long long)gridDim.x * blockDim.x) {
    const long long i0 = (p.first + ch) * 8;
    if (p.vec && i0 >= p.off && i0 + 8 <= end) {
      uint32_t w0, w1;
      lsp_q_words(p.format, p.codes, i0, w0, w1);
      const float a = lsp_q_absmax(p.book, p.absmax, p.scale, p.groups, i0 / LSP_QBLOCK);
      float v[8];
      lsp_q_decode8(p.format, p.book, w0, w1, a, v);
#pragma unroll
      for (int j = 0; j < 8; j++) put(p, i0 - p.off + j, v[j]);
    } else {
      const long long lo = i0 > p.off ? i0 : p.off, hi = i0 + 8 < end ? i0 + 8 : end;
      for (long long i = lo; i < hi; i++) {
        put(p, i - p.off, lsp_q_value(p.format, p.book, p.codes, p.absmax, p.scale, p.groups, i));
      }
    }
  }
}

}  // namespace

extern "C" cudaError_t lsp_dequantize(int format, const unsigned char* codes, const unsigned char* absmax,
                                      const float* scale, const float* book, long long len, long long off, long long n,
                                      void* out, int out_bf16, cudaStream_t stream) {
  if ((format != LSP_QFORMAT_NF4 && format != LSP_QFORMAT_INT8) || lsp_bad_dtype(out_bf16) || len < 0 || off < 0 ||
      n < 0 || off > len || n > len - off)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (codes == nullptr || absmax == nullptr || scale == nullptr || book == nullptr || out == nullptr)
    return cudaErrorInvalidValue;
  DequantParams p;
  p.codes = codes;
  p.absmax = absmax;
  p.scale = scale;
  p.book = book;
  p.out = out;
  p.off = off;
  p.n = n;
  p.groups = lsp_q_groups(len);
  p.first = off / 8;
  p.chunks = (off + n - 1) / 8 - p.first + 1;
  p.format = format;
  p.outBF16 = out_bf16 != 0;
  p.vec = reinterpret_cast<uintptr_t>(codes) % 4 == 0;
  long long blocks = (p.chunks + kDequantThreads - 1) / kDequantThreads;
  if (blocks > 65535) blocks = 65535;  // grid-stride beyond
  LSP_LAUNCH(dequantize_kernel, dim3((unsigned)blocks), dim3(kDequantThreads), 0, stream, p);
  return cudaGetLastError();
}
