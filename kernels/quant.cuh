/*
 * quant.cuh: the device's reading of a quantized frozen matrix
 * (backend.Quant; train/quant.Decode is the reference), shared by gemm.cu
 * (lsp_gemm_q decodes its B operand as it loads it) and quant.cu
 * (lsp_dequantize). Included by .cu files only; every name has internal
 * linkage.
 *
 * Storage: len elements in blocks of 64 (LSP_QBLOCK), each block's absmax
 * an 8-bit code of the dynamic map; groups = ceil(ceil(len/64)/256) scales
 * (one per 256 blocks), then the offset: scale[groups]. Block b's absmax is
 *     a_b = book[absmax[b]] * scale[b/256] + scale[groups]
 * and element i is level(i) * a_{i/64}, with level(i) = book[256 + nibble]
 * for NF4 (element i in the high nibble of byte i/2 when i is even, the low
 * one when odd) or book[codes[i]] for Int8. Each fp32 operation is rounded
 * on its own (__fmul_rn, __fadd_rn: nvcc never contracts them into an FMA;
 * the simulator's are plain operators), so the values are train/quant's
 * bit for bit; the fp32 -> bf16 rounding is rounding.cuh's (nearest even).
 *
 * A chunk is 8 consecutive elements starting at a multiple of 8: it lies in
 * one block, its NF4 codes are 4 bytes at byte i/2 (a multiple of 4) and its
 * Int8 codes 8 bytes at byte i (two 4-byte words), so with a 4-byte aligned
 * codes pointer it is read as one or two 32-bit words and decoded with one
 * absmax (lsp_q_decode8).
 */
#ifndef LSP_QUANT_CUH
#define LSP_QUANT_CUH

#include "common.cuh"
#include "rounding.cuh"

#include <stdint.h>

namespace {

constexpr int LSP_QBLOCK = 64;        // elements per absmax (backend.QBlock)
constexpr int LSP_QGROUP = 256;       // absmax values per scale (backend.QGroup)
constexpr int LSP_QBOOK_NF4 = 256;    // the NF4 levels' index in the book (backend.QBookNF4)
constexpr int LSP_QBOOK_LEN = 272;    // floats of the codebook (backend.QBookLen)
constexpr int LSP_QFORMAT_NF4 = 1;    // backend.NF4
constexpr int LSP_QFORMAT_INT8 = 2;   // backend.Int8

// lsp_q_groups is the number of scale groups of len elements (the offset's
// index in scale).
__host__ __device__ __forceinline__ long long lsp_q_groups(long long len) {
  const long long blocks = (len + LSP_QBLOCK - 1) / LSP_QBLOCK;
  return (blocks + LSP_QGROUP - 1) / LSP_QGROUP;
}

// lsp_q_absmax_of is block b's absmax from its code's value (book[code])
// and its group's scale: value * scale + offset, each op rounded.
__device__ __forceinline__ float lsp_q_absmax_of(float value, float scale, float offset) {
  return __fadd_rn(__fmul_rn(value, scale), offset);
}

// lsp_q_absmax is block b's absmax, book in any memory space.
__device__ __forceinline__ float lsp_q_absmax(const float* book, const unsigned char* __restrict__ absmax,
                                              const float* __restrict__ scale, long long groups, long long b) {
  return lsp_q_absmax_of(book[absmax[b]], scale[b / LSP_QGROUP], scale[groups]);
}

// lsp_q_level is element i's codebook value.
__device__ __forceinline__ float lsp_q_level(int format, const float* book, const unsigned char* __restrict__ codes,
                                             long long i) {
  if (format == LSP_QFORMAT_NF4) {
    const unsigned c = codes[i / 2];
    return book[LSP_QBOOK_NF4 + ((i & 1) ? (c & 15u) : (c >> 4))];
  }
  return book[codes[i]];
}

// lsp_q_value is element i's value in fp32 (train/quant.Decode).
__device__ __forceinline__ float lsp_q_value(int format, const float* book, const unsigned char* __restrict__ codes,
                                             const unsigned char* __restrict__ absmax, const float* __restrict__ scale,
                                             long long groups, long long i) {
  return __fmul_rn(lsp_q_level(format, book, codes, i), lsp_q_absmax(book, absmax, scale, groups, i / LSP_QBLOCK));
}

// lsp_q_words loads the codes of the chunk at element i (i % 8 == 0, codes
// 4-byte aligned): w0 (NF4: all 4 bytes; Int8: elements i..i+3) and w1
// (Int8: elements i+4..i+7).
__device__ __forceinline__ void lsp_q_words(int format, const unsigned char* __restrict__ codes, long long i,
                                            uint32_t& w0, uint32_t& w1) {
  if (format == LSP_QFORMAT_NF4) {
    w0 = __ldg(reinterpret_cast<const uint32_t*>(codes + i / 2));
    w1 = 0;
  } else {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(codes + i);
    w0 = __ldg(p);
    w1 = __ldg(p + 1);
  }
}

// lsp_q_decode8 is the 8 values of a chunk from its code words
// (lsp_q_words) and its block's absmax a, in fp32. Bytes are in memory
// order: byte j of a word is bits 8j..8j+7 (little-endian).
__device__ __forceinline__ void lsp_q_decode8(int format, const float* book, uint32_t w0, uint32_t w1, float a,
                                              float (&v)[8]) {
  if (format == LSP_QFORMAT_NF4) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const uint32_t byte = (w0 >> (8 * j)) & 0xffu;
      v[2 * j] = __fmul_rn(book[LSP_QBOOK_NF4 + (byte >> 4)], a);
      v[2 * j + 1] = __fmul_rn(book[LSP_QBOOK_NF4 + (byte & 15u)], a);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const uint32_t byte = ((j < 4 ? w0 : w1) >> (8 * (j % 4))) & 0xffu;
      v[j] = __fmul_rn(book[byte], a);
    }
  }
}

}  // namespace

#endif
