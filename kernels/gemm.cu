/*
 * gemm.cu: batched GEMM on tensor cores through nvcuda::wmma (bf16 inputs,
 * fp32 accumulation), with an optional bias + GELU epilogue and fp32 or bf16
 * output.
 *
 *   C[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b])    b < batch
 *   epilogue(x) = gelu(x + bias[n])   (bias and gelu each optional)
 *
 * All matrices are row-major and packed, as in the CPU backend's Gemm
 * (train/cpu/ref_gemm.go): op(A) is M x K, op(B) is K x N, C is M x N (ldc = N).
 *   A: transA == 0: [M][K] (lda = K)    transA != 0: [K][M] (lda = M)
 *   B: transB == 0: [K][N] (ldb = N)    transB != 0: [N][K] (ldb = K)
 * The models store a weight W in x out, so their forward is NN (out = inp W;
 * the head over a tied embedding, out = h wte^T, is NT), the input gradient
 * NT (dinp = dout W^T) and the weight gradient TN (dW = inp^T dout): the
 * three layouts they need; TT works too. Batch b starts at
 * A + b*strideA, B + b*strideB, C + b*strideC (elements; a stride of 0
 * broadcasts). bias is bf16 of length N and shared by all batches. gelu is
 * HF's gelu_new, the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))), computed as x / (1 + exp(-2u)) like the CPU backend. beta == 0
 * means C is not read (NaNs there are ignored). bf16 output is rounded to
 * nearest even once, after the whole epilogue in fp32.
 *
 * Launcher (declared in kernels.h):
 *   cudaError_t lsp_gemm_bf16(int transA, int transB, int M, int N, int K,
 *       float alpha, const __nv_bfloat16* A, long long strideA,
 *       const __nv_bfloat16* B, long long strideB, float beta, void* C,
 *       int c_is_bf16, long long strideC, int batch,
 *       const __nv_bfloat16* bias, int gelu, cudaStream_t stream);
 * C is float* (c_is_bf16 == 0) or __nv_bfloat16*; bias may be NULL.
 *
 * The same GEMM with a quantized B (QLoRA's frozen base, backend.Quant):
 *
 *   C = alpha * A op(W) + beta * C        (no batch, bias or GELU)
 *
 *   cudaError_t lsp_gemm_q(int transW, int M, int N, int K, float alpha,
 *       const __nv_bfloat16* A, int format, const unsigned char* codes,
 *       const unsigned char* absmax, const float* scale, const float* book,
 *       float beta, void* C, int c_is_bf16, cudaStream_t stream);
 * A is [M][K] (untransposed only); W, of K*N elements, is stored [K][N]
 * (transW == 0: the forward, out = inp W) or [N][K] (transW != 0: the input
 * gradient, dinp = dout W^T); format 1 NF4, 2 Int8, the storage as
 * quant.cuh reads it (scale groups from K*N). W is dequantized inside the
 * operand loads: each 8-element chunk of a B tile that is 8-aligned in W
 * and whole (hence in one 64-block) is fetched as its code words, absmax
 * code and group scale with the other global loads of the next slice, and
 * decoded after the tensor-core work on the current one, as it is written
 * to shared memory (one absmax for the 8 values, the codebook staged in
 * shared memory); other chunks (W's rows not a multiple of 8 long, tile
 * edges, a codes pointer not 4-byte aligned) are decoded element by
 * element at load. Each value is rounded to bf16 (nearest even) as the
 * tensor cores' operand: the values of train/cpu's GemmQ bit for bit (fp32
 * ops with __fmul_rn/__fadd_rn, never contracted), only the sum's order
 * differs, as in lsp_gemm_bf16.
 *
 * How: each 256-thread block computes a 128 x 128 tile of C; its 8 warps
 * (4 along M, 2 along N) each own 32 x 64 as 2 x 4 wmma 16x16x16
 * accumulators. K advances in slices of 32 through two shared-memory
 * stages (double buffering): the global loads of slice k+1 go to registers
 * before the tensor-core work on slice k and land in the other stage after
 * it, so one barrier per slice suffices. Tiles keep the global layout (a
 * transposed operand is read as a col_major fragment), so global loads are
 * coalesced and 16 bytes wide when the operand is 16-byte aligned with a
 * leading dimension (and batch stride) that is a multiple of 8; otherwise
 * they fall back to 2-byte loads. Partial tiles are zero-filled and every
 * store is bounds-checked, so any M, N >= 1 and K >= 0 work. The epilogue
 * goes through shared memory (fragments are stored with
 * store_matrix_sync, never indexed), one 16 x 64 strip per warp at a time.
 *
 * Limits: sm_80 or newer (bf16 wmma); M, N, K, batch >= 0 (M, N or batch
 * of 0 launches nothing; K of 0 gives beta * C through the epilogue);
 * ceil(M/128) <= 65535 and batch <= 65535 (grid y and z); C must not
 * overlap A, B or bias. Dynamic shared memory: 40 KiB + 16 bytes per block
 * (lsp_gemm_q: + 1088 bytes of codebook; both under the 48 KiB default, so
 * no opt-in is needed); 126-128 registers a thread on sm_80 and sm_90
 * (lsp_gemm_q's kernels too), no spills. Deterministic: each output is summed by one
 * warp in a fixed order, no atomics.
 *
 * Checked in the compiled code by `make kernel-report` (kernels/internal/kreport):
 * tensor cores (gemm_bf16_nn_kernel, gemm_bf16_nt_kernel, gemm_bf16_tn_kernel, gemm_bf16_tt_kernel):
 * tensor cores (gemm_q_nn_kernel, gemm_q_nt_kernel): HMMA inside the K loop on every architecture.
 */
#include "kernels.h"
#include "quant.cuh"

#include <stdint.h>

#include <type_traits>

namespace {

using namespace nvcuda;

constexpr int kBM = 128;       // block tile rows (M)
constexpr int kBN = 128;       // block tile columns (N)
constexpr int kBK = 32;        // K slice per stage
constexpr int kWarpsM = 4;     // warps along M
constexpr int kWarpsN = 2;     // warps along N
constexpr int kWM = kBM / kWarpsM;  // 32 rows per warp
constexpr int kWN = kBN / kWarpsN;  // 64 columns per warp
constexpr int kFM = kWM / 16;       // 2 fragments along M per warp
constexpr int kFN = kWN / 16;       // 4 fragments along N per warp
constexpr int kThreads = 32 * kWarpsM * kWarpsN;  // 256

// Shared tiles are padded by 8 bf16 (16 bytes) per row against bank
// conflicts; rows stay multiples of 16 bytes (uint4 stores) and fragment
// origins multiples of 32 bytes (wmma's alignment rule).
constexpr int kPad = 8;
// Elements of one operand stage, large enough for either orientation:
// [128][32+8] or [32][128+8].
constexpr int kStageElems = (kBM * (kBK + kPad) > kBK * (kBM + kPad)) ? kBM * (kBK + kPad) : kBK * (kBM + kPad);
// Epilogue staging: one 16 x (64+4) fp32 strip per warp.
constexpr int kStripLd = kWN + 4;
constexpr int kStripFloats = 16 * kStripLd;
constexpr size_t kStagesBytes = 2 * 2 * kStageElems * sizeof(uint16_t);  // 2 stages x (A, B)
static_assert(kWarpsM * kWarpsN * kStripFloats * sizeof(float) <= kStagesBytes, "epilogue strips must fit in the stages");
// wmma wants 32-byte aligned pointers; dynamic shared memory is promised
// 16, so the block rounds its base up and asks for the slack.
constexpr size_t kSmemBytes = kStagesBytes + 16;
// lsp_gemm_q also keeps the codebook (LSP_QBOOK_LEN floats) after the stages.
constexpr size_t kSmemQBytes = kSmemBytes + LSP_QBOOK_LEN * sizeof(float);
static_assert(kSmemQBytes <= 48 * 1024, "lsp_gemm_q must fit the default dynamic shared memory");
static_assert((kStageElems * 2) % 32 == 0, "stages must keep 32-byte alignment");
// Every tile orientation is 512 chunks of 8 bf16: 2 per thread.
constexpr int kChunksPerThread = kBM * kBK / 8 / kThreads;
static_assert(kBM == kBN && kChunksPerThread * kThreads * 8 == kBM * kBK, "tile loaders assume square tiles");

struct GemmParams {
  const uint16_t* A;  // bf16 bits
  const uint16_t* B;
  void* C;
  const uint16_t* bias;  // nullable
  long long strideA, strideB, strideC;
  int M, N, K;
  float alpha, beta;
  int cBF16, gelu;
  int vecA, vecB, vecC;  // wide loads / stores allowed (alignment checked by the launcher)
  // lsp_gemm_q: B is a quantized matrix (quant.cuh) of K*N elements, stored
  // [K][N] or, transposed, [N][K]; p.B is unused.
  const unsigned char* codes;
  const unsigned char* absmax;
  const float* scale;  // groups scales, then the offset
  const float* book;   // LSP_QBOOK_LEN floats
  long long groups;
  int format;  // LSP_QFORMAT_NF4 or LSP_QFORMAT_INT8
  int vecQ;    // codes is 4-byte aligned: chunks are read as 32-bit words
};

// bf16 <-> fp32 through the raw bits, with the host+device conversions
// of cuda_bf16.h (rounding to nearest even).
__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) {
  __nv_bfloat16_raw r;
  r.x = h;
  return __bfloat162float(__nv_bfloat16(r));
}

__device__ __forceinline__ uint32_t float_to_bf16_bits(float x) {
  const __nv_bfloat16_raw r = __float2bfloat16_rn(x);
  return r.x;
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.0f + expf(-2.0f * u));  // == 0.5 x (1 + tanh(u))
}

// load_tile fetches a ROWS x COLS tile (COLS contiguous in memory) whose
// origin is (r0, c0) of a row-major matrix g with leading dimension ld and
// bounds rmax x cmax into registers: 8 bf16 per chunk, zero outside.
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile(uint4 (&reg)[kChunksPerThread], const uint16_t* __restrict__ g, long long ld,
                                          int r0, int c0, int rmax, int cmax, bool vec) {
  static_assert(ROWS * COLS == kChunksPerThread * kThreads * 8, "tile size");
  constexpr int kChunksPerRow = COLS / 8;
#pragma unroll
  for (int i = 0; i < kChunksPerThread; i++) {
    const int id = i * kThreads + threadIdx.x;
    const int r = r0 + id / kChunksPerRow;
    const int c = c0 + (id % kChunksPerRow) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rmax) {
      const uint16_t* p = g + (long long)r * ld + c;
      if (vec && c + 8 <= cmax) {
        v = *reinterpret_cast<const uint4*>(p);
      } else {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) {
          if (c + j < cmax) w[j / 2] |= (uint32_t)p[j] << (16 * (j % 2));
        }
        v = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    reg[i] = v;
  }
}

// store_tile writes the registers of load_tile<ROWS, COLS> to a shared
// tile [ROWS][COLS + kPad].
template <int ROWS, int COLS>
__device__ __forceinline__ void store_tile(uint16_t* s, const uint4 (&reg)[kChunksPerThread]) {
  constexpr int kChunksPerRow = COLS / 8;
#pragma unroll
  for (int i = 0; i < kChunksPerThread; i++) {
    const int id = i * kThreads + threadIdx.x;
    const int r = id / kChunksPerRow;
    const int c = (id % kChunksPerRow) * 8;
    *reinterpret_cast<uint4*>(s + r * (COLS + kPad) + c) = reg[i];
  }
}

// Operand A: op(A) is M x K. Untransposed the tile is [BM][BK] (m rows),
// transposed it is [BK][BM] (k rows) and read as a col_major fragment.
template <bool TA>
__device__ __forceinline__ void load_a(uint4 (&reg)[kChunksPerThread], const GemmParams& p, const uint16_t* A, int m0,
                                       int k0) {
  if (TA) {
    load_tile<kBK, kBM>(reg, A, p.M, k0, m0, p.K, p.M, p.vecA);
  } else {
    load_tile<kBM, kBK>(reg, A, p.K, m0, k0, p.M, p.K, p.vecA);
  }
}

// Operand B: op(B) is K x N. Untransposed the tile is [BK][BN] (k rows),
// transposed it is [BN][BK] (n rows) and read as a col_major fragment.
template <bool TB>
__device__ __forceinline__ void load_b(uint4 (&reg)[kChunksPerThread], const GemmParams& p, const uint16_t* B, int n0,
                                       int k0) {
  if (TB) {
    load_tile<kBN, kBK>(reg, B, p.K, n0, k0, p.N, p.K, p.vecB);
  } else {
    load_tile<kBK, kBN>(reg, B, p.N, k0, n0, p.K, p.N, p.vecB);
  }
}

// load_tile_q is load_tile for lsp_gemm_q's quantized B: the elements
// (r, c) .. (r, c+7) of a chunk are elements i = r*ld + c .. i+7 of the
// quantized matrix. A chunk that is whole, inside the matrix and 8-aligned
// in it (hence in one 64-block; quant.cuh) is only loaded here, as its code
// words (.x, .y), its absmax code (.z) and its group's scale (.w), with its
// bit set in fast: store_tile_q decodes it after the tensor-core work, so
// the global loads overlap the math as the bf16 tiles' do. Any other chunk
// is decoded element by element now (codebook read from global memory:
// the shared copy may not be complete yet) to bf16 bits, zero outside.
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile_q(uint4 (&reg)[kChunksPerThread], unsigned& fast, const GemmParams& p,
                                            long long ld, int r0, int c0, int rmax, int cmax) {
  static_assert(ROWS * COLS == kChunksPerThread * kThreads * 8, "tile size");
  constexpr int kChunksPerRow = COLS / 8;
  fast = 0;
#pragma unroll
  for (int ci = 0; ci < kChunksPerThread; ci++) {
    const int id = ci * kThreads + threadIdx.x;
    const int r = r0 + id / kChunksPerRow;
    const int c = c0 + (id % kChunksPerRow) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rmax) {
      const long long i = (long long)r * ld + c;
      if (p.vecQ && c + 8 <= cmax && (i & 7) == 0) {
        uint32_t w0, w1;
        lsp_q_words(p.format, p.codes, i, w0, w1);
        const long long b = i / LSP_QBLOCK;
        v = make_uint4(w0, w1, __ldg(p.absmax + b), __float_as_uint(__ldg(p.scale + b / LSP_QGROUP)));
        fast |= 1u << ci;
      } else {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) {
          if (c + j < cmax) {
            const float x = lsp_q_value(p.format, p.book, p.codes, p.absmax, p.scale, p.groups, i + j);
            w[j / 2] |= (uint32_t)lsp_f32_to_bf16_rne(x) << (16 * (j % 2));
          }
        }
        v = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    reg[ci] = v;
  }
}

// store_tile_q writes the registers of load_tile_q<ROWS, COLS> to a shared
// tile [ROWS][COLS + kPad] as bf16 bits, decoding the fast chunks with the
// shared codebook (book) and the matrix's absmax offset.
template <int ROWS, int COLS>
__device__ __forceinline__ void store_tile_q(uint16_t* s, const uint4 (&reg)[kChunksPerThread], unsigned fast,
                                             int format, const float* book, float offset) {
  constexpr int kChunksPerRow = COLS / 8;
#pragma unroll
  for (int ci = 0; ci < kChunksPerThread; ci++) {
    const int id = ci * kThreads + threadIdx.x;
    const int r = id / kChunksPerRow;
    const int c = (id % kChunksPerRow) * 8;
    uint4 v = reg[ci];
    if (fast & (1u << ci)) {
      const float a = lsp_q_absmax_of(book[v.z], __uint_as_float(v.w), offset);
      float x[8];
      lsp_q_decode8(format, book, v.x, v.y, a, x);
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        w[j] = (uint32_t)lsp_f32_to_bf16_rne(x[2 * j]) | (uint32_t)lsp_f32_to_bf16_rne(x[2 * j + 1]) << 16;
      }
      v = make_uint4(w[0], w[1], w[2], w[3]);
    }
    *reinterpret_cast<uint4*>(s + r * (COLS + kPad) + c) = v;
  }
}

// The quantized B operand: op(B) is K x N; stored [K][N] the tile is
// [BK][BN] (k rows), stored [N][K] (TB) it is [BN][BK] (n rows), as load_b.
template <bool TB>
__device__ __forceinline__ void load_bq(uint4 (&reg)[kChunksPerThread], unsigned& fast, const GemmParams& p, int n0,
                                        int k0) {
  if (TB) {
    load_tile_q<kBN, kBK>(reg, fast, p, p.K, n0, k0, p.N, p.K);
  } else {
    load_tile_q<kBK, kBN>(reg, fast, p, p.N, k0, n0, p.K, p.N);
  }
}

template <bool TB>
__device__ __forceinline__ void store_bq(uint16_t* s, const uint4 (&reg)[kChunksPerThread], unsigned fast,
                                         const GemmParams& p, const float* book, float offset) {
  if (TB) {
    store_tile_q<kBN, kBK>(s, reg, fast, p.format, book, offset);
  } else {
    store_tile_q<kBK, kBN>(s, reg, fast, p.format, book, offset);
  }
}

template <bool TA>
__device__ __forceinline__ void store_a(uint16_t* s, const uint4 (&reg)[kChunksPerThread]) {
  if (TA) {
    store_tile<kBK, kBM>(s, reg);
  } else {
    store_tile<kBM, kBK>(s, reg);
  }
}

template <bool TB>
__device__ __forceinline__ void store_b(uint16_t* s, const uint4 (&reg)[kChunksPerThread]) {
  if (TB) {
    store_tile<kBN, kBK>(s, reg);
  } else {
    store_tile<kBK, kBN>(s, reg);
  }
}

// epilogue_value applies alpha, beta * C, bias and GELU to one sum.
__device__ __forceinline__ float epilogue_value(const GemmParams& p, float acc, const void* C, long long idx, int col) {
  float v = p.alpha * acc;
  if (p.beta != 0.0f) {
    const float c = p.cBF16 ? bf16_bits_to_float(static_cast<const uint16_t*>(C)[idx]) : static_cast<const float*>(C)[idx];
    v += p.beta * c;
  }
  if (p.bias != nullptr) v += bf16_bits_to_float(p.bias[col]);
  if (p.gelu) v = gelu_tanh(v);
  return v;
}

// store4 writes the four outputs v at C[idx..idx+4) (columns col..col+4),
// only those with a column below N; with vec (aligned, N % 4 == 0) as one
// wide store.
__device__ __forceinline__ void store4(const GemmParams& p, void* C, long long idx, int col, const float (&v)[4]) {
  if (p.vecC && col + 4 <= p.N) {
    if (p.cBF16) {
      const uint2 w = make_uint2(float_to_bf16_bits(v[0]) | float_to_bf16_bits(v[1]) << 16,
                                 float_to_bf16_bits(v[2]) | float_to_bf16_bits(v[3]) << 16);
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(C) + idx) = w;
    } else {
      *reinterpret_cast<float4*>(static_cast<float*>(C) + idx) = make_float4(v[0], v[1], v[2], v[3]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; j++) {
    if (col + j >= p.N) break;
    if (p.cBF16) {
      static_cast<uint16_t*>(C)[idx + j] = (uint16_t)float_to_bf16_bits(v[j]);
    } else {
      static_cast<float*>(C)[idx + j] = v[j];
    }
  }
}

// gemm_body computes one block's tile. Q: B is lsp_gemm_q's quantized
// matrix, decoded to bf16 as its tiles are loaded by load_bq and store_bq,
// with the codebook staged in shared memory after the stages: kSmemQBytes.
template <bool TA, bool TB, bool Q = false>
__device__ __forceinline__ void gemm_body(const GemmParams& p, unsigned char* dyn) {
  float* smem = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(dyn) + 31) & ~uintptr_t(31));
  using LayoutA = typename std::conditional<TA, wmma::col_major, wmma::row_major>::type;
  using LayoutB = typename std::conditional<TB, wmma::col_major, wmma::row_major>::type;
  constexpr int ldsA = TA ? kBM + kPad : kBK + kPad;
  constexpr int ldsB = TB ? kBK + kPad : kBN + kPad;

  uint16_t* stages = reinterpret_cast<uint16_t*>(smem);
  // Stage s: A at stages + (2s) * kStageElems, B at stages + (2s+1) * kStageElems.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const long long b = blockIdx.z;
  const uint16_t* A = p.A + b * p.strideA;
  const uint16_t* B = p.B + b * p.strideB;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFM][kFN];
#pragma unroll
  for (int i = 0; i < kFM; i++) {
#pragma unroll
    for (int j = 0; j < kFN; j++) wmma::fill_fragment(acc[i][j], 0.0f);
  }

  const int nk = (p.K + kBK - 1) / kBK;
  uint4 ra[kChunksPerThread], rb[kChunksPerThread];
  unsigned fastB = 0;  // Q: the chunks of rb that store_bq decodes
  float* book = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(smem) + kStagesBytes);
  float offset = 0.0f;  // Q: the absmax offset, scale[groups]
  if (Q && nk > 0) {
    for (int i = threadIdx.x; i < LSP_QBOOK_LEN; i += kThreads) book[i] = __ldg(p.book + i);
    offset = __ldg(p.scale + p.groups);
  }
  if (nk > 0) {
    load_a<TA>(ra, p, A, m0, 0);
    if constexpr (Q) {
      load_bq<TB>(rb, fastB, p, n0, 0);
      __syncthreads();  // the codebook is staged
      store_bq<TB>(stages + kStageElems, rb, fastB, p, book, offset);
    } else {
      load_b<TB>(rb, p, B, n0, 0);
      store_b<TB>(stages + kStageElems, rb);
    }
    store_a<TA>(stages, ra);
  }
  __syncthreads();  // stage 0 is complete

  for (int kt = 0; kt < nk; kt++) {
    const int cur = kt & 1;
    const bool more = kt + 1 < nk;
    if (more) {  // issue the global loads of slice kt+1 before the math on slice kt
      load_a<TA>(ra, p, A, m0, (kt + 1) * kBK);
      if constexpr (Q) {
        load_bq<TB>(rb, fastB, p, n0, (kt + 1) * kBK);
      } else {
        load_b<TB>(rb, p, B, n0, (kt + 1) * kBK);
      }
    }
    const uint16_t* sA = stages + (2 * cur) * kStageElems;
    const uint16_t* sB = stages + (2 * cur + 1) * kStageElems;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> fa[kFM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb[kFN];
#pragma unroll
      for (int i = 0; i < kFM; i++) {
        const int m = wm * kWM + i * 16;
        const uint16_t* src = TA ? sA + kk * ldsA + m : sA + m * ldsA + kk;
        wmma::load_matrix_sync(fa[i], reinterpret_cast<const __nv_bfloat16*>(src), ldsA);
      }
#pragma unroll
      for (int j = 0; j < kFN; j++) {
        const int n = wn * kWN + j * 16;
        const uint16_t* src = TB ? sB + n * ldsB + kk : sB + kk * ldsB + n;
        wmma::load_matrix_sync(fb[j], reinterpret_cast<const __nv_bfloat16*>(src), ldsB);
      }
#pragma unroll
      for (int i = 0; i < kFM; i++) {
#pragma unroll
        for (int j = 0; j < kFN; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    if (more) {  // the other stage was last read in iteration kt-1, before its barrier
      store_a<TA>(stages + (2 * (cur ^ 1)) * kStageElems, ra);
      if constexpr (Q) {
        store_bq<TB>(stages + (2 * (cur ^ 1) + 1) * kStageElems, rb, fastB, p, book, offset);
      } else {
        store_b<TB>(stages + (2 * (cur ^ 1) + 1) * kStageElems, rb);
      }
    }
    // Slice kt+1 is complete and every warp is done with slice kt (whose
    // stage is overwritten next iteration, or by the epilogue strips).
    __syncthreads();
  }

  // Epilogue: each warp stages one 16 x 64 strip of its accumulators in its
  // own part of shared memory, then lanes apply the epilogue to 4
  // consecutive columns each (16 lanes per row) and store them.
  float* strip = smem + warp * kStripFloats;
  void* C = p.cBF16 ? static_cast<void*>(static_cast<uint16_t*>(p.C) + b * p.strideC)
                    : static_cast<void*>(static_cast<float*>(p.C) + b * p.strideC);
#pragma unroll
  for (int i = 0; i < kFM; i++) {
#pragma unroll
    for (int j = 0; j < kFN; j++) wmma::store_matrix_sync(strip + j * 16, acc[i][j], kStripLd, wmma::mem_row_major);
    __syncwarp();  // the strip is visible to every lane
    const int rowBase = m0 + wm * kWM + i * 16;
    const int colBase = n0 + wn * kWN;
#pragma unroll
    for (int it = 0; it < 16 * kWN / 4 / 32; it++) {
      const int e = it * 32 + lane;
      const int r = e / (kWN / 4), c = (e % (kWN / 4)) * 4;
      const int row = rowBase + r, col = colBase + c;
      if (row >= p.M || col >= p.N) continue;
      const long long idx = (long long)row * p.N + col;
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        v[q] = col + q < p.N ? epilogue_value(p, strip[r * kStripLd + c + q], C, idx + q, col + q) : 0.0f;
      }
      store4(p, C, idx, col, v);
    }
    __syncwarp();  // every lane has read the strip before the next one overwrites it
  }
}

__global__ void __launch_bounds__(kThreads) gemm_bf16_nn_kernel(GemmParams p) {
  LSP_DYN_SMEM(unsigned char, smem);
  gemm_body<false, false>(p, smem);
}
__global__ void __launch_bounds__(kThreads) gemm_bf16_nt_kernel(GemmParams p) {
  LSP_DYN_SMEM(unsigned char, smem);
  gemm_body<false, true>(p, smem);
}
__global__ void __launch_bounds__(kThreads) gemm_bf16_tn_kernel(GemmParams p) {
  LSP_DYN_SMEM(unsigned char, smem);
  gemm_body<true, false>(p, smem);
}
__global__ void __launch_bounds__(kThreads) gemm_bf16_tt_kernel(GemmParams p) {
  LSP_DYN_SMEM(unsigned char, smem);
  gemm_body<true, true>(p, smem);
}
__global__ void __launch_bounds__(kThreads) gemm_q_nn_kernel(GemmParams p) {
  LSP_DYN_SMEM(unsigned char, smem);
  gemm_body<false, false, true>(p, smem);
}
__global__ void __launch_bounds__(kThreads) gemm_q_nt_kernel(GemmParams p) {
  LSP_DYN_SMEM(unsigned char, smem);
  gemm_body<false, true, true>(p, smem);
}

// wide reports whether 16-byte (bytes == 16) or 8-byte accesses at every
// chunk start are aligned: the base pointer is aligned and both the leading
// dimension and the batch stride keep chunk starts aligned.
bool wide(const void* base, int bytes, long long ld, long long stride, int batch, int elemBytes) {
  const long long per = bytes / elemBytes;  // elements per wide access
  return reinterpret_cast<uintptr_t>(base) % bytes == 0 && ld % per == 0 && (batch == 1 || stride % per == 0);
}

}  // namespace

LSP_DYN_SMEM_BYTES(gemm_bf16_nn_kernel, kSmemBytes);
LSP_DYN_SMEM_BYTES(gemm_bf16_nt_kernel, kSmemBytes);
LSP_DYN_SMEM_BYTES(gemm_bf16_tn_kernel, kSmemBytes);
LSP_DYN_SMEM_BYTES(gemm_bf16_tt_kernel, kSmemBytes);
LSP_DYN_SMEM_BYTES(gemm_q_nn_kernel, kSmemQBytes);
LSP_DYN_SMEM_BYTES(gemm_q_nt_kernel, kSmemQBytes);

extern "C" cudaError_t lsp_gemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const __nv_bfloat16* A,
                                     long long strideA, const __nv_bfloat16* B, long long strideB, float beta, void* C,
                                     int c_is_bf16, long long strideC, int batch, const __nv_bfloat16* bias, int gelu,
                                     cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0 || batch < 0 || strideA < 0 || strideB < 0 || strideC < 0 || lsp_bad_dtype(c_is_bf16))
    return cudaErrorInvalidValue;
  if (M == 0 || N == 0 || batch == 0) return cudaSuccess;
  if (C == nullptr || (K > 0 && (A == nullptr || B == nullptr))) return cudaErrorInvalidValue;
  const long long gm = (M + kBM - 1) / kBM, gn = (N + kBN - 1) / kBN;
  if (gm > 65535 || batch > 65535) return cudaErrorInvalidValue;
  // Batches must not overlap in C (they are written concurrently).
  if (batch > 1 && strideC < (long long)M * N) return cudaErrorInvalidValue;

  GemmParams p;
  p.A = reinterpret_cast<const uint16_t*>(A);
  p.B = reinterpret_cast<const uint16_t*>(B);
  p.C = C;
  p.bias = reinterpret_cast<const uint16_t*>(bias);
  p.strideA = strideA;
  p.strideB = strideB;
  p.strideC = strideC;
  p.M = M;
  p.N = N;
  p.K = K;
  p.alpha = alpha;
  p.beta = beta;
  p.cBF16 = c_is_bf16 != 0;
  p.gelu = gelu != 0;
  p.vecA = wide(A, 16, transA ? M : K, strideA, batch, 2);
  p.vecB = wide(B, 16, transB ? K : N, strideB, batch, 2);
  p.vecC = c_is_bf16 ? wide(C, 8, N, strideC, batch, 2) : wide(C, 16, N, strideC, batch, 4);

  const dim3 grid((unsigned)gn, (unsigned)gm, (unsigned)batch);
  const dim3 block(kThreads);
  if (transA) {
    if (transB) {
      LSP_LAUNCH(gemm_bf16_tt_kernel, grid, block, lsp_dyn_smem_bytes_gemm_bf16_tt_kernel, stream, p);
    } else {
      LSP_LAUNCH(gemm_bf16_tn_kernel, grid, block, lsp_dyn_smem_bytes_gemm_bf16_tn_kernel, stream, p);
    }
  } else {
    if (transB) {
      LSP_LAUNCH(gemm_bf16_nt_kernel, grid, block, lsp_dyn_smem_bytes_gemm_bf16_nt_kernel, stream, p);
    } else {
      LSP_LAUNCH(gemm_bf16_nn_kernel, grid, block, lsp_dyn_smem_bytes_gemm_bf16_nn_kernel, stream, p);
    }
  }
  return cudaGetLastError();
}

extern "C" cudaError_t lsp_gemm_q(int transW, int M, int N, int K, float alpha, const __nv_bfloat16* A, int format,
                                  const unsigned char* codes, const unsigned char* absmax, const float* scale,
                                  const float* book, float beta, void* C, int c_is_bf16, cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0 || lsp_bad_dtype(c_is_bf16) ||
      (format != LSP_QFORMAT_NF4 && format != LSP_QFORMAT_INT8))
    return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (C == nullptr ||
      (K > 0 && (A == nullptr || codes == nullptr || absmax == nullptr || scale == nullptr || book == nullptr)))
    return cudaErrorInvalidValue;
  const long long gm = (M + kBM - 1) / kBM, gn = (N + kBN - 1) / kBN;
  if (gm > 65535) return cudaErrorInvalidValue;

  GemmParams p = {};
  p.A = reinterpret_cast<const uint16_t*>(A);
  p.C = C;
  p.M = M;
  p.N = N;
  p.K = K;
  p.alpha = alpha;
  p.beta = beta;
  p.cBF16 = c_is_bf16 != 0;
  p.vecA = wide(A, 16, K, 0, 1, 2);
  p.vecC = c_is_bf16 ? wide(C, 8, N, 0, 1, 2) : wide(C, 16, N, 0, 1, 4);
  p.codes = codes;
  p.absmax = absmax;
  p.scale = scale;
  p.book = book;
  p.groups = lsp_q_groups((long long)K * N);
  p.format = format;
  p.vecQ = reinterpret_cast<uintptr_t>(codes) % 4 == 0;

  const dim3 grid((unsigned)gn, (unsigned)gm, 1);
  const dim3 block(kThreads);
  if (transW) {
    LSP_LAUNCH(gemm_q_nt_kernel, grid, block, lsp_dyn_smem_bytes_gemm_q_nt_kernel, stream, p);
  } else {
    LSP_LAUNCH(gemm_q_nn_kernel, grid, block, lsp_dyn_smem_bytes_gemm_q_nn_kernel, stream, p);
  }
  return cudaGetLastError();
}
