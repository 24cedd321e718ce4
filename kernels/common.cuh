/*
 * common.cuh: the portability header of every kernel of lsp-offload. The
 * same file serves three compilers:
 *
 *   nvcc (libkernels.a)   CUDA's own headers; LSP_LAUNCH is <<<...>>>.
 *   g++ -DLSP_SIM         the CPU simulator (kernels/sim/sim.h), which runs
 *                         the same .cu source on CPU fibers for tests.
 *   a C compiler          (cgo preambles including kernels.h): only the
 *                         types the launcher declarations need.
 *
 * What kernels use from here:
 *
 *   LSP_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)
 *       launches `kernel` like kernel<<<grid, block, smem_bytes, stream>>>(args...).
 *       `kernel` must be one token: for a template instantiation bind a
 *       pointer first (auto k = gemm_kernel<64, 64>; LSP_LAUNCH(k, ...)).
 *       Follow it with `return cudaGetLastError();`.
 *   LSP_DYN_SMEM(T, name);
 *       inside a kernel, declares `T* name` pointing at the block's dynamic
 *       shared memory (16-byte aligned). Do not write `extern __shared__`.
 *
 * Rules the simulator enforces as a GPU would: at most 1024 threads a block;
 * more than 48 KiB of dynamic shared memory needs
 * cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
 * bytes) before the launch (at most 227 KiB; note sm_86/sm_89 allow only
 * 99 KiB and sm_80 163 KiB); every thread of a block must reach every
 * __syncthreads() (no early return before a barrier); warp-collective calls
 * must be made by every lane named in the mask.
 *
 * Under the simulator (-DLSP_SIM) LSP_LAUNCH runs the grid synchronously
 * and ignores the stream. With -DLSP_CUDASIM as well (the simulated CUDA
 * runtime, kernels/sim/cudart.cpp) it checks the configuration, captures
 * the arguments by value and queues the grid on the stream, returning at
 * once as <<<>>> does; errors of the run surface at the next synchronising
 * call, as CUDA's sticky errors.
 */
#ifndef LSP_COMMON_CUH
#define LSP_COMMON_CUH

#if defined(LSP_SIM) && defined(__CUDACC__)
#error "LSP_SIM selects the CPU simulator; it is for g++ builds, not nvcc"
#endif
#if defined(LSP_CUDASIM) && !defined(LSP_SIM)
#error "LSP_CUDASIM (the simulated CUDA runtime) needs LSP_SIM too"
#endif

#if !defined(__cplusplus)

/* C: cgo preambles see only declarations. CUDA's bf16/fp16 headers define
 * the storage types for C under their _raw names; pointers to them are ABI
 * compatible with the C++ types the kernels use. */
#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef __nv_bfloat16_raw __nv_bfloat16;
typedef __half_raw __half;
#if defined(LSP_SIM)
#include "sim/sim_api.h"
#endif

#elif defined(LSP_SIM)

#include "sim/sim.h"

#define LSP_LAUNCH(kernel, grid, block, smem, stream, ...) \
	::lsp_sim::launch(#kernel, __FILE__, __LINE__, kernel, grid, block, smem, stream, ##__VA_ARGS__)

#define LSP_DYN_SMEM(T, name) \
	T* name = reinterpret_cast<T*>(::lsp_sim::dyn_smem())

#else

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#define LSP_LAUNCH(kernel, grid, block, smem, stream, ...) \
	kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)

#define LSP_DYN_SMEM(T, name)                                        \
	extern __shared__ __align__(16) unsigned char lsp_dyn_smem_[]; \
	T* name = reinterpret_cast<T*>(lsp_dyn_smem_)

#endif

#if defined(__cplusplus)
/* LSP_DYN_SMEM_BYTES(kernel, bytes); at file scope outside any namespace,
 * after the kernel: the dynamic shared memory `kernel` is launched with, as
 * the constant lsp_dyn_smem_bytes_<kernel>, which its launcher passes to
 * LSP_LAUNCH. C linkage makes it a symbol of the compiled object too, where
 * the static kernel report (kernels/cmd/kreport) reads it: the report's
 * figure is the one the launcher uses, not a copy that could drift. Every
 * kernel that uses LSP_DYN_SMEM needs one (the report checks). */
#define LSP_DYN_SMEM_BYTES(kernel, bytes) extern "C" const unsigned int lsp_dyn_smem_bytes_##kernel = (bytes)

/* lsp_bad_dtype: a launcher's *_bf16 flag that names no storage type (the
 * flags are backend.DType numbers: 0 fp32, 1 bf16); launchers refuse it with
 * cudaErrorInvalidValue rather than read it as "not zero: bf16". */
static inline bool lsp_bad_dtype(int flag) { return flag != 0 && flag != 1; }
#endif

#endif /* LSP_COMMON_CUH */
