// The reference of kernels/quant.cu (lsp_dequantize) and of the operand
// kernels/gemm.cu's lsp_gemm_q decodes: a quantized matrix's values
// (train/quant.Decode, the one definition of them; kernels/quant.cuh on
// the device), rounded to the dtype an op computes with.

package cpu

import (
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// dequantize returns elements off..off+n of W as fp32, each rounded to dt
// first when dt is BF16 (GemmQ's operand, as the kernel feeds the tensor
// cores).
func dequantize(W backend.Quant, off, n int, dt backend.DType) []float32 {
	out := make([]float32, n)
	quant.Decode(W.Format, f32View(W.Book), bytesOf(W.Codes), bytesOf(W.Absmax), f32View(W.Scale), off, out)
	if dt == backend.BF16 {
		for i, v := range out {
			out[i] = bf16.ToFloat32(bf16.FromFloat32(v))
		}
	}
	return out
}
