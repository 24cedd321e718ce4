// The dense projection ops of the CPU backend (docs/DESIGN.md, "Projector
// kinds"): DenseGemm and DenseApply on the references' cores
// (ref_dense.go: host's SIMD S core), split over rows of the output,
// which does not change a bit of the result.

package cpu

import (
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// DenseGemm implements backend.Ops: C [M,N] F32 = alpha op(A) op(B) +
// beta C in fp32, products rounded before their adds.
func (b *Backend) DenseGemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	const op = "dense gemm"
	if err := checkPositive(op, "M N K", M, N, K); err != nil {
		return err
	}
	if err := b.needAll(op, f("A", A, M*K), f("B", B, K*N), f("C", C, M*N)); err != nil {
		return err
	}
	if err := needF32(op, f("C", C, 0)); err != nil {
		return err
	}
	if err := b.kernelDTypes("DenseGemm", A, B, C); err != nil {
		return err
	}
	return b.enqueue(s, hazard.DenseGemm(A, B, beta, C), func() error {
		a, bb, c := denseOperand(load(A), transA, M, K), denseOperand(load(B), transB, K, N), f32View(C)
		return b.parallelErr(op, M, 1, func(lo, hi int) error { return denseGemmRows(a, bb, N, K, alpha, beta, c, lo, hi) })
	})
}

// DenseApply implements backend.Ops: W <- decay W + alpha op(A) op(B); a
// bf16 W is stored by stochastic rounding. A set skip flag leaves W as it
// is.
func (b *Backend) DenseApply(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, decay float32, W, skip backend.Tensor,
	seed, step uint64, matrix uint32) error {
	const op = "dense apply"
	if err := checkPositive(op, "M N K", M, N, K); err != nil {
		return err
	}
	if err := b.needAll(op, f("A", A, M*K), f("B", B, K*N), f("W", W, M*N)); err != nil {
		return err
	}
	if err := needF32(op, f("A", A, 0), f("B", B, 0)); err != nil {
		return err
	}
	if err := b.needSkip(op, skip); err != nil {
		return err
	}
	if err := b.kernelDTypes("DenseApply", A, B, W, skip); err != nil {
		return err
	}
	return b.enqueue(s, hazard.DenseApply(A, B, W, skip), func() error {
		if skipped(skip) {
			return nil
		}
		a, bb := denseOperand(f32View(A), transA, M, K), denseOperand(f32View(B), transB, K, N)
		w, key := load(W), SRKey(seed, step, matrix) // an fp32 W is updated in place, exactly
		return b.parallelErr(op, M, 1, func(lo, hi int) error {
			if err := denseApplyRows(a, bb, N, K, alpha, decay, w, lo, hi); err != nil {
				return err
			}
			if W.DType == backend.BF16 {
				sparseRoundW(u16View(W), w, key, lo*N, hi*N)
			}
			return nil
		})
	})
}
