/*
 * tile.cuh: the register tile of the 64 x 64 SIMT fp32 products, shared by
 * sparse.cu's S (S = A B) and dense.cu (lsp_dense_gemm, lsp_dense_apply);
 * included by .cu files only, every name has internal linkage.
 *
 * A 256-thread block owns a 64 x 64 output tile, thread (tx, ty) = (tid %
 * 16, tid / 16) the 4 x 4 outputs at rows ty + 16i and columns tx + 16j
 * (i, j < 4), summed in registers (acc[i][j]). The caller stages slices of
 * K in shared memory as As[k][row] and Bs[k][col] (fp32, zero past the
 * matrix) and calls lsp_tile_slice once per slice, between its barriers:
 * every thread adds the slice's products to each of its sums in k order.
 * kExact: each product rounded before its add (__fmul_rn, __fadd_rn:
 * never an FMA, the CPU references' bits on a GPU too); otherwise nvcc may
 * contract them into FMAs (the simulator's g++ does not: same bits there).
 * lsp_tile_store hands each output inside M x N to a functor.
 *
 * Limits: blockDim.x == 256 (kTileThreads); no shared memory or
 * barriers of its own.
 */
#ifndef LSP_TILE_CUH
#define LSP_TILE_CUH

#include "common.cuh"

#include <type_traits>

namespace {

constexpr int kTile = 64;          // output tile rows and columns
constexpr int kTileThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each

__device__ __forceinline__ void lsp_tile_zero(float (&acc)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
}

// lsp_tile_slice adds the products of one staged slice (As, Bs: float
// [k][>= 64] arrays with the same k) to acc.
template <bool kExact, typename SA, typename SB>
__device__ __forceinline__ void lsp_tile_slice(float (&acc)[4][4], const SA& As, const SB& Bs) {
  static_assert(std::extent<SA, 0>::value == std::extent<SB, 0>::value, "slices of A and B must be as deep");
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int k = 0; k < static_cast<int>(std::extent<SA, 0>::value); k++) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; i++) av[i] = As[k][ty + 16 * i];
#pragma unroll
    for (int j = 0; j < 4; j++) bv[j] = Bs[k][tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        if (kExact)
          acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(av[i], bv[j]));
        else
          acc[i][j] += av[i] * bv[j];
      }
  }
}

// lsp_tile_store calls out(row, col, acc) for each of the thread's outputs
// inside M x N, the block's tile at rows m0.., columns n0...
template <typename Out>
__device__ __forceinline__ void lsp_tile_store(const float (&acc)[4][4], int m0, int n0, int M, int N, const Out& out) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int row = m0 + ty + 16 * i;
    if (row >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int col = n0 + tx + 16 * j;
      if (col < N) out(row, col, acc[i][j]);
    }
  }
}

}  // namespace

#endif
