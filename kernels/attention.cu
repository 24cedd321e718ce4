/*
 * attention.cu: fused causal attention, flash style, forward and backward,
 * with grouped-query heads (GQA: NH query heads share KVH key/value heads,
 * query head h reads key/value head h / (NH/KVH); KVH == NH is multi-head
 * attention, KVH == 1 multi-query) and two layouts of q, k and v.
 *
 * Shapes (llm.c names): B batch, T time, NH query heads, KVH key/value
 * heads (NH % KVH == 0), HS head size, C = NH*HS.
 *   qkv  bf16, q (NH*HS), k (KVH*HS) and v (KVH*HS) of each of the B*T
 *        positions p = b*T + t, laid out as backend.QKVLayout says:
 *          layout 0 (fused, GPT-2's c_attn): one row [q | k | v] per
 *            position, [B,T,(NH+2*KVH)*HS];
 *          layout 1 (planar, LLaMA's three projections): all q
 *            [B,T,NH*HS], then all k [B,T,KVH*HS], then all v.
 *        Query head h of p starts at p*qrow + h*HS, key head g at kbase +
 *        p*kvrow + g*HS, value head g at vbase + p*kvrow + g*HS (AttnIdx,
 *        the arithmetic of backend.QKVLayout.Index).
 *   out  [B,T,C]  bf16: softmax(q k^T * scale, causal) v per query head,
 *        the heads side by side (the layout the output projection reads).
 *   lse  [B,NH,T] fp32: natural-log log-sum-exp of each scaled score row,
 *        saved by the forward so that the backward recomputes P exactly.
 *   dout [B,T,C]  bf16, dqkv bf16 in qkv's layout (written, not
 *        accumulated).
 *   scale = 1/sqrt(HS) (rounded to fp32 as the CPU backend does).
 *   pos  int32 [B,T] or NULL: each token's position within its document
 *        when a row packs several (backend.Positions). Query t attends
 *        keys first..t, first = t - pos[b,t] (0 when pos is NULL), so no
 *        attention crosses a document boundary. Every kernel masks by
 *        that lower bound as by the causal upper one; a tile may then hold
 *        no visible key for a row, and the online softmax treats a row
 *        with no visible key so far as empty (no exp(-inf - -inf)). pos is
 *        trusted (0 <= pos[b,t] <= t; the CPU backend checks it).
 *
 * Forward: one block per (64-query tile, b*NH+h); each of its 4 warps owns
 * 16 query rows and keeps them in wmma fragments. Key/value tiles of 32 rows
 * (of the group's key/value head) stream through shared memory; S = Q K^T
 * runs on tensor cores (bf16 in, fp32 accumulate), the online softmax keeps
 * a running max and sum per row in fp32 and rescales the output
 * accumulator, which lives in registers (each lane owns fixed elements;
 * P V is formed by wmma and handed over through a 16x16 fp32 scratch, never
 * by fragment indexing).
 *
 * Backward (no float atomics, deterministic, two passes):
 *   1. D = rowsum(dO o O) per (b, h, t) into the fp32 scratch [B,NH,T].
 *   2. dK, dV: one block per (64-key tile, b*KVH+g), each warp 16 keys held
 *      in fragments; for each query head h of the group in ascending order,
 *      query tiles of 32 rows stream by: P^T = exp(K Q^T scale - lse),
 *      dP^T = V dO^T, dS^T = P^T o (dP^T - D) scale, dV += P^T dO, dK +=
 *      dS^T Q with fragment accumulators. A key/value head's gradient is
 *      thus the sum over its query heads in a fixed order, in one block
 *      (no atomics, no cross-block reduction); with KVH == NH it is exactly
 *      the per-head computation.
 *   3. dQ: one block per (64-query tile, b*NH+h), key tiles of 32 stream by:
 *      dQ += dS K.
 *   P and dS are rounded to bf16 before their tensor-core products (as in
 *   FlashAttention); every sum accumulates in fp32 in a fixed order.
 *
 * Limits: HS 64 and 128 take the tensor-core path when qkv, out and dout
 * are 16-byte aligned (always so for cudaMalloc'd buffers at offsets that
 * are multiples of 8 elements; every row stride and head offset is then a
 * multiple of 64 elements); every other head size up to 256 (and
 * misaligned views) takes the generic path (one warp per row, plain fp32
 * FMA, same semantics, slower). B*NH <= 65535. T >= 1 of any size: ragged
 * tiles are zero-padded in shared memory and masked. Static shared memory
 * only (<= 46 KB per block), so no opt-in attribute is needed. Outputs must
 * not overlap inputs (pointers are __restrict__). sm_80+. The dK/dV pass
 * has B*KVH*ceil(T/64) blocks of NH/KVH times the work each: with few
 * key/value heads it fills a large GPU less well (a split over query heads
 * would need a second, ordered reduction pass).
 *
 * Checked in the compiled code by `make kernel-report` (kernels/internal/kreport):
 * tensor cores (attn_fwd_tc_kernel, attn_bwd_dkv_tc_kernel, attn_bwd_dq_tc_kernel):
 * HMMA inside their loops on every architecture.
 */
#include "kernels.h"

#include <math.h>
#include <stdint.h>

namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 128;  // 4 warps in every tensor-core kernel
constexpr int kGenericMaxHS = 256;

// AttnIdx locates q, k and v in qkv (backend.QKVLayout.Index): query head h
// of position p = b*T + t starts at element p*qrow + h*HS, key head g at
// kbase + p*kvrow + g*HS, value head g at vbase + p*kvrow + g*HS. dqkv has
// the same layout. per = NH/KVH query heads share a key/value head.
struct AttnIdx {
    size_t kbase, vbase;
    size_t qrow, kvrow;
    int NH, per;
};

// q, k, v of sequence b's position 0 (head h, key/value head g).
__device__ __forceinline__ size_t attn_q(const AttnIdx& x, int b, int T, int h, int HS) {
    return (size_t)b * T * x.qrow + (size_t)h * HS;
}
__device__ __forceinline__ size_t attn_k(const AttnIdx& x, int b, int T, int g, int HS) {
    return x.kbase + (size_t)b * T * x.kvrow + (size_t)g * HS;
}
__device__ __forceinline__ size_t attn_v(const AttnIdx& x, int b, int T, int g, int HS) {
    return x.vbase + (size_t)b * T * x.kvrow + (size_t)g * HS;
}

// attn_first is the first key query t of sequence b may attend: its
// document's first token (backend.Positions), or 0 without positions.
__device__ __forceinline__ int attn_first(const int* pos, int b, int T, int t) {
    return pos ? t - pos[(size_t)b * T + t] : 0;
}

// attn_load_tile copies rows row0..row0+ROWS-1 (HS bf16 each, consecutive
// rows stride elements apart in global memory) into shared memory with
// row pitch HS+8 (the pad staggers banks for the wmma loads), writing
// zeros for rows >= T so that padded rows hold no garbage (0 * NaN).
// 16-byte vector copies: src and stride must keep 16-byte alignment.
template <int ROWS, int HS>
__device__ __forceinline__ void attn_load_tile(bf16* dst, const bf16* src, size_t stride, int row0, int T) {
    constexpr int VPR = HS / 8;  // uint4 per row
    constexpr int LD = HS + 8;
    for (int i = threadIdx.x; i < ROWS * VPR; i += blockDim.x) {
        const int r = i / VPR, v = i % VPR;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < T) {
            val = *reinterpret_cast<const uint4*>(src + (size_t)(row0 + r) * stride + v * 8);
        }
        *reinterpret_cast<uint4*>(dst + r * LD + v * 8) = val;
    }
}

// ---------------------------------------------------------------------------
// Forward, tensor-core path (HS = 64 or 128).
// grid (ceil(T/64), B*NH), block 128. The heaviest (last) query tiles are
// scheduled first.

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_tc_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                       const int* __restrict__ pos, AttnIdx x, int T, float scale) {
    constexpr int BR = 64, BC = 32, NW = 4, NCH = HS / 16;
    constexpr int LDK = HS + 8;  // bf16 pitch of Q/K/V rows in shared memory
    constexpr int LDS = BC + 4;  // fp32 pitch of the per-warp score tile
    constexpr int LDP = BC + 8;  // bf16 pitch of the per-warp P tile
    static_assert(BR == 2 * BC, "the Q staging area is the K|V area");

    // sKV holds the Q tile at the start, then K (rows 0..BC) | V.
    __shared__ __align__(32) bf16 sKV[2 * BC * LDK];
    __shared__ __align__(32) float sS[NW][16 * LDS];
    __shared__ __align__(32) bf16 sP[NW][16 * LDP];
    __shared__ float sRow[NW][16];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int NH = x.NH, bh = blockIdx.y, b = bh / NH, h = bh % NH, g = h / x.per;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
    const size_t C = (size_t)NH * HS;
    const bf16* qbase = qkv + attn_q(x, b, T, h, HS);
    const bf16* kbase = qkv + attn_k(x, b, T, g, HS);
    const bf16* vbase = qkv + attn_v(x, b, T, g, HS);
    const float sl2 = scale * kLog2e;  // scores in log2 units

    attn_load_tile<BR, HS>(sKV, qbase, x.qrow, q0, T);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf[NCH];
#pragma unroll
    for (int c = 0; c < NCH; c++) wmma::load_matrix_sync(qf[c], sKV + warp * 16 * LDK + c * 16, LDK);
    __syncthreads();  // the K|V loads below overwrite the Q staging area

    // Softmax ownership: lane -> row srow of the warp, half shalf of the
    // key tile. Output ownership: lane -> rows orow + 2e (e < 8), column
    // ocol of every 16-wide chunk c of HS.
    const int srow = lane >> 1, shalf = lane & 1;
    const int orow = lane >> 4, ocol = lane & 15;
    const int wq0 = q0 + warp * 16;
    const int qs = wq0 + srow;
    const int qfirst = qs < T ? attn_first(pos, b, T, qs) : 0;
    float m = -INFINITY, l = 0.f;
    float o[NCH][8];
#pragma unroll
    for (int c = 0; c < NCH; c++)
#pragma unroll
        for (int e = 0; e < 8; e++) o[c][e] = 0.f;

    float* S = sS[warp];
    bf16* P = sP[warp];
    const int kend = min(q0 + BR, T);
    for (int k0 = 0; k0 < kend; k0 += BC) {
        attn_load_tile<BC, HS>(sKV, kbase, x.kvrow, k0, T);
        attn_load_tile<BC, HS>(sKV + BC * LDK, vbase, x.kvrow, k0, T);
        __syncthreads();
        if (k0 <= wq0 + 15) {  // warp-uniform: some key of the tile is visible
#pragma unroll
            for (int n = 0; n < BC / 16; n++) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                wmma::fill_fragment(acc, 0.f);
#pragma unroll
                for (int c = 0; c < NCH; c++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> kf;
                    wmma::load_matrix_sync(kf, sKV + n * 16 * LDK + c * 16, LDK);
                    wmma::mma_sync(acc, qf[c], kf, acc);
                }
                wmma::store_matrix_sync(S + n * 16, acc, LDS, wmma::mem_row_major);
            }
            __syncwarp();

            // Online softmax over this tile. Without positions key 0 is
            // visible to every row (and k0 = 0 comes first), so m is finite
            // from the first tile on. With them a row's keys may start in
            // a later tile: until then m stays -inf, and mref keeps such a
            // row's alpha and p at 0 instead of exp(-inf - -inf) = NaN
            // (mref is mnew whenever m is finite: the unpacked bits).
            float x[16];
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int col = shalf * 16 + j, key = k0 + col;
                x[j] = (key <= qs && key < T && key >= qfirst) ? S[srow * LDS + col] * sl2 : -INFINITY;
                mx = fmaxf(mx, x[j]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
            const float mnew = fmaxf(m, mx);
            const float mref = mnew == -INFINITY ? 0.f : mnew;
            const float alpha = exp2f(m - mref);
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float p = exp2f(x[j] - mref);
                sum += p;
                P[srow * LDP + shalf * 16 + j] = __float2bfloat16(p);
            }
            sum += __shfl_xor_sync(kFull, sum, 1);
            l = l * alpha + sum;
            m = mnew;
            if (shalf == 0) sRow[warp][srow] = alpha;
            __syncwarp();

            float al[8];
#pragma unroll
            for (int e = 0; e < 8; e++) al[e] = sRow[warp][orow + 2 * e];
            // O = alpha O + P V, one 16-column chunk at a time through the
            // (now free) score tile.
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                wmma::fill_fragment(acc, 0.f);
#pragma unroll
                for (int kk = 0; kk < BC / 16; kk++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> pf;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> vf;
                    wmma::load_matrix_sync(pf, P + kk * 16, LDP);
                    wmma::load_matrix_sync(vf, sKV + (BC + kk * 16) * LDK + c * 16, LDK);
                    wmma::mma_sync(acc, pf, vf, acc);
                }
                wmma::store_matrix_sync(S, acc, LDS, wmma::mem_row_major);
                __syncwarp();
#pragma unroll
                for (int e = 0; e < 8; e++) o[c][e] = o[c][e] * al[e] + S[(orow + 2 * e) * LDS + ocol];
                __syncwarp();
            }
        }
        __syncthreads();  // the next tile overwrites sKV
    }

    if (shalf == 0) {
        sRow[warp][srow] = 1.f / l;
        if (qs < T) lse[(size_t)bh * T + qs] = (m + log2f(l)) * kLn2;
    }
    __syncwarp();
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int r = orow + 2 * e, q = wq0 + r;
        if (q < T) {
            const float inv = sRow[warp][r];
            bf16* dst = out + ((size_t)b * T + q) * C + (size_t)h * HS + ocol;
#pragma unroll
            for (int c = 0; c < NCH; c++) dst[c * 16] = __float2bfloat16(o[c][e] * inv);
        }
    }
}

// ---------------------------------------------------------------------------
// Forward, generic path (any HS <= 256): one warp per query row, lanes take
// 32 keys at a time for the scores and split the head dimension for O.
// grid ceil(B*NH*T/4), block 128.

__global__ void __launch_bounds__(kThreads)
    attn_fwd_generic_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                            const int* __restrict__ pos, AttnIdx x, int B, int T, int HS, float scale) {
    const int lane = threadIdx.x % 32;
    const int NH = x.NH;
    const long row = (long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
    if (row >= (long)B * NH * T) return;  // whole warp
    const size_t C = (size_t)NH * HS;
    const int bh = (int)(row / T), t = (int)(row % T), b = bh / NH, h = bh % NH, g = h / x.per;
    const bf16* q = qkv + attn_q(x, b, T, h, HS) + (size_t)t * x.qrow;
    const bf16* kseq = qkv + attn_k(x, b, T, g, HS);
    const bf16* vseq = qkv + attn_v(x, b, T, g, HS);
    const float sl2 = scale * kLog2e;

    float m = -INFINITY, l = 0.f;
    float o[kGenericMaxHS / 32];
#pragma unroll
    for (int d = 0; d < kGenericMaxHS / 32; d++) o[d] = 0.f;
    // Keys first..t, from the 32-key tile holding first: key first is
    // visible in the first tile, so m is finite from it on.
    const int first = attn_first(pos, b, T, t);
    for (int k0 = first & ~31; k0 <= t; k0 += 32) {
        const int key = k0 + lane;
        float s = -INFINITY;
        if (key <= t && key >= first) {
            const bf16* k = kseq + (size_t)key * x.kvrow;
            float dot = 0.f;
            for (int i = 0; i < HS; i++) dot += __bfloat162float(q[i]) * __bfloat162float(k[i]);
            s = dot * sl2;
        }
        float mx = s;
#pragma unroll
        for (int w = 16; w > 0; w >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, w));
        const float mnew = fmaxf(m, mx);  // finite: key max(k0, first) <= t is visible
        const float alpha = exp2f(m - mnew);
        const float p = exp2f(s - mnew);
        float sum = p;
#pragma unroll
        for (int w = 16; w > 0; w >>= 1) sum += __shfl_xor_sync(kFull, sum, w);
        l = l * alpha + sum;
        m = mnew;
#pragma unroll
        for (int d = 0; d < kGenericMaxHS / 32; d++) o[d] *= alpha;
        const int nk = min(32, t + 1 - k0);
        for (int j = 0; j < 32; j++) {
            const float pj = __shfl_sync(kFull, p, j);
            if (j < nk && k0 + j >= first) {
                const bf16* v = vseq + (size_t)(k0 + j) * x.kvrow;
#pragma unroll
                for (int d = 0; d < kGenericMaxHS / 32; d++) {
                    const int i = lane + 32 * d;
                    if (i < HS) o[d] += pj * __bfloat162float(v[i]);
                }
            }
        }
    }
    const float inv = 1.f / l;
    bf16* dst = out + ((size_t)b * T + t) * C + (size_t)h * HS;
#pragma unroll
    for (int d = 0; d < kGenericMaxHS / 32; d++) {
        const int i = lane + 32 * d;
        if (i < HS) dst[i] = __float2bfloat16(o[d] * inv);
    }
    if (lane == 0) lse[row] = (m + log2f(l)) * kLn2;
}

// ---------------------------------------------------------------------------
// Backward step 1: D[b,h,t] = sum_i dout[b,t,h*HS+i] * out[b,t,h*HS+i].
// One warp per row, grid ceil(B*NH*T/8), block 256. Fixed lane split and
// butterfly reduction: deterministic.

__global__ void __launch_bounds__(256)
    attn_bwd_d_kernel(float* __restrict__ D, const bf16* __restrict__ dout, const bf16* __restrict__ out, int B,
                      int T, int NH, int HS) {
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * 8 + threadIdx.x / 32;
    if (row >= (long)B * NH * T) return;  // whole warp
    const size_t C = (size_t)NH * HS;
    const int bh = (int)(row / T), t = (int)(row % T), b = bh / NH, h = bh % NH;
    const size_t off = ((size_t)b * T + t) * C + (size_t)h * HS;
    float sum = 0.f;
    for (int i = lane; i < HS; i += 32) sum += __bfloat162float(dout[off + i]) * __bfloat162float(out[off + i]);
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) sum += __shfl_xor_sync(kFull, sum, w);
    if (lane == 0) D[row] = sum;
}

// ---------------------------------------------------------------------------
// Backward step 2, tensor-core path: dK and dV of a 64-key tile of one
// key/value head, summed over its query heads.
// grid (ceil(T/64), B*KVH), block 128 (warp w: keys k0+16w..k0+16w+15).

// attn_scores_and_dp: the two products of one backward tile, for the warp's
// 16 rows held in fragments: S = A X^T and dP = G Y^T against NT tiles of 16
// rows of X and Y in shared memory (row stride LDK), written row-major to S
// and dP (row stride LDS). The dK/dV pass calls it with A = K, G = V and
// X = Q, Y = dO; the dQ pass with A = Q, G = dO and X = K, Y = V.
template <int NT, int NCH>
__device__ __forceinline__ void attn_scores_and_dp(
    float* S, float* dP,
    const wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> (&af)[NCH],
    const wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> (&gf)[NCH],
    const bf16* sX, const bf16* sY, int LDK, int LDS) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> s, dp;
        wmma::fill_fragment(s, 0.f);
        wmma::fill_fragment(dp, 0.f);
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> xf, yf;
            wmma::load_matrix_sync(xf, sX + n * 16 * LDK + c * 16, LDK);
            wmma::load_matrix_sync(yf, sY + n * 16 * LDK + c * 16, LDK);
            wmma::mma_sync(s, af[c], xf, s);
            wmma::mma_sync(dp, gf[c], yf, dp);
        }
        wmma::store_matrix_sync(S + n * 16, s, LDS, wmma::mem_row_major);
        wmma::store_matrix_sync(dP + n * 16, dp, LDS, wmma::mem_row_major);
    }
}

// 255 registers (attn_bwd_dkv_tc_kernel<128>): each warp keeps its 16 keys'
// K and V fragments (64 registers) and its dK and dV accumulators (128)
// for the whole pass; K and V in shared memory instead would not fit
// beside the query tiles in 48 KiB of static shared memory (46464 bytes
// used at HS 128).
// spills (attn_bwd_dkv_tc_kernel<128>): on sm_90 only (CUDA 11.8), one
// 4-byte value (the high word of a 64-bit offset), stored once before
// the loop over the group's query heads and loaded once per head, never in
// the loop over query tiles; the report checks that no spill is in an
// innermost loop.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkv_tc_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                           const float* __restrict__ lse, const float* __restrict__ Dg, const int* __restrict__ pos,
                           AttnIdx x, int T, float scale) {
    constexpr int BC = 64, BR = 32, NW = 4, NCH = HS / 16;
    constexpr int LDK = HS + 8;
    constexpr int LDS = BR + 4;
    constexpr int LDP = BR + 8;
    constexpr int QD_ELEMS = 2 * BR * LDK;   // sQ | sdO
    constexpr int KV_ELEMS = 2 * BC * LDK;   // K | V staging at the start
    constexpr int WS_BYTES = NW * (2 * 16 * LDS * 4 + 2 * 16 * LDP * 2);
    constexpr int AREA = (QD_ELEMS * 2 + WS_BYTES) > KV_ELEMS * 2 ? (QD_ELEMS * 2 + WS_BYTES) : KV_ELEMS * 2;
    static_assert((QD_ELEMS * 2) % 32 == 0 && (16 * LDS * 4) % 32 == 0 && (16 * LDP * 2) % 32 == 0,
                  "wmma tiles need 32-byte alignment");

    // One area: K|V staging first; then sQ | sdO | per-warp {S, dP, P, dS}.
    __shared__ __align__(32) unsigned char area[AREA];
    __shared__ float sL[BR], sD[BR];
    __shared__ int sF[BR];  // each query's first visible key
    bf16* stage = reinterpret_cast<bf16*>(area);
    bf16* sQ = reinterpret_cast<bf16*>(area);
    bf16* sdO = sQ + BR * LDK;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int NH = x.NH, KVH = NH / x.per;
    const int bg = blockIdx.y, b = bg / KVH, g = bg % KVH;
    const int k0 = blockIdx.x * BC;
    const size_t C = (size_t)NH * HS;
    const float sl2 = scale * kLog2e;

    unsigned char* wsp = area + QD_ELEMS * 2 + warp * (2 * 16 * LDS * 4 + 2 * 16 * LDP * 2);
    float* S = reinterpret_cast<float*>(wsp);
    float* dP = S + 16 * LDS;
    bf16* Pb = reinterpret_cast<bf16*>(dP + 16 * LDS);
    bf16* dSb = Pb + 16 * LDP;

    attn_load_tile<BC, HS>(stage, qkv + attn_k(x, b, T, g, HS), x.kvrow, k0, T);
    attn_load_tile<BC, HS>(stage + BC * LDK, qkv + attn_v(x, b, T, g, HS), x.kvrow, k0, T);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> kf[NCH], vf[NCH];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        wmma::load_matrix_sync(kf[c], stage + warp * 16 * LDK + c * 16, LDK);
        wmma::load_matrix_sync(vf[c], stage + (BC + warp * 16) * LDK + c * 16, LDK);
    }
    __syncthreads();  // the query tiles below overwrite the staging area

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dk[NCH], dv[NCH];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        wmma::fill_fragment(dk[c], 0.f);
        wmma::fill_fragment(dv[c], 0.f);
    }

    const int wk0 = k0 + warp * 16;
    const int srow = lane >> 1, shalf = lane & 1;  // key row, half of the query tile
    const int key = wk0 + srow;
    // The group's query heads in ascending order, each over its query
    // tiles: the fragments accumulate the sum over the group.
    for (int h = g * x.per; h < (g + 1) * x.per; h++) {
        const size_t bh = (size_t)b * NH + h;
        const bf16* qbase = qkv + attn_q(x, b, T, h, HS);
        const bf16* dobase = dout + (size_t)b * T * C + (size_t)h * HS;
        for (int q0 = k0; q0 < T; q0 += BR) {
            attn_load_tile<BR, HS>(sQ, qbase, x.qrow, q0, T);
            attn_load_tile<BR, HS>(sdO, dobase, C, q0, T);
            for (int i = threadIdx.x; i < BR; i += blockDim.x) {
                const int q = q0 + i;
                sL[i] = q < T ? lse[(size_t)bh * T + q] * kLog2e : 0.f;
                sD[i] = q < T ? Dg[(size_t)bh * T + q] : 0.f;
                sF[i] = q < T ? attn_first(pos, b, T, q) : 0;
            }
            __syncthreads();
            if (q0 + BR - 1 >= wk0) {  // warp-uniform: some query sees some key
                attn_scores_and_dp<BR / 16, NCH>(S, dP, kf, vf, sQ, sdO, LDK, LDS);
                __syncwarp();
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const int col = shalf * 16 + j, q = q0 + col;
                    float p = 0.f, ds = 0.f;
                    if (q < T && q >= key && key >= sF[col]) {
                        p = exp2f(S[srow * LDS + col] * sl2 - sL[col]);
                        ds = p * (dP[srow * LDS + col] - sD[col]) * scale;
                    }
                    Pb[srow * LDP + col] = __float2bfloat16(p);
                    dSb[srow * LDP + col] = __float2bfloat16(ds);
                }
                __syncwarp();
#pragma unroll
                for (int kk = 0; kk < BR / 16; kk++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> pf, dsf;
                    wmma::load_matrix_sync(pf, Pb + kk * 16, LDP);
                    wmma::load_matrix_sync(dsf, dSb + kk * 16, LDP);
#pragma unroll
                    for (int c = 0; c < NCH; c++) {
                        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> of, qf;
                        wmma::load_matrix_sync(of, sdO + kk * 16 * LDK + c * 16, LDK);
                        wmma::load_matrix_sync(qf, sQ + kk * 16 * LDK + c * 16, LDK);
                        wmma::mma_sync(dv[c], pf, of, dv[c]);
                        wmma::mma_sync(dk[c], dsf, qf, dk[c]);
                    }
                }
            }
            __syncthreads();  // the next query tile overwrites sQ, sdO, sL, sD, sF
        }
    }

    // Epilogue through the warp's score tile, 16 columns at a time.
    const int orow = lane >> 4, ocol = lane & 15;
#pragma unroll
    for (int part = 0; part < 2; part++) {
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            wmma::store_matrix_sync(S, part == 0 ? dk[c] : dv[c], LDS, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int r = orow + 2 * e, k = wk0 + r;
                if (k < T) {
                    dqkv[(part == 0 ? attn_k(x, b, T, g, HS) : attn_v(x, b, T, g, HS)) + (size_t)k * x.kvrow +
                         c * 16 + ocol] = __float2bfloat16(S[r * LDS + ocol]);
                }
            }
            __syncwarp();
        }
    }
}

// ---------------------------------------------------------------------------
// Backward step 3, tensor-core path: dQ of a 64-query tile.
// grid (ceil(T/64), B*NH), block 128 (warp w: queries q0+16w..q0+16w+15);
// the heaviest (last) tiles are scheduled first.

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_tc_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                          const float* __restrict__ lse, const float* __restrict__ Dg, const int* __restrict__ pos,
                          AttnIdx x, int T, float scale) {
    constexpr int BR = 64, BC = 32, NW = 4, NCH = HS / 16;
    constexpr int LDK = HS + 8;
    constexpr int LDS = BC + 4;
    constexpr int LDP = BC + 8;
    constexpr int KV_ELEMS = 2 * BC * LDK;  // sK | sV
    constexpr int WS_BYTES = NW * (2 * 16 * LDS * 4 + 16 * LDP * 2);
    constexpr int QD_BYTES = 2 * BR * LDK * 2;  // Q | dO staging at the start
    constexpr int AREA = (KV_ELEMS * 2 + WS_BYTES) > QD_BYTES ? (KV_ELEMS * 2 + WS_BYTES) : QD_BYTES;
    static_assert((KV_ELEMS * 2) % 32 == 0 && (16 * LDS * 4) % 32 == 0 && (16 * LDP * 2) % 32 == 0,
                  "wmma tiles need 32-byte alignment");

    __shared__ __align__(32) unsigned char area[AREA];
    bf16* stage = reinterpret_cast<bf16*>(area);
    bf16* sK = reinterpret_cast<bf16*>(area);
    bf16* sV = sK + BC * LDK;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int NH = x.NH, bh = blockIdx.y, b = bh / NH, h = bh % NH, g = h / x.per;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
    const size_t C = (size_t)NH * HS;
    const bf16* qbase = qkv + attn_q(x, b, T, h, HS);
    const bf16* kbase = qkv + attn_k(x, b, T, g, HS);
    const bf16* vbase = qkv + attn_v(x, b, T, g, HS);
    const bf16* dobase = dout + (size_t)b * T * C + (size_t)h * HS;
    const float sl2 = scale * kLog2e;

    unsigned char* wsp = area + KV_ELEMS * 2 + warp * (2 * 16 * LDS * 4 + 16 * LDP * 2);
    float* S = reinterpret_cast<float*>(wsp);
    float* dP = S + 16 * LDS;
    bf16* dSb = reinterpret_cast<bf16*>(dP + 16 * LDS);

    attn_load_tile<BR, HS>(stage, qbase, x.qrow, q0, T);
    attn_load_tile<BR, HS>(stage + BR * LDK, dobase, C, q0, T);
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf[NCH], of[NCH];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        wmma::load_matrix_sync(qf[c], stage + warp * 16 * LDK + c * 16, LDK);
        wmma::load_matrix_sync(of[c], stage + (BR + warp * 16) * LDK + c * 16, LDK);
    }
    __syncthreads();  // the key tiles below overwrite the staging area

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dq[NCH];
#pragma unroll
    for (int c = 0; c < NCH; c++) wmma::fill_fragment(dq[c], 0.f);

    const int wq0 = q0 + warp * 16;
    const int srow = lane >> 1, shalf = lane & 1;
    const int qs = wq0 + srow;
    const bool rowok = qs < T;
    const int qfirst = rowok ? attn_first(pos, b, T, qs) : 0;
    const float lrow = rowok ? lse[(size_t)bh * T + qs] * kLog2e : 0.f;
    const float drow = rowok ? Dg[(size_t)bh * T + qs] : 0.f;
    const int kend = min(q0 + BR, T);
    for (int k0 = 0; k0 < kend; k0 += BC) {
        attn_load_tile<BC, HS>(sK, kbase, x.kvrow, k0, T);
        attn_load_tile<BC, HS>(sV, vbase, x.kvrow, k0, T);
        __syncthreads();
        if (k0 <= wq0 + 15) {  // warp-uniform
            attn_scores_and_dp<BC / 16, NCH>(S, dP, qf, of, sK, sV, LDK, LDS);
            __syncwarp();
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int col = shalf * 16 + j, key = k0 + col;
                float ds = 0.f;
                if (rowok && key <= qs && key >= qfirst) {
                    const float p = exp2f(S[srow * LDS + col] * sl2 - lrow);
                    ds = p * (dP[srow * LDS + col] - drow) * scale;
                }
                dSb[srow * LDP + col] = __float2bfloat16(ds);
            }
            __syncwarp();
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> dsf;
                wmma::load_matrix_sync(dsf, dSb + kk * 16, LDP);
#pragma unroll
                for (int c = 0; c < NCH; c++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> kf;
                    wmma::load_matrix_sync(kf, sK + kk * 16 * LDK + c * 16, LDK);
                    wmma::mma_sync(dq[c], dsf, kf, dq[c]);
                }
            }
        }
        __syncthreads();  // the next tile overwrites sK, sV
    }

    const int orow = lane >> 4, ocol = lane & 15;
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        wmma::store_matrix_sync(S, dq[c], LDS, wmma::mem_row_major);
        __syncwarp();
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int r = orow + 2 * e, q = wq0 + r;
            if (q < T) dqkv[attn_q(x, b, T, h, HS) + (size_t)q * x.qrow + c * 16 + ocol] = __float2bfloat16(S[r * LDS + ocol]);
        }
        __syncwarp();
    }
}

// ---------------------------------------------------------------------------
// Backward, generic path (any HS <= 256), after attn_bwd_d_kernel.

// dQ: one warp per query row t; lanes take 32 keys at a time for the
// scores and split the head dimension for the sum dQ = sum_k dS K.
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_generic_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                               const float* __restrict__ lse, const float* __restrict__ Dg,
                               const int* __restrict__ pos, AttnIdx x, int B, int T, int HS, float scale) {
    const int lane = threadIdx.x % 32;
    const int NH = x.NH;
    const long row = (long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
    if (row >= (long)B * NH * T) return;  // whole warp
    const size_t C = (size_t)NH * HS;
    const int bh = (int)(row / T), t = (int)(row % T), b = bh / NH, h = bh % NH, g = h / x.per;
    const bf16* q = qkv + attn_q(x, b, T, h, HS) + (size_t)t * x.qrow;
    const bf16* kseq = qkv + attn_k(x, b, T, g, HS);
    const bf16* vseq = qkv + attn_v(x, b, T, g, HS);
    const bf16* dO = dout + ((size_t)b * T + t) * C + (size_t)h * HS;
    const float sl2 = scale * kLog2e;
    const float l2 = lse[row] * kLog2e, Dr = Dg[row];

    float dq[kGenericMaxHS / 32];
#pragma unroll
    for (int d = 0; d < kGenericMaxHS / 32; d++) dq[d] = 0.f;
    const int first = attn_first(pos, b, T, t);
    for (int k0 = first & ~31; k0 <= t; k0 += 32) {
        const int key = k0 + lane;
        float ds = 0.f;
        if (key <= t && key >= first) {
            const bf16* k = kseq + (size_t)key * x.kvrow;
            const bf16* v = vseq + (size_t)key * x.kvrow;
            float s = 0.f, dp = 0.f;
            for (int i = 0; i < HS; i++) {
                s += __bfloat162float(q[i]) * __bfloat162float(k[i]);
                dp += __bfloat162float(dO[i]) * __bfloat162float(v[i]);
            }
            const float p = exp2f(s * sl2 - l2);
            ds = p * (dp - Dr) * scale;
        }
        const int nk = min(32, t + 1 - k0);
        for (int j = 0; j < 32; j++) {
            const float dsj = __shfl_sync(kFull, ds, j);
            if (j < nk && k0 + j >= first) {
                const bf16* k = kseq + (size_t)(k0 + j) * x.kvrow;
#pragma unroll
                for (int d = 0; d < kGenericMaxHS / 32; d++) {
                    const int i = lane + 32 * d;
                    if (i < HS) dq[d] += dsj * __bfloat162float(k[i]);
                }
            }
        }
    }
    bf16* dst = dqkv + attn_q(x, b, T, h, HS) + (size_t)t * x.qrow;
#pragma unroll
    for (int d = 0; d < kGenericMaxHS / 32; d++) {
        const int i = lane + 32 * d;
        if (i < HS) dst[i] = __float2bfloat16(dq[d]);
    }
}

// dK, dV: one warp per key row of a key/value head, grid ceil(B*KVH*T/4);
// for each query head of the group in ascending order, lanes take 32
// queries (>= the key) at a time and split the head dimension for dV =
// sum_q P dO, dK = sum_q dS Q. At least 6 blocks an SM (the launch
// bounds' second argument): left to itself ptxas (CUDA 11.8) kept 72
// registers and spilled 16 bytes, some of it inside the loops, on sm_86,
// sm_89 and sm_90; so bounded it takes up to 80 and spills nothing, at 6
// resident blocks an SM instead of 7 (not measured on a GPU; this is the
// fallback for head sizes other than 64 and 128).
__global__ void __launch_bounds__(kThreads, 6)
    attn_bwd_dkv_generic_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                                const bf16* __restrict__ qkv, const float* __restrict__ lse,
                                const float* __restrict__ Dg, const int* __restrict__ pos, AttnIdx x, int B, int T,
                                int HS, float scale) {
    const int lane = threadIdx.x % 32;
    const int NH = x.NH, KVH = NH / x.per;
    const long row = (long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
    if (row >= (long)B * KVH * T) return;  // whole warp
    const size_t C = (size_t)NH * HS;
    const int bg = (int)(row / T), kt = (int)(row % T), b = bg / KVH, g = bg % KVH;
    const bf16* k = qkv + attn_k(x, b, T, g, HS) + (size_t)kt * x.kvrow;
    const bf16* v = qkv + attn_v(x, b, T, g, HS) + (size_t)kt * x.kvrow;
    const float sl2 = scale * kLog2e;

    float dk[kGenericMaxHS / 32], dv[kGenericMaxHS / 32];
#pragma unroll
    for (int d = 0; d < kGenericMaxHS / 32; d++) dk[d] = dv[d] = 0.f;
    for (int h = g * x.per; h < (g + 1) * x.per; h++) {
        const size_t bh = (size_t)b * NH + h;
        const bf16* qseq = qkv + attn_q(x, b, T, h, HS);
        const bf16* dseq = dout + (size_t)b * T * C + (size_t)h * HS;
        for (int q0 = kt; q0 < T; q0 += 32) {
            const int qt = q0 + lane;
            float p = 0.f, ds = 0.f;
            if (qt < T && kt >= attn_first(pos, b, T, qt)) {
                const bf16* q = qseq + (size_t)qt * x.qrow;
                const bf16* dO = dseq + (size_t)qt * C;
                float s = 0.f, dp = 0.f;
                for (int i = 0; i < HS; i++) {
                    s += __bfloat162float(q[i]) * __bfloat162float(k[i]);
                    dp += __bfloat162float(dO[i]) * __bfloat162float(v[i]);
                }
                const size_t r = bh * T + qt;
                p = exp2f(s * sl2 - lse[r] * kLog2e);
                ds = p * (dp - Dg[r]) * scale;
            }
            const int nq = min(32, T - q0);
            for (int j = 0; j < 32; j++) {
                const float pj = __shfl_sync(kFull, p, j);
                const float dsj = __shfl_sync(kFull, ds, j);
                if (j < nq) {
                    const bf16* q = qseq + (size_t)(q0 + j) * x.qrow;
                    const bf16* dO = dseq + (size_t)(q0 + j) * C;
#pragma unroll
                    for (int d = 0; d < kGenericMaxHS / 32; d++) {
                        const int i = lane + 32 * d;
                        if (i < HS) {
                            dv[d] += pj * __bfloat162float(dO[i]);
                            dk[d] += dsj * __bfloat162float(q[i]);
                        }
                    }
                }
            }
        }
    }
    bf16* dkd = dqkv + attn_k(x, b, T, g, HS) + (size_t)kt * x.kvrow;
    bf16* dvd = dqkv + attn_v(x, b, T, g, HS) + (size_t)kt * x.kvrow;
#pragma unroll
    for (int d = 0; d < kGenericMaxHS / 32; d++) {
        const int i = lane + 32 * d;
        if (i < HS) {
            dkd[i] = __float2bfloat16(dk[d]);
            dvd[i] = __float2bfloat16(dv[d]);
        }
    }
}

// attn_check validates the shapes shared by both launchers.
bool attn_check(int B, int T, int NH, int KVH, int HS, int layout) {
    if (B <= 0 || T <= 0 || NH <= 0 || KVH <= 0 || HS <= 0 || NH % KVH != 0 || HS > kGenericMaxHS) return false;
    if (layout != 0 && layout != 1) return false;
    if ((long long)B * NH > 65535) return false;
    return (long long)B * T * (NH + 2LL * KVH) * HS <= (long long)1 << 40;
}

// attn_index is backend.QKVLayout.Index for B*T positions.
AttnIdx attn_index(int B, int T, int NH, int KVH, int HS, int layout) {
    const size_t BT = (size_t)B * T;
    AttnIdx x;
    x.NH = NH;
    x.per = NH / KVH;
    if (layout == 1) {  // planar: q, then k, then v, each [B,T,heads*HS]
        x.qrow = (size_t)NH * HS;
        x.kvrow = (size_t)KVH * HS;
        x.kbase = BT * x.qrow;
        x.vbase = x.kbase + BT * x.kvrow;
    } else {  // fused: one [q | k | v] row per position
        x.qrow = x.kvrow = (size_t)(NH + 2 * KVH) * HS;
        x.kbase = (size_t)NH * HS;
        x.vbase = (size_t)(NH + KVH) * HS;
    }
    return x;
}

bool attn_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// attn_grid_rows is the number of blocks for one warp per row of `heads`
// heads.
unsigned attn_grid_rows(int B, int T, int heads, int rows_per_block) {
    const long long rows = (long long)B * heads * T;
    return (unsigned)((rows + rows_per_block - 1) / rows_per_block);
}

float attn_scale(int HS) { return (float)(1.0 / sqrt((double)HS)); }

}  // namespace

// lsp_attention_forward: out [B,T,NH*HS] bf16 and lse [B,NH,T] fp32 from
// qkv bf16 in layout (0 fused, 1 planar) with NH query and KVH key/value
// heads of HS <= 256 (causal, scale 1/sqrt(HS); within each document when
// pos is given).
extern "C" cudaError_t lsp_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const int* pos,
                                             int B, int T, int NH, int KVH, int HS, int layout, cudaStream_t stream) {
    if (!attn_check(B, T, NH, KVH, HS, layout) || out == nullptr || lse == nullptr || qkv == nullptr) {
        return cudaErrorInvalidValue;
    }
    const AttnIdx x = attn_index(B, T, NH, KVH, HS, layout);
    const float scale = attn_scale(HS);
    const bool tc = attn_aligned16(qkv) && attn_aligned16(out);
    const dim3 tiles((unsigned)((T + 63) / 64), (unsigned)(B * NH));
    if (tc && (HS == 64 || HS == 128)) {
        auto fwd = HS == 64 ? attn_fwd_tc_kernel<64> : attn_fwd_tc_kernel<128>;
        LSP_LAUNCH(fwd, tiles, dim3(kThreads), 0, stream, out, lse, qkv, pos, x, T, scale);
    } else {
        LSP_LAUNCH(attn_fwd_generic_kernel, dim3(attn_grid_rows(B, T, NH, kThreads / 32)), dim3(kThreads), 0, stream,
                   out, lse, qkv, pos, x, B, T, HS, scale);
    }
    return cudaGetLastError();
}

// lsp_attention_backward: dqkv bf16 in qkv's layout (written, not
// accumulated; a key/value head's gradient sums its query heads in
// ascending order) from dout [B,T,NH*HS], qkv, out (the forward's output)
// and lse (the forward's log-sum-exp); scratch holds B*NH*T floats for
// D = rowsum(dO o O).
extern "C" cudaError_t lsp_attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                                              const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                                              const int* pos, float* scratch, int B, int T, int NH, int KVH, int HS,
                                              int layout, cudaStream_t stream) {
    if (!attn_check(B, T, NH, KVH, HS, layout) || dqkv == nullptr || dout == nullptr || qkv == nullptr ||
        out == nullptr || lse == nullptr || scratch == nullptr) {
        return cudaErrorInvalidValue;
    }
    const AttnIdx x = attn_index(B, T, NH, KVH, HS, layout);
    const float scale = attn_scale(HS);
    LSP_LAUNCH(attn_bwd_d_kernel, dim3(attn_grid_rows(B, T, NH, 8)), dim3(256), 0, stream, scratch, dout, out, B, T,
               NH, HS);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const bool tc = attn_aligned16(qkv) && attn_aligned16(dout);
    const unsigned qtiles = (unsigned)((T + 63) / 64);
    if (tc && (HS == 64 || HS == 128)) {
        auto dkv = HS == 64 ? attn_bwd_dkv_tc_kernel<64> : attn_bwd_dkv_tc_kernel<128>;
        auto dq = HS == 64 ? attn_bwd_dq_tc_kernel<64> : attn_bwd_dq_tc_kernel<128>;
        LSP_LAUNCH(dkv, dim3(qtiles, (unsigned)(B * KVH)), dim3(kThreads), 0, stream, dqkv, dout, qkv, lse, scratch, pos,
                   x, T, scale);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        LSP_LAUNCH(dq, dim3(qtiles, (unsigned)(B * NH)), dim3(kThreads), 0, stream, dqkv, dout, qkv, lse, scratch, pos,
                   x, T, scale);
    } else {
        LSP_LAUNCH(attn_bwd_dkv_generic_kernel, dim3(attn_grid_rows(B, T, KVH, kThreads / 32)), dim3(kThreads), 0,
                   stream, dqkv, dout, qkv, lse, scratch, pos, x, B, T, HS, scale);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        LSP_LAUNCH(attn_bwd_dq_generic_kernel, dim3(attn_grid_rows(B, T, NH, kThreads / 32)), dim3(kThreads), 0,
                   stream, dqkv, dout, qkv, lse, scratch, pos, x, B, T, HS, scale);
    }
    return cudaGetLastError();
}
