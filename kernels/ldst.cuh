/*
 * ldst.cuh: ld and st, the element access of the kernels templated on
 * their storage type, fp32 or __nv_bfloat16 (activations.cu, embedding.cu,
 * norms.cu, rope.cu, softmax_ce.cu; included by .cu files only, every name
 * has internal linkage): ld widens a stored value to fp32 (exact), st
 * stores an fp32 value (exact to fp32, rounded to nearest even to bf16).
 * elementwise.cu has its own pair on bf16 bit patterns (rounding.cuh).
 */
#ifndef LSP_LDST_CUH
#define LSP_LDST_CUH

#include "common.cuh"

namespace {

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

}  // namespace

#endif
