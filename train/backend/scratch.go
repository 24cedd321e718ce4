// Scratch sizes of the ops that need device scratch memory. The caller
// allocates the scratch (in its own arena, so its memory plan counts it)
// and passes it to the op; no backend allocates behind the plan's back.
//
// The formulas mirror the CUDA launchers' (kernels/kernels.h): a size that
// drifts from its launcher's is a bug, and a simulator test in
// kernels/simtest cross-checks each function here against the launcher's
// own size (lsp_layernorm_backward_scratch_bytes, B*NH*T floats for the
// attention backward, LSP_SUM_SQUARES_WORK).

package backend

// The LayerNorm backward sums dweight and dbias in chunks of rows, then the
// chunks in order (kernels/norms.cu): P = min(ceil(N/32), 512) chunks,
// depending on N only, so that the bits are the same on every GPU.
const (
	normMinChunkRows = 32  // rows per partial column sum, at least
	normMaxChunks    = 512 // partial column sums, at most
)

// normChunks is P, the number of partial column sums over N rows.
func normChunks(N int) int {
	return min((N+normMinChunkRows-1)/normMinChunkRows, normMaxChunks)
}

// LayerNormBackwardScratch is the number of F32 elements of scratch
// LayerNormBackward needs for N rows of C: the partial sums of dweight and
// of dbias, C per chunk each (lsp_layernorm_backward_scratch_bytes / 4).
// It is 0 when N or C is not positive (nothing to sum).
func LayerNormBackwardScratch(N, C int) int {
	if N <= 0 || C <= 0 {
		return 0
	}
	return 2 * normChunks(N) * C
}

// RMSNormBackwardScratch is the number of F32 elements of scratch
// RMSNormBackward needs for N rows of C: the partial sums of dweight, C
// per chunk (lsp_rmsnorm_backward_scratch_bytes / 4). It is 0 when N or C
// is not positive.
func RMSNormBackwardScratch(N, C int) int {
	if N <= 0 || C <= 0 {
		return 0
	}
	return normChunks(N) * C
}

// AttentionBackwardScratch is the number of F32 elements of scratch
// AttentionBackward needs: D = rowsum(dout * out), one per (b, head, t),
// B*NH*T (kernels/attention.cu).
func AttentionBackwardScratch(B, T, NH int) int {
	if B <= 0 || T <= 0 || NH <= 0 {
		return 0
	}
	return B * NH * T
}

// SumSquaresWork is the number of F64 elements of work SumSquares needs,
// whatever the length of x: one partial sum per block of the first pass
// (LSP_SUM_SQUARES_WORK of kernels/kernels.h).
const SumSquaresWork = 1024
