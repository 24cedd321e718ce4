/*
 * embedding.cu: GPT-2's token + position embedding ("encoder"), forward and
 * backward, with a deterministic backward that uses no float atomics.
 *
 *   forward:  out[b,t,:] = wte[inp[b,t],:] + wpe[p,:]
 *   backward: dwte[inp[b,t],:] += dout[b,t,:],  dwpe[p,:] += dout[b,t,:]
 *
 * where p = pos[b,t], the token's position within its document (int32
 * [B,T], backend.Positions: a packed row restarts it at each document), or
 * t when pos is NULL.
 *
 * Shapes: inp int32 [B, T] token ids; wte, dwte [V, C]; wpe, dwpe at least
 * [T, C], or NULL for a model without a position table (LLaMA: out is the
 * token's row, copied exactly; dwpe is not computed); out, dout [B, T, C]. x_bf16 is the dtype of out, wte, wpe,
 * g_bf16 that of dout (an activation gradient: the model's storage dtype)
 * and dw_bf16 that of dwte, dwpe (parameter gradients: --grad-dtype), each
 * a backend.DType (0 fp32, 1 bf16), in any mix. The CPU
 * backend's EncoderForward/EncoderBackward (train/cpu/ref_embedding.go) are
 * the reference; the backward adds in the CPU's order (each gradient element
 * starts from its stored value and adds dout over (b, t) in increasing
 * order, in fp32, with one rounding at the store), so it equals the CPU
 * result bit for bit.
 *
 * How: the forward is one thread per output element. The dwpe backward is
 * one thread per (p, c) adding over b in order; with positions it adds,
 * for each b, the tokens t >= p whose position is p, in order (a scan of
 * B*(T-p) positions per thread: O(B T^2 C / 2) id reads, paid by packed
 * runs only). The dwte backward gives
 * each block a range of 32 vocabulary rows and 128 channels: the block
 * scans the tokens in chunks of 128 positions, compacts the positions whose
 * token falls in its range, in order (a ballot per warp, warp offsets in
 * shared memory), and each thread adds dout of those positions for its own
 * channel into a shared-memory accumulator of its own column (32 rows x 1
 * channel); a row is loaded from dwte at its first hit and stored back at
 * the end, so untouched rows are never read or written. Each dwte element
 * has exactly one owner thread, which adds in position order: deterministic
 * without atomics, however many times a token repeats. Every block reads
 * all B*T token ids (from L2: B*T*4 bytes each); the work is
 * ceil(V/32) * ceil(C/128) * B*T id checks.
 *
 * Limits: B, T >= 0, C >= 1, V >= 1, B*T*C < 2^63, ceil(C/128) <= 65535.
 * Token ids outside [0, V) cannot be reported from the device (the CPU
 * backend returns an error for them): the forward writes NaN in their rows
 * and the backward skips them for dwte (dwpe still gets their dout), so a
 * caller that did not validate ids sees NaN losses rather than a fault.
 */
#include "kernels.h"
#include "ldst.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 256;            // elementwise kernels
constexpr long long kMaxBlocks = 16384;  // elementwise grid-stride cap
constexpr int kRows = 32;                // dwte rows per block (one bit each in a uint32 mask)
constexpr int kCols = 128;               // dwte channels per block = threads per block
constexpr int kWarps = kCols / 32;

template <typename X>
__global__ void __launch_bounds__(kThreads)
    encoder_forward_kernel(X* out, const int* inp, const int* pos, const X* wte, const X* wpe, long long BT, int T, int C,
                           int V) {
  const long long n = BT * C;
  for (long long idx = (long long)blockIdx.x * kThreads + threadIdx.x; idx < n;
       idx += (long long)gridDim.x * kThreads) {
    const long long bt = idx / C;
    const int c = (int)(idx % C);
    const int tok = inp[bt];
    const long long t = pos ? pos[bt] : bt % T;
    float v = nanf("");
    // Without a position table the row is copied, not added to 0, which
    // would turn -0 into +0 and differ from the CPU backend's copy.
    if (tok >= 0 && tok < V) v = wpe ? ld(wte + (long long)tok * C + c) + ld(wpe + t * C + c) : ld(wte + (long long)tok * C + c);
    st(out + idx, v);
  }
}

// encoder_backward_wpe_kernel: dwpe[t,c] += dout[0,t,c], then dout[1,t,c], ...
// without positions; with them, dwpe[p,c] += dout[b,t,c] over the (b, t)
// whose position is p, in increasing order (G: dout's type, W: dwpe's).
// A token at position p sits at t >= p, so the scan starts there.
template <typename G, typename W>
__global__ void __launch_bounds__(kThreads)
    encoder_backward_wpe_kernel(W* dwpe, const G* dout, const int* pos, int B, int T, int C) {
  const long long n = (long long)T * C;
  for (long long idx = (long long)blockIdx.x * kThreads + threadIdx.x; idx < n;
       idx += (long long)gridDim.x * kThreads) {
    float acc = ld(dwpe + idx);
    if (pos == nullptr) {
      for (int b = 0; b < B; b++) acc += ld(dout + (long long)b * n + idx);
    } else {
      const int p = (int)(idx / C), c = (int)(idx % C);
      for (int b = 0; b < B; b++)
        for (int t = p; t < T; t++)
          if (pos[(long long)b * T + t] == p) acc += ld(dout + ((long long)b * T + t) * C + c);
    }
    st(dwpe + idx, acc);
  }
}

// encoder_backward_wte_kernel: block (x, y) owns dwte rows [32x, 32x+32) and
// channels [128y, 128y+128); thread k owns channel 128y + k of those rows
// (G: dout's type, W: dwte's).
template <typename G, typename W>
__global__ void __launch_bounds__(kCols)
    encoder_backward_wte_kernel(W* dwte, const G* dout, const int* inp, long long BT, int C, int V) {
  __shared__ float acc[kRows * kCols];  // acc[r*kCols + k]: row r, thread k's channel
  __shared__ int hitPos[kCols];         // chunk offsets of this chunk's hits, in order
  __shared__ int hitRow[kCols];         // and their rows (token - v0)
  __shared__ int warpHits[kWarps];
  const int k = threadIdx.x, lane = k % 32, warp = k / 32;
  const int v0 = blockIdx.x * kRows;
  const int c = blockIdx.y * kCols + k;
  const long long cc = c < C ? c : 0;  // keeps idle threads' addresses in range
  unsigned loaded = 0;                 // bit r: row r is in acc (same in every thread)
  for (long long base = 0; base < BT; base += kCols) {
    int r = -1;
    if (base + k < BT) {
      const int tok = inp[base + k];
      if (tok >= v0 && tok - v0 < kRows && tok < V) r = tok - v0;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, r >= 0);
    if (lane == 0) warpHits[warp] = __popc(ballot);
    __syncthreads();  // warpHits complete
    int off = 0, n = 0;
    for (int w = 0; w < kWarps; w++) {
      if (w < warp) off += warpHits[w];
      n += warpHits[w];
    }
    if (r >= 0) {
      const int pos = off + __popc(ballot & ((1u << lane) - 1u));
      hitPos[pos] = k;
      hitRow[pos] = r;
    }
    __syncthreads();  // hit list complete
    // The next chunk writes warpHits before its first barrier and the hit
    // list only after it, when every thread has left this loop, so no
    // barrier is needed at the end of the chunk.
    if (c < C) {
      for (int j = 0; j < n; j++) {
        const int row = hitRow[j];
        float* a = acc + row * kCols + k;
        if (!((loaded >> row) & 1u)) {
          *a = ld(dwte + (long long)(v0 + row) * C + cc);
          loaded |= 1u << row;
        }
        *a += ld(dout + (base + hitPos[j]) * C + cc);
      }
    }
  }
  if (c < C) {
    for (int row = 0; row < kRows; row++)
      if ((loaded >> row) & 1u) st(dwte + (long long)(v0 + row) * C + cc, acc[row * kCols + k]);
  }
}

unsigned elem_blocks(long long n) {
  const long long b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

template <typename X>
cudaError_t launch_forward(void* out, const int* inp, const int* pos, const void* wte, const void* wpe, int B, int T,
                           int C, int V, cudaStream_t stream) {
  const long long BT = (long long)B * T;
  auto kernel = encoder_forward_kernel<X>;
  LSP_LAUNCH(kernel, dim3(elem_blocks(BT * C)), dim3(kThreads), 0, stream, (X*)out, inp, pos, (const X*)wte,
             (const X*)wpe, BT, T, C, V);
  return cudaGetLastError();
}

template <typename G, typename W>
cudaError_t launch_backward(void* dwte, void* dwpe, const void* dout, const int* inp, const int* pos, int B, int T,
                            int C, int V, cudaStream_t stream) {
  if (dwpe != nullptr) {
    auto wpe = encoder_backward_wpe_kernel<G, W>;
    LSP_LAUNCH(wpe, dim3(elem_blocks((long long)T * C)), dim3(kThreads), 0, stream, (W*)dwpe, (const G*)dout, pos,
               B, T, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((unsigned)((V + kRows - 1) / kRows), (unsigned)((C + kCols - 1) / kCols));
  auto wte = encoder_backward_wte_kernel<G, W>;
  LSP_LAUNCH(wte, grid, dim3(kCols), 0, stream, (W*)dwte, (const G*)dout, inp, (long long)B * T, C, V);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t lsp_encoder_forward(void* out, const int* inp, const int* pos, const void* wte, const void* wpe,
                                           int B, int T, int C, int V, int x_bf16, cudaStream_t stream) {
  if (B < 0 || T < 0 || C <= 0 || V <= 0 || lsp_bad_dtype(x_bf16)) return cudaErrorInvalidValue;
  if ((long long)B * T == 0) return cudaSuccess;
  if (out == nullptr || inp == nullptr || wte == nullptr) return cudaErrorInvalidValue;
  if (x_bf16) return launch_forward<__nv_bfloat16>(out, inp, pos, wte, wpe, B, T, C, V, stream);
  return launch_forward<float>(out, inp, pos, wte, wpe, B, T, C, V, stream);
}

extern "C" cudaError_t lsp_encoder_backward(void* dwte, void* dwpe, const void* dout, const int* inp, const int* pos,
                                            int B, int T, int C, int V, int g_bf16, int dw_bf16, cudaStream_t stream) {
  if (B < 0 || T < 0 || C <= 0 || V <= 0 || lsp_bad_dtype(g_bf16) || lsp_bad_dtype(dw_bf16) ||
      (C + kCols - 1) / kCols > 65535)
    return cudaErrorInvalidValue;
  if ((long long)B * T == 0) return cudaSuccess;
  if (dwte == nullptr || dout == nullptr || inp == nullptr) return cudaErrorInvalidValue;
  typedef __nv_bfloat16 bf;
  if (g_bf16 && dw_bf16) return launch_backward<bf, bf>(dwte, dwpe, dout, inp, pos, B, T, C, V, stream);
  if (g_bf16) return launch_backward<bf, float>(dwte, dwpe, dout, inp, pos, B, T, C, V, stream);
  if (dw_bf16) return launch_backward<float, bf>(dwte, dwpe, dout, inp, pos, B, T, C, V, stream);
  return launch_backward<float, float>(dwte, dwpe, dout, inp, pos, B, T, C, V, stream);
}
