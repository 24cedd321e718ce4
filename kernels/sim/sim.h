/*
 * sim.h: a CPU simulator for the project's CUDA kernels. With it g++
 * compiles the same kernels/<family>.cu files nvcc compiles (through
 * kernels/common.cuh with -DLSP_SIM) and runs their grids on CPU threads,
 * so the tests check every kernel on machines without a GPU.
 *
 * What it simulates:
 *   - __global__/__device__/__host__/__forceinline__/__launch_bounds__,
 *     threadIdx, blockIdx, blockDim, gridDim, warpSize, dim3, cudaStream_t,
 *     cudaError_t, cudaGetLastError, cudaPeekAtLastError,
 *     cudaGetErrorString/Name, cudaFuncSetAttribute (max dynamic smem; any
 *     other attribute is cudaErrorNotSupported).
 *   - Every thread of a block is a fiber (its own 64 KiB stack with a guard
 *     page); all fibers of a block run on one worker thread and blocks are
 *     spread over a pool of workers. Between synchronisation points the
 *     fibers of a block run in a random order chosen per seed
 *     (lsp_sim_set_seed), so code that needs a barrier it lacks gives wrong
 *     results.
 *   - __shared__ (static: thread_local storage of the worker thread running
 *     the block) and dynamic shared memory (LSP_DYN_SMEM; ends at a guard
 *     page; writes just before its start are caught by a canary). Both are
 *     filled with 0xFF bytes (NaN) at every block start (static ones once a
 *     block on that worker has written them; before that they hold zeros).
 *   - __syncthreads (and _count/_and/_or): every thread of the block must
 *     reach the same barrier site; a thread that exits while others wait, or
 *     threads waiting at different sites, is a launch error. A site can be
 *     switched off with env LSP_SIM_SKIP_BARRIER=<file basename>:<line>.
 *   - Warp-collective operations rendezvous the lanes named in the mask:
 *     __syncwarp, __shfl{,_up,_down,_xor}_sync (with width), __ballot_sync,
 *     __all_sync, __any_sync, __reduce_{add,min,max,and,or,xor}_sync, and
 *     nvcuda::wmma load/store/mma. The calling lane must be in the mask;
 *     lanes must agree on the mask and the operation; a shuffle reading a
 *     lane outside the mask gets NaN bytes.
 *   - nvcuda::wmma bf16 16x16x16 with float accumulators: fragments hold 8
 *     elements per lane like CUDA's, but which (row, col) an element x[i] of
 *     a lane holds is a random permutation chosen per seed, so code that
 *     indexes fragment elements by position fails while elementwise use of
 *     all elements works. Pointers must be 32-byte aligned and ldm a
 *     multiple of 16 bytes, as on the GPU.
 *   - Integer atomics (float atomicAdd is deliberately absent: kernels must
 *     be deterministic), __ldg, fences, and the math intrinsics (__expf,
 *     rsqrtf, __fdividef, ...) through the C library; bf16 and fp16 come
 *     from CUDA's own cuda_bf16.h and cuda_fp16.h.
 *   - Launch checks: block <= 1024 threads (x, y <= 1024, z <= 64), grid
 *     x < 2^31, y, z <= 65535, dynamic shared memory <= 48 KiB unless raised
 *     with cudaFuncSetAttribute, never above 227 KiB.
 *
 * What it cannot check: timing and performance; real warp scheduling (lanes
 * run one at a time, only synchronisation points interleave threads, so
 * races inside a segment without a sync are not explored); the exact
 * numerics of tensor cores and of nvcc's FMA contraction; bank conflicts;
 * memory-model subtleties (fences, visibility between blocks, volatile);
 * __launch_bounds__ limits; register and static shared memory limits; out of
 * bounds accesses to static __shared__ arrays (they sit next to each other);
 * streams (launches are synchronous, except under -DLSP_CUDASIM, where the
 * simulated CUDA runtime of cudart.cpp queues them on real streams);
 * uninitialised registers. Inline PTX,
 * cooperative groups, __noinline__ and texture/surface objects do not
 * compile; other wmma shapes and types neither.
 */
#ifndef LSP_SIM_H
#define LSP_SIM_H

#ifndef __cplusplus
#error "sim.h is C++; C code includes sim_api.h"
#endif

#include <cuda_runtime_api.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "sim_api.h"

/* ---- CUDA keywords ---- */

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __managed__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __launch_bounds__(...)
/* One running block per worker thread, all its fibers on that thread: a
 * thread_local is exactly per-block storage. The runtime learns which
 * bytes of the thread-local block kernels write and fills them with 0xFF
 * (NaN) at every block start, so stale data of the previous block cannot
 * hide a missing barrier. `extern __shared__` does not compile (use
 * LSP_DYN_SMEM). */
#define __shared__ static thread_local
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

static constexpr int warpSize = 32;

namespace lsp_sim {

/* The running fiber's and block's coordinates (set by the runtime). */
struct ThreadCoord {
	uint3 idx;
};
struct BlockCoord {
	uint3 idx;
	dim3 dim;
	dim3 grid;
	unsigned char* dyn_smem;
	size_t dyn_smem_bytes;
};
extern __thread ThreadCoord* tls_thread;
extern __thread BlockCoord* tls_block;

inline unsigned char* dyn_smem() { return tls_block->dyn_smem; }

/* ---- barriers ---- */
enum BarrierKind { BAR_SYNC = 0, BAR_COUNT, BAR_AND, BAR_OR };
int syncthreads_at(int kind, int pred, const char* file, int line);

/* ---- warp collectives ----
 * Every lane in `mask` calls warp_collective with the same `op` and mask;
 * the last lane to arrive runs op(args, mask), where args[l] is the `arg` of
 * lane l (null for lanes not in mask), then all continue. */
typedef void (*CollectiveOp)(void* const* args, unsigned mask);
void warp_collective(const char* what, unsigned mask, CollectiveOp op, void* arg);
unsigned lane_id();
[[noreturn]] void kernel_error(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

enum ShflMode { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };

/* Source lane of a shuffle, as PTX shfl.sync defines it (width must be a
 * power of two <= 32; an out-of-segment source gives the lane itself). */
inline int shfl_source(ShflMode mode, int lane, unsigned b, int width) {
	if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
		kernel_error(cudaErrorLaunchFailure, "shuffle width %d is not a power of two in [1, 32]", width);
	int seg = ~(width - 1) & 31;
	int min_lane = lane & seg;
	int max_lane = mode == SHFL_UP ? min_lane : (min_lane | (31 & ~seg));
	int bv = int(b & 31);
	int j = lane;
	bool ok = true;
	switch (mode) {
	case SHFL_IDX: j = min_lane | (bv & ~seg); break;
	case SHFL_UP: j = lane - bv; ok = j >= max_lane; break;
	case SHFL_DOWN: j = lane + bv; ok = j <= max_lane; break;
	case SHFL_XOR: j = lane ^ bv; ok = j <= max_lane; break;
	}
	return ok ? j : lane;
}

template <class T>
struct ShflArg {
	T in;
	T out;
	int src;
};

template <class T>
void shfl_op(void* const* args, unsigned mask) {
	for (int l = 0; l < 32; l++) {
		if (!(mask >> l & 1)) continue;
		ShflArg<T>* a = static_cast<ShflArg<T>*>(args[l]);
		if (mask >> a->src & 1)
			std::memcpy(static_cast<void*>(&a->out), &static_cast<ShflArg<T>*>(args[a->src])->in, sizeof(T));
		else
			std::memset(static_cast<void*>(&a->out), 0xFF, sizeof(T)); /* undefined on the GPU */
	}
}

template <class T>
T shfl(const char* what, ShflMode mode, unsigned mask, T var, unsigned b, int width) {
	static_assert(std::is_trivially_copyable<T>::value, "shuffled values must be trivially copyable");
	ShflArg<T> a;
	a.in = var;
	a.src = shfl_source(mode, int(lane_id()), b, width);
	warp_collective(what, mask, &shfl_op<T>, &a);
	return a.out;
}

struct VoteArg {
	unsigned in;
	unsigned out;
};
void vote_ballot(void* const* args, unsigned mask);
void vote_all(void* const* args, unsigned mask);
void vote_any(void* const* args, unsigned mask);
void reduce_add(void* const* args, unsigned mask);
void reduce_min_u(void* const* args, unsigned mask);
void reduce_max_u(void* const* args, unsigned mask);
void reduce_min_i(void* const* args, unsigned mask);
void reduce_max_i(void* const* args, unsigned mask);
void reduce_and(void* const* args, unsigned mask);
void reduce_or(void* const* args, unsigned mask);
void reduce_xor(void* const* args, unsigned mask);
void sync_op(void* const* args, unsigned mask);

inline unsigned vote(const char* what, CollectiveOp op, unsigned mask, unsigned v) {
	VoteArg a{v, 0};
	warp_collective(what, mask, op, &a);
	return a.out;
}

/* ---- launches ---- */
typedef void (*Thunk)(const void* kernel, const void* params);
void launch_impl(const char* name, const char* file, int line, const void* kernel, Thunk thunk,
                 const void* params, dim3 grid, dim3 block, size_t smem, cudaStream_t stream);
/* cudaFuncSetAttribute: MaxDynamicSharedMemorySize; any other attribute is
 * cudaErrorNotSupported (the simulator does not model it). */
cudaError_t set_func_attribute(const void* kernel, int attr, int value);

/* The simulated CUDA runtime (-DLSP_CUDASIM, cudart.cpp): checks the launch
 * configuration now, then queues the grid on `stream` and returns; the
 * stream's thread runs it. Takes ownership of params (a heap copy of the
 * arguments), which free_params deletes after the run or on refusal. */
typedef void (*ParamsFree)(void* params);
void launch_async(const char* name, const char* file, int line, const void* kernel, Thunk thunk, void* params,
                  ParamsFree free_params, dim3 grid, dim3 block, size_t smem, cudaStream_t stream);

template <class... P>
struct KernelCall {
	typedef std::tuple<typename std::decay<P>::type...> Params;
	static void run(const void* kernel, const void* params) {
		/* Each fiber passes the launch's arguments by value, as CUDA does. */
		std::apply(reinterpret_cast<void (*)(P...)>(const_cast<void*>(kernel)),
		           *static_cast<const Params*>(params));
	}
	static void destroy(void* params) { delete static_cast<Params*>(params); }
};

template <class... P, class... A>
void launch(const char* name, const char* file, int line, void (*kernel)(P...), dim3 grid, dim3 block,
            size_t smem, cudaStream_t stream, A&&... args) {
	static_assert(sizeof...(P) == sizeof...(A), "LSP_LAUNCH: wrong number of kernel arguments");
#ifdef LSP_CUDASIM
	/* The arguments are captured by value, as <<<>>> captures them, since
	 * the grid runs after LSP_LAUNCH returns. */
	auto* params = new typename KernelCall<P...>::Params(std::forward<A>(args)...);
	launch_async(name, file, line, reinterpret_cast<const void*>(kernel), &KernelCall<P...>::run, params,
	             &KernelCall<P...>::destroy, grid, block, smem, stream);
#else
	typename KernelCall<P...>::Params params(std::forward<A>(args)...);
	launch_impl(name, file, line, reinterpret_cast<const void*>(kernel), &KernelCall<P...>::run, &params,
	            grid, block, smem, stream);
#endif
}

} /* namespace lsp_sim */

#define threadIdx (::lsp_sim::tls_thread->idx)
#define blockIdx (::lsp_sim::tls_block->idx)
#define blockDim (::lsp_sim::tls_block->dim)
#define gridDim (::lsp_sim::tls_block->grid)

#define __syncthreads() ((void)::lsp_sim::syncthreads_at(::lsp_sim::BAR_SYNC, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) ::lsp_sim::syncthreads_at(::lsp_sim::BAR_COUNT, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_and(p) ::lsp_sim::syncthreads_at(::lsp_sim::BAR_AND, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_or(p) ::lsp_sim::syncthreads_at(::lsp_sim::BAR_OR, (p) != 0, __FILE__, __LINE__)

/* ---- runtime API (the subset launchers use) ---- */

template <class T>
inline cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
	return ::lsp_sim::set_func_attribute(reinterpret_cast<const void*>(kernel), int(attr), value);
}

/* ---- warp intrinsics ---- */

inline void __syncwarp(unsigned mask = 0xffffffffu) {
	::lsp_sim::warp_collective("__syncwarp", mask, &::lsp_sim::sync_op, nullptr);
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
	return ::lsp_sim::shfl("__shfl_sync", ::lsp_sim::SHFL_IDX, mask, var, unsigned(srcLane), width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
	return ::lsp_sim::shfl("__shfl_up_sync", ::lsp_sim::SHFL_UP, mask, var, delta, width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
	return ::lsp_sim::shfl("__shfl_down_sync", ::lsp_sim::SHFL_DOWN, mask, var, delta, width);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
	return ::lsp_sim::shfl("__shfl_xor_sync", ::lsp_sim::SHFL_XOR, mask, var, unsigned(laneMask), width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
	return ::lsp_sim::vote("__ballot_sync", &::lsp_sim::vote_ballot, mask, pred != 0);
}
inline int __all_sync(unsigned mask, int pred) {
	return int(::lsp_sim::vote("__all_sync", &::lsp_sim::vote_all, mask, pred != 0));
}
inline int __any_sync(unsigned mask, int pred) {
	return int(::lsp_sim::vote("__any_sync", &::lsp_sim::vote_any, mask, pred != 0));
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
	return ::lsp_sim::vote("__reduce_add_sync", &::lsp_sim::reduce_add, mask, v);
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
	return ::lsp_sim::vote("__reduce_min_sync", &::lsp_sim::reduce_min_u, mask, v);
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
	return ::lsp_sim::vote("__reduce_max_sync", &::lsp_sim::reduce_max_u, mask, v);
}
inline int __reduce_add_sync(unsigned mask, int v) {
	return int(::lsp_sim::vote("__reduce_add_sync", &::lsp_sim::reduce_add, mask, unsigned(v)));
}
inline int __reduce_min_sync(unsigned mask, int v) {
	return int(::lsp_sim::vote("__reduce_min_sync", &::lsp_sim::reduce_min_i, mask, unsigned(v)));
}
inline int __reduce_max_sync(unsigned mask, int v) {
	return int(::lsp_sim::vote("__reduce_max_sync", &::lsp_sim::reduce_max_i, mask, unsigned(v)));
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned v) {
	return ::lsp_sim::vote("__reduce_and_sync", &::lsp_sim::reduce_and, mask, v);
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned v) {
	return ::lsp_sim::vote("__reduce_or_sync", &::lsp_sim::reduce_or, mask, v);
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v) {
	return ::lsp_sim::vote("__reduce_xor_sync", &::lsp_sim::reduce_xor, mask, v);
}

/* ---- memory ---- */

template <class T>
inline T __ldg(const T* p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

/* Integer atomics (blocks run concurrently on several workers, so these are
 * real atomics). Floating-point atomics are deleted on purpose: their
 * summation order depends on scheduling, and kernels must be deterministic. */
#define LSP_SIM_ATOMIC_INT(T)                                                                      \
	inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }           \
	inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }           \
	inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }         \
	inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }           \
	inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }             \
	inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }           \
	inline T atomicCAS(T* p, T cmp, T v) {                                                         \
		__atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
		return cmp;                                                                                \
	}                                                                                              \
	inline T atomicMax(T* p, T v) {                                                                \
		T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                              \
		while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST,         \
		                                               __ATOMIC_SEQ_CST)) {                        \
		}                                                                                          \
		return old;                                                                                \
	}                                                                                              \
	inline T atomicMin(T* p, T v) {                                                                \
		T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                              \
		while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST,         \
		                                               __ATOMIC_SEQ_CST)) {                        \
		}                                                                                          \
		return old;                                                                                \
	}
LSP_SIM_ATOMIC_INT(int)
LSP_SIM_ATOMIC_INT(unsigned int)
LSP_SIM_ATOMIC_INT(unsigned long long)
LSP_SIM_ATOMIC_INT(long long)
#undef LSP_SIM_ATOMIC_INT
inline unsigned atomicInc(unsigned* p, unsigned limit) {
	unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
	while (!__atomic_compare_exchange_n(p, &old, old >= limit ? 0u : old + 1u, true, __ATOMIC_SEQ_CST,
	                                    __ATOMIC_SEQ_CST)) {
	}
	return old;
}
float atomicAdd(float*, float) = delete;   /* not deterministic: use a fixed-order reduction */
double atomicAdd(double*, double) = delete; /* not deterministic: use a fixed-order reduction */
__half atomicAdd(__half*, __half) = delete;
__nv_bfloat16 atomicAdd(__nv_bfloat16*, __nv_bfloat16) = delete;
__half2 atomicAdd(__half2*, __half2) = delete;
__nv_bfloat162 atomicAdd(__nv_bfloat162*, __nv_bfloat162) = delete;

/* ---- math intrinsics (C library; the GPU's fast versions are less exact) ---- */

inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
inline double __longlong_as_double(long long i) { double x; std::memcpy(&x, &i, 8); return x; }
inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
inline int __float2int_rz(float x) { return int(x); }
inline int __float2int_rd(float x) { return int(floorf(x)); }
inline int __float2int_ru(float x) { return int(ceilf(x)); }
inline unsigned __float2uint_rn(float x) { return unsigned(nearbyintf(x)); }
inline unsigned __float2uint_rz(float x) { return unsigned(x); }
inline float __int2float_rn(int i) { return float(i); }
inline float __uint2float_rn(unsigned i) { return float(i); }
inline float __ll2float_rn(long long i) { return float(i); }
inline float __ull2float_rn(unsigned long long i) { return float(i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
	x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
	x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
	x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
	x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
	return (x >> 16) | (x << 16);
}
inline int __mul24(int x, int y) { return int((long long)((x << 8) >> 8) * ((y << 8) >> 8)); }
inline unsigned __umul24(unsigned x, unsigned y) { return (x & 0xFFFFFFu) * (y & 0xFFFFFFu); }
inline int __mulhi(int x, int y) { return int(((long long)x * y) >> 32); }
inline unsigned __umulhi(unsigned x, unsigned y) { return unsigned(((unsigned long long)x * y) >> 32); }
inline long long __mul64hi(long long x, long long y) { return (long long)(((__int128)x * y) >> 64); }
inline unsigned long long __umul64hi(unsigned long long x, unsigned long long y) {
	return (unsigned long long)(((unsigned __int128)x * y) >> 64);
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
	unsigned long long v = ((unsigned long long)hi << 32) | lo;
	return unsigned((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
	unsigned long long v = ((unsigned long long)hi << 32) | lo;
	return unsigned(v >> (s & 31));
}

/* CUDA's min and max accept mixed arithmetic types (usual conversions). */
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
inline typename std::common_type<A, B>::type min(A a, B b) {
	typedef typename std::common_type<A, B>::type C;
	return C(b) < C(a) ? C(b) : C(a);
}
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
inline typename std::common_type<A, B>::type max(A a, B b) {
	typedef typename std::common_type<A, B>::type C;
	return C(a) < C(b) ? C(b) : C(a);
}

#include "wmma.h"

#endif /* LSP_SIM_H */
