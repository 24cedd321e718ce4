// adamw_plain.go: the CPU backend's AdamW (train/cpu) on the SIMD paths of
// adam.c. Its arithmetic is not the fused host Adam's (AdamStep): it is the
// unfused torch order that the CUDA kernel and its simulator match bit for
// bit, so the backend keeps its results and only gets faster. Also the
// backend's sum of squares (SumSquaresChunks), on the pre-scan's kernel.

package host

/*
#include "adam.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/klauspost/cpuid/v2"
)

// AdamWPlainCoef are one step's coefficients of AdamWPlain, in fp32 as the
// CPU backend computes them.
type AdamWPlainCoef struct {
	Beta1, OneMinusBeta1 float32
	Beta2, OneMinusBeta2 float32
	Eps                  float32
	SqrtBC2              float32 // sqrt(1 - beta2^t)
	Step                 float32 // lr / (1 - beta1^t)
	Decay                float32 // 1 - lr*wd
	GradScale            float32 // clipping; 1 when none
}

// AdamWPlain updates w, m and v in place with the gradient g, and writes
// bf16(w) (nearest even) to bf16Out when it is not nil, on the calling
// goroutine with the ActiveSIMD path. Per element, in fp32, each operation
// rounded (no fused multiply-add):
//
//	g = g*GradScale; m = Beta1*m + OneMinusBeta1*g; v = Beta2*v + (OneMinusBeta2*g)*g
//	w = w*Decay - (Step*m) / (sqrt(v)/SqrtBC2 + Eps)
//
// The result is the same bits on every SIMD path and for any split of the
// elements among callers.
func AdamWPlain(c AdamWPlainCoef, w, m, v []float32, g AdamGrad, bf16Out []uint16) error {
	gt, gp, n, _, err := g.kind()
	if err != nil {
		return fmt.Errorf("host: adamw plain: %w", err)
	}
	if len(w) != n || len(m) != n || len(v) != n || bf16Out != nil && len(bf16Out) != n {
		return fmt.Errorf("host: adamw plain: lengths w %d, m %d, v %d, bf16 out %d, want the gradient's %d",
			len(w), len(m), len(v), len(bf16Out), n)
	}
	if n == 0 {
		return nil
	}
	path := ActiveSIMD()
	if path >= AVX2 && (C.lsp_adam_simd_compiled() == 0 || !cpuid.CPU.Supports(cpuid.F16C)) {
		path = Scalar
	}
	var out *C.uint16_t
	if bf16Out != nil {
		out = (*C.uint16_t)(unsafe.Pointer(&bf16Out[0]))
	}
	cc := C.lsp_adamw_plain_coef{
		beta1: C.float(c.Beta1), omb1: C.float(c.OneMinusBeta1),
		beta2: C.float(c.Beta2), omb2: C.float(c.OneMinusBeta2),
		eps: C.float(c.Eps), sqrtbc2: C.float(c.SqrtBC2),
		step: C.float(c.Step), decay: C.float(c.Decay), gscale: C.float(c.GradScale),
	}
	C.lsp_adamw_plain(C.int(path), cc, (*C.float)(unsafe.Pointer(&w[0])),
		(*C.float)(unsafe.Pointer(&m[0])), (*C.float)(unsafe.Pointer(&v[0])), gp, gt, out, C.size_t(n))
	return nil
}

// SumSquaresChunks writes to out[k] the sum of squares of x[k*chunk :
// (k+1)*chunk] (the last piece may be short) in double, each in the
// pre-scan's canonical order (adam.h: 16 lanes by index, a fixed tree), on
// the calling goroutine. out must have one element per piece.
func SumSquaresChunks(x []float32, chunk int, out []float64) error {
	if chunk <= 0 || len(out) != (len(x)+chunk-1)/chunk {
		return fmt.Errorf("host: sum squares: %d elements in chunks of %d, %d outputs", len(x), chunk, len(out))
	}
	if len(x) == 0 {
		return nil
	}
	path := ActiveSIMD()
	if path >= AVX2 && (C.lsp_adam_simd_compiled() == 0 || !cpuid.CPU.Supports(cpuid.F16C)) {
		path = Scalar
	}
	C.lsp_adam_sumsq_chunks(C.int(path), unsafe.Pointer(&x[0]), C.LSP_ADAM_F32, C.size_t(len(x)), C.size_t(chunk),
		(*C.double)(unsafe.Pointer(&out[0])), C.LSP_PF_NEAR)
	return nil
}
