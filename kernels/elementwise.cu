/*
 * elementwise.cu: the small ops of the Backend contract (train/backend Ops)
 * that touch each element once, each the CPU backend's op of the same name
 * bit for bit (its reference: train/cpu/ref_elementwise.go):
 *
 *   lsp_fill           t[i] = v                           t [n]
 *   lsp_scale          t[i] = t[i] * a                    t [n]
 *   lsp_add            out[i] = a[i] + b[i]               out, a, b [n]
 *   lsp_accumulate     dst[i] = dst[i] + src[i]           dst, src [n]
 *   lsp_add_bias       out[r,j] = out[r,j] + bias[j]      out [N,OC], bias [OC]
 *   lsp_bias_backward  dbias[j] = dbias[j] + s_j          dbias [OC], dout [N,OC]
 *                      s_j = (((0 + dout[0,j]) + dout[1,j]) + ...) + dout[N-1,j]
 *
 * Storage: each tensor has its own dtype flag, named after it (t_bf16,
 * out_bf16, a_bf16, ...: backend.DType, 0 fp32, 1 bf16), in any mix, since
 * the CPU backend accepts any mix. bf16 is widened exactly at load and
 * rounded to nearest even at store by train/bf16's rule (rounding.cuh:
 * NaN keeps its sign and becomes quiet); arithmetic is fp32.
 *
 * Why the results are the CPU's bit for bit: each output is one fp32 add or
 * multiply per element (IEEE round to nearest even on both sides, nothing
 * to contract into an FMA), or, for the bias gradient, the CPU's own
 * sequential fp32 sum over rows 0..N-1 from +0, then one add into dbias.
 * The build keeps denormals (no -ftz, no --use_fast_math), as the CPU does.
 * The one difference is the payload of a NaN made by arithmetic: the GPU
 * returns the canonical NaN where x86 passes an operand's on, so such a
 * result is NaN on both sides but its bits may differ. lsp_fill does no
 * arithmetic: its bits match, NaN included.
 *
 * How: one thread per element, grid-stride over at most 8192 blocks of 256.
 * lsp_add_bias lays a block out as bx columns (32..256, a power of two
 * covering OC when it is small) by 256/bx rows, so each thread loads its
 * bias once and a small OC still fills the block; rows are grid-strided.
 * lsp_bias_backward: the CPU's row order is a sequential fp32 sum that any
 * split or tree would round differently, so one lane adds up each column
 * and the time grows with N (about N dependent adds); what the kernel
 * parallelises is the loading. A block of 8 warps owns 32 columns: warps
 * 1..7 stage the next 128-row tile (coalesced rows of 32 columns, widened
 * to fp32) in shared memory while warp 0 sums the current one; two tiles
 * alternate with one barrier per tile (32 KiB of static shared memory).
 * ceil(OC/32) blocks: a narrow OC leaves most SMs idle.
 *
 * Limits: n, N, OC >= 0 (n 64-bit; N*OC may pass 2^31); n == 0 (N == 0 or
 * OC == 0 for lsp_add_bias) enqueues nothing and NULL pointers are then
 * allowed; lsp_bias_backward with N == 0 still adds +0 to dbias (turning -0
 * into +0 as the CPU does), dout may be NULL then. Aliasing: out may be a
 * or b, src may be dst (the same pointer and dtype: every element is read
 * before it is written, by the same thread); no other overlaps. No
 * atomics: deterministic. Barriers only in lsp_bias_backward.
 */
#include "kernels.h"
#include "rounding.cuh"

#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 8192;

// bf16 travels as its bit pattern (see rounding.cuh).
typedef uint16_t bf16_t;

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const bf16_t* p) { return lsp_bf16_to_f32(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16_t* p, float v) { *p = lsp_f32_to_bf16_rne(v); }

// t[i] = v for i < n. Each thread rounds v to the storage type once (a
// no-op for fp32, which stores v's bits as they came: even a signalling NaN
// survives, as in the CPU's plain assignment).
template <typename T>
__global__ void __launch_bounds__(kThreads) fill_kernel(T* t, float v, long long n) {
  T x;
  st(&x, v);
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads)
    t[i] = x;
}

// t[i] = t[i] * a for i < n.
template <typename T>
__global__ void __launch_bounds__(kThreads) scale_kernel(T* t, float a, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads)
    st(t + i, ld(t + i) * a);
}

// out[i] = a[i] + b[i] for i < n; out may alias a or b, so no __restrict__.
template <typename O, typename A, typename B>
__global__ void __launch_bounds__(kThreads) add_kernel(O* out, const A* a, const B* b, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads)
    st(out + i, ld(a + i) + ld(b + i));
}

// dst[i] = dst[i] + src[i] for i < n (src may alias dst).
template <typename D, typename S>
__global__ void __launch_bounds__(kThreads) accumulate_kernel(D* dst, const S* src, long long n) {
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < n; i += (long long)gridDim.x * kThreads)
    st(dst + i, ld(dst + i) + ld(src + i));
}

// out [N, OC] += bias [OC] on every row. Block: blockDim.x columns by
// blockDim.y rows; blockIdx.x picks the column slab, rows grid-stride over
// blockIdx.y.
template <typename O, typename Bi>
__global__ void __launch_bounds__(kThreads) add_bias_kernel(O* out, const Bi* bias, int N, int OC) {
  const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= OC) return;  // no barrier below
  const float b = ld(bias + j);
  const long long row_step = (long long)gridDim.y * blockDim.y;
  for (long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y; r < N; r += row_step) {
    O* p = out + r * OC + j;
    st(p, ld(p) + b);
  }
}

// dbias [OC] += column sums of dout [N, OC], in the CPU's order: column j
// is summed over rows 0..N-1 in turn, from +0, in fp32 (train/cpu
// BiasBackward). That chain of adds cannot be split, so the kernel hides
// the loads' latency instead: a block owns 32 columns; warps 1..7 copy
// the next kBBRows x 32 tile of dout (widened to fp32) into shared memory
// while warp 0, lane = column, adds up the current tile row by row; the
// two tiles alternate, one barrier per tile.
constexpr int kBBRows = 128;
constexpr int kBBWarps = 8;
constexpr int kBBThreads = 32 * kBBWarps;

template <typename D, typename G>
__global__ void __launch_bounds__(kBBThreads) bias_backward_kernel(D* dbias, const G* dout, int N, int OC) {
  __shared__ float tile[2][kBBRows][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long long j = (long long)blockIdx.x * 32 + lane;
  const bool in_col = j < OC;
  const int tiles = (int)(((long long)N + kBBRows - 1) / kBBRows);
  // Loader warp w copies rows w-1, w-1+7, ... of tile t into buffer b
  // (0 for columns past OC, which warp 0 never stores).
  auto load = [&](int t, int b) {
    const long long r0 = (long long)t * kBBRows;
    const int rows = (int)(N - r0 < kBBRows ? N - r0 : kBBRows);
#pragma unroll 4
    for (int r = warp - 1; r < rows; r += kBBWarps - 1)
      tile[b][r][lane] = in_col ? ld(dout + (r0 + r) * OC + j) : 0.0f;
  };
  if (warp > 0 && tiles > 0) load(0, 0);
  __syncthreads();  // tile 0 is in buffer 0
  float s = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    if (warp > 0) {
      if (t + 1 < tiles) load(t + 1, (t + 1) & 1);
    } else {
      const long long r0 = (long long)t * kBBRows;
      const int rows = (int)(N - r0 < kBBRows ? N - r0 : kBBRows);
      const float(*cur)[32] = tile[t & 1];
#pragma unroll 8
      for (int r = 0; r < rows; ++r) s += cur[r][lane];
    }
    __syncthreads();  // tile t+1 is loaded, and warp 0 is done with tile t's buffer
  }
  if (warp == 0 && in_col) st(dbias + j, ld(dbias + j) + s);
}

dim3 flat_grid(long long n) {
  const long long b = (n + kThreads - 1) / kThreads;
  return dim3((unsigned)(b < kMaxBlocks ? b : kMaxBlocks));
}

// The launchers dispatch on the dtype flags through these: each maps
// (flag, pointer) to the storage type and calls the next level.
template <typename T>
cudaError_t launch_fill(void* t, float v, long long n, cudaStream_t stream) {
  auto kernel = fill_kernel<T>;
  LSP_LAUNCH(kernel, flat_grid(n), dim3(kThreads), 0, stream, (T*)t, v, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_scale(void* t, float a, long long n, cudaStream_t stream) {
  auto kernel = scale_kernel<T>;
  LSP_LAUNCH(kernel, flat_grid(n), dim3(kThreads), 0, stream, (T*)t, a, n);
  return cudaGetLastError();
}

template <typename O, typename A, typename B>
cudaError_t launch_add(void* out, const void* a, const void* b, long long n, cudaStream_t stream) {
  auto kernel = add_kernel<O, A, B>;
  LSP_LAUNCH(kernel, flat_grid(n), dim3(kThreads), 0, stream, (O*)out, (const A*)a, (const B*)b, n);
  return cudaGetLastError();
}

template <typename O, typename A>
cudaError_t add_b(void* out, const void* a, const void* b, long long n, int b_bf16, cudaStream_t stream) {
  return b_bf16 ? launch_add<O, A, bf16_t>(out, a, b, n, stream) : launch_add<O, A, float>(out, a, b, n, stream);
}

template <typename O>
cudaError_t add_a(void* out, const void* a, const void* b, long long n, int a_bf16, int b_bf16,
                  cudaStream_t stream) {
  return a_bf16 ? add_b<O, bf16_t>(out, a, b, n, b_bf16, stream) : add_b<O, float>(out, a, b, n, b_bf16, stream);
}

template <typename D, typename S>
cudaError_t launch_accumulate(void* dst, const void* src, long long n, cudaStream_t stream) {
  auto kernel = accumulate_kernel<D, S>;
  LSP_LAUNCH(kernel, flat_grid(n), dim3(kThreads), 0, stream, (D*)dst, (const S*)src, n);
  return cudaGetLastError();
}

// add_bias_shape picks the block layout and grid of lsp_add_bias.
void add_bias_shape(int N, int OC, dim3* grid, dim3* block) {
  int bx = 32;
  while (bx < kThreads && bx < OC) bx *= 2;
  const int by = kThreads / bx;
  const long long gx = ((long long)OC + bx - 1) / bx;  // <= 2^26: within grid.x's limit
  long long gy = ((long long)N + by - 1) / by;
  long long cap = kMaxBlocks / gx;
  if (cap > 65535) cap = 65535;  // grid.y's limit
  if (cap < 1) cap = 1;
  if (gy > cap) gy = cap;
  *grid = dim3((unsigned)gx, (unsigned)gy);
  *block = dim3((unsigned)bx, (unsigned)by);
}

template <typename O, typename Bi>
cudaError_t launch_add_bias(void* out, const void* bias, int N, int OC, cudaStream_t stream) {
  dim3 grid, block;
  add_bias_shape(N, OC, &grid, &block);
  auto kernel = add_bias_kernel<O, Bi>;
  LSP_LAUNCH(kernel, grid, block, 0, stream, (O*)out, (const Bi*)bias, N, OC);
  return cudaGetLastError();
}

template <typename D, typename G>
cudaError_t launch_bias_backward(void* dbias, const void* dout, int N, int OC, cudaStream_t stream) {
  const dim3 grid((unsigned)(((long long)OC + 31) / 32));
  auto kernel = bias_backward_kernel<D, G>;
  LSP_LAUNCH(kernel, grid, dim3(kBBThreads), 0, stream, (D*)dbias, (const G*)dout, N, OC);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t lsp_fill(void* t, float v, long long n, int t_bf16, cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(t_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (t == nullptr) return cudaErrorInvalidValue;
  return t_bf16 ? launch_fill<bf16_t>(t, v, n, stream) : launch_fill<float>(t, v, n, stream);
}

extern "C" cudaError_t lsp_scale(void* t, float a, long long n, int t_bf16, cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(t_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (t == nullptr) return cudaErrorInvalidValue;
  return t_bf16 ? launch_scale<bf16_t>(t, a, n, stream) : launch_scale<float>(t, a, n, stream);
}

extern "C" cudaError_t lsp_add(void* out, const void* a, const void* b, long long n, int out_bf16, int a_bf16,
                               int b_bf16, cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(out_bf16) || lsp_bad_dtype(a_bf16) || lsp_bad_dtype(b_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (out == nullptr || a == nullptr || b == nullptr) return cudaErrorInvalidValue;
  return out_bf16 ? add_a<bf16_t>(out, a, b, n, a_bf16, b_bf16, stream)
                  : add_a<float>(out, a, b, n, a_bf16, b_bf16, stream);
}

extern "C" cudaError_t lsp_accumulate(void* dst, const void* src, long long n, int dst_bf16, int src_bf16,
                                      cudaStream_t stream) {
  if (n < 0 || lsp_bad_dtype(dst_bf16) || lsp_bad_dtype(src_bf16)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (dst_bf16) {
    return src_bf16 ? launch_accumulate<bf16_t, bf16_t>(dst, src, n, stream)
                    : launch_accumulate<bf16_t, float>(dst, src, n, stream);
  }
  return src_bf16 ? launch_accumulate<float, bf16_t>(dst, src, n, stream)
                  : launch_accumulate<float, float>(dst, src, n, stream);
}

extern "C" cudaError_t lsp_add_bias(void* out, const void* bias, int N, int OC, int out_bf16, int bias_bf16,
                                    cudaStream_t stream) {
  if (N < 0 || OC < 0 || lsp_bad_dtype(out_bf16) || lsp_bad_dtype(bias_bf16)) return cudaErrorInvalidValue;
  if (N == 0 || OC == 0) return cudaSuccess;
  if (out == nullptr || bias == nullptr) return cudaErrorInvalidValue;
  if (out_bf16) {
    return bias_bf16 ? launch_add_bias<bf16_t, bf16_t>(out, bias, N, OC, stream)
                     : launch_add_bias<bf16_t, float>(out, bias, N, OC, stream);
  }
  return bias_bf16 ? launch_add_bias<float, bf16_t>(out, bias, N, OC, stream)
                   : launch_add_bias<float, float>(out, bias, N, OC, stream);
}

extern "C" cudaError_t lsp_bias_backward(void* dbias, const void* dout, int N, int OC, int dbias_bf16,
                                         int dout_bf16, cudaStream_t stream) {
  if (N < 0 || OC < 0 || lsp_bad_dtype(dbias_bf16) || lsp_bad_dtype(dout_bf16)) return cudaErrorInvalidValue;
  if (OC == 0) return cudaSuccess;
  if (dbias == nullptr || (N > 0 && dout == nullptr)) return cudaErrorInvalidValue;
  if (dbias_bf16) {
    return dout_bf16 ? launch_bias_backward<bf16_t, bf16_t>(dbias, dout, N, OC, stream)
                     : launch_bias_backward<bf16_t, float>(dbias, dout, N, OC, stream);
  }
  return dout_bf16 ? launch_bias_backward<float, bf16_t>(dbias, dout, N, OC, stream)
                   : launch_bias_backward<float, float>(dbias, dout, N, OC, stream);
}
