// CPU references for kernels/adam.cu, with the launchers' names
// (lsp_adamw, lsp_non_finite_flag): PyTorch's AdamW step (torch.optim.AdamW:
// decoupled weight decay, bias correction, eps outside the square root) on
// a gradient scaled as clip_grad_norm_ does, and the flag that skips a step
// whose losses are not finite. Per element, in fp32, each operation rounded:
//
//	g  = grad * gscale     gscale = min(1, max_norm / (sqrt(sum_sq) + 1e-6))
//	                       when max_norm > 0 (the ratio in double), else 1
//	m  = beta1 m + (1 - beta1) g
//	v  = beta2 v + (1 - beta2) g g
//	w  = w (1 - lr wd) - step_size m / (sqrt(v) / sqrt(bc2) + eps)
//	     step_size = lr / bc1, bc_i = 1 - beta_i^step (double)
//
// w is the fp32 master copy when there is one, else the param itself
// (widened if bf16); a bf16 param receives bf16(w), rounded to nearest
// even. The skip flag is the op's to read (ops.go): set, the op does not
// call AdamW at all.
//
// The loops are C, package host's (host/adam.c through
// host/adamw_plain.go, host.AdamWPlain), for speed: scalar, AVX2 and
// AVX-512 paths over the elements. Every element is independent and no
// multiply-add is fused, so every SIMD path and any split of the
// elements over threads (the op splits them) give the same bits, which
// the CUDA kernel matches bit for bit. It is not the fused host Adam of
// zero mode (host.AdamStep), whose order differs.
//
// Limits: step >= 1; the lengths of w, m, v, the gradient and a bf16
// param must agree.

package cpu

import (
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// AdamW is the reference of lsp_adamw: one step of p on the fp32 weights
// w, in place, with the gradient grad (fp32 or bf16: exactly one field
// set) and the fp32 moments m and v; param16, when not nil, receives
// bf16(w). sumSq is the squared gradient norm, read only when p.MaxNorm >
// 0.
func AdamW(w []float32, param16 []uint16, grad host.AdamGrad, m, v []float32, sumSq float32, p backend.AdamParams) error {
	if p.Step < 1 {
		return fmt.Errorf("adamw: step %d, want >= 1", p.Step)
	}
	return host.AdamWPlain(adamCoef(p, adamGradScale(p, sumSq)), w, m, v, grad, param16)
}

// adamGradScale is the clipping coefficient min(1, max/(norm+1e-6)), as
// torch's clip_grad_norm_ and the host Adam; a NaN norm leaves the
// gradient as it is.
func adamGradScale(p backend.AdamParams, sumSq float32) float32 {
	gscale := float32(1)
	if p.MaxNorm > 0 {
		norm := math.Sqrt(float64(sumSq))
		if c := float64(p.MaxNorm) / (norm + 1e-6); c < 1 {
			gscale = float32(c)
		}
	}
	return gscale
}

// adamCoef is PyTorch's AdamW step in fp32 (decoupled decay, then the Adam
// update with bias correction and eps outside the square root) as the
// coefficients of host.AdamWPlain, which runs it unfused, in the order the
// CUDA kernel matches bit for bit.
func adamCoef(p backend.AdamParams, gscale float32) host.AdamWPlainCoef {
	bc1 := 1 - math.Pow(float64(p.Beta1), float64(p.Step))
	bc2 := 1 - math.Pow(float64(p.Beta2), float64(p.Step))
	return host.AdamWPlainCoef{Beta1: p.Beta1, OneMinusBeta1: 1 - p.Beta1, Beta2: p.Beta2, OneMinusBeta2: 1 - p.Beta2,
		Eps: p.Eps, SqrtBC2: float32(math.Sqrt(bc2)), Step: float32(float64(p.LR) / bc1),
		Decay: 1 - p.LR*p.WeightDecay, GradScale: gscale}
}

// NonFiniteFlag is the reference of lsp_non_finite_flag: flag[0] = 1 when
// some element of x is NaN or ±Inf, else 0.
func NonFiniteFlag(flag, x []float32) {
	bad := float32(0)
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			bad = 1
			break
		}
	}
	flag[0] = bad
}
