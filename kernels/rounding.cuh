/*
 * rounding.cuh: bit-exact scalar helpers shared by sparse.cu, dense.cu,
 * adam.cu and cast.cu (included by .cu files only, every name has internal linkage):
 *
 *   - (kernels write fp32 arithmetic that must not be contracted into an
 *     FMA with __fmul_rn, __fadd_rn, ...: nvcc never fuses those, and the
 *     simulator's versions are plain operators that g++ does not fuse on
 *     x86-64 without -mfma; so a kernel reproduces its CPU reference bit
 *     for bit);
 *   - fp32 -> bf16 round to nearest even, bit for bit as train/bf16
 *     FromFloat32 (NaN keeps its sign and becomes quiet);
 *   - the storage of a weight that is fp32 or bf16 (sparse.cu's and
 *     dense.cu's apply): lsp_ld widens either exactly, lsp_store_w writes
 *     fp32 exactly and bf16 by stochastic rounding with element w's bits;
 *   - the counter-based generator of stochastic rounding, bit for bit as
 *     train/cpu/ref_cast.go: the SplitMix64 finalizer ("Mix13") chained
 *     over the key words,
 *         key = mix(mix(mix(seed + G) ^ (step + G)) ^ (matrix + G))
 *         h   = mix(key ^ mix(elem + G))          G = 0x9e3779b97f4a7c15
 *     with the top 16 bits of h added to the low half of the binary32
 *     pattern before it is truncated (E[result] = x; NaN as RNE; Inf kept;
 *     values past the largest finite bf16 may round to Inf).
 *
 * Limits: sm_80 or newer like every kernel; the key (3 mixes) is computed
 * once per launch on the host, the element hash (2 mixes) per element.
 */
#ifndef LSP_ROUNDING_CUH
#define LSP_ROUNDING_CUH

#include "common.cuh"

#include <stdint.h>

namespace {

// bf16 travels as its bit pattern (uint16_t): CUDA's bit-cast intrinsics
// for __nv_bfloat16 are device-only, the simulator is g++.
__device__ __forceinline__ float lsp_bf16_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even: adding 0x7fff plus the lowest kept bit, a carry
// into the exponent is the right result (up to Inf).
__device__ __forceinline__ uint16_t lsp_f32_to_bf16_rne(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

constexpr uint64_t kSRGamma = 0x9e3779b97f4a7c15ull;

__host__ __device__ __forceinline__ uint64_t lsp_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The generator key of one (seed, step, matrix): SRKey in ref_cast.go.
__host__ __device__ __forceinline__ uint64_t lsp_sr_key(uint64_t seed, uint64_t step, uint32_t matrix) {
  uint64_t k = lsp_mix64(seed + kSRGamma);
  k = lsp_mix64(k ^ (step + kSRGamma));
  return lsp_mix64(k ^ (static_cast<uint64_t>(matrix) + kSRGamma));
}

// The 16 rounding bits of element elem: SRBits in ref_cast.go.
__device__ __forceinline__ uint32_t lsp_sr_bits(uint64_t key, uint64_t elem) {
  return static_cast<uint32_t>(lsp_mix64(key ^ lsp_mix64(elem + kSRGamma)) >> 48);
}

// Stochastic rounding of x with the 16 random bits u: RoundBF16Bits.
__device__ __forceinline__ uint16_t lsp_f32_to_bf16_sr(float x, uint32_t u) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return lsp_f32_to_bf16_rne(x);
  return static_cast<uint16_t>((b + (u & 0xffffu)) >> 16);
}

// lsp_ld widens one stored value to fp32 (exact for bf16 bits).
__device__ __forceinline__ float lsp_ld(const float* p) { return *p; }
__device__ __forceinline__ float lsp_ld(const uint16_t* p) { return lsp_bf16_to_f32(*p); }

// lsp_store_w writes element w of a weight: exactly to fp32, by stochastic
// rounding with the bits of (key, w) to bf16 (key: lsp_sr_key).
__device__ __forceinline__ void lsp_store_w(float* W, long long w, float x, uint64_t) { W[w] = x; }
__device__ __forceinline__ void lsp_store_w(uint16_t* W, long long w, float x, uint64_t key) {
  W[w] = lsp_f32_to_bf16_sr(x, lsp_sr_bits(key, static_cast<uint64_t>(w)));
}

}  // namespace

#endif
