// CPU references for the dense projection kernels (kernels/dense.cu,
// docs/DESIGN.md, "Projector kinds"): DenseGemm and DenseApply, with the
// launchers' argument order. They serve the svd and gaussian projectors
// (dense P [m,d] and Q [n,d]: compress A = P^T X^T and B = dY Q, apply's
// T = Delta Q^T and W += P T) and GaLore (R = P^T G or G Q, and its
// update's way back).
//
// Layouts are Gemm's: row-major op(A) M x K (A [M][K], or [K][M] with
// transA) and op(B) K x N (B [K][N], or [N][K] with transB). Every element
// is one sum over k ascending from +0 in fp32, each product rounded before
// it is added (float32(a*b): Go never fuses it into an FMA), so that the
// kernel, which disables contraction (__fmul_rn, __fadd_rn), gives the
// same bits, and so does any split of the outputs over threads.
//
// The Backend methods are here too, at the end, next to their reference
// (an op added since the op table keeps its method with its reference, so
// that it touches one CPU file; docs/DESIGN.md, "The op table").
//
// Limits: the products run on host's S core (SIMD, register-tiled, the
// same bits as the plain loops of denseRowsGo), but op(A) and op(B) of a
// transposed operand are copied out first. C and W must not overlap A or
// B.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// denseOperand is op(X) of a dense product as a row-major rows x cols
// fp32 matrix: X itself, or its transpose copied out.
func denseOperand(x []float32, trans bool, rows, cols int) []float32 {
	if !trans {
		return x[:rows*cols]
	}
	t := make([]float32, rows*cols)
	for i := range cols { // x is [cols][rows]
		for j, v := range x[i*rows : (i+1)*rows] {
			t[j*cols+i] = v
		}
	}
	return t
}

// denseRows sets sum[(i-lo)*N+j] to sum over k ascending of
// float32(a[i,k]*b[k,j]) for rows i in [lo,hi), from +0: a is op(A) M x K
// and b op(B) K x N, both row-major. host.DenseRows computes it on the
// SIMD path, with the same bits (TestDenseRowsMatchGoLoops).
func denseRows(sum, a, b []float32, N, K, lo, hi int) error {
	return host.DenseRows(sum, a[lo*K:hi*K], b, K, N, false, 0, hi-lo)
}

// denseRowsGo is denseRows in plain Go loops: the definition the SIMD
// path is tested against.
func denseRowsGo(sum, a, b []float32, N, K, lo, hi int) {
	for i := lo; i < hi; i++ {
		row := sum[(i-lo)*N : (i-lo+1)*N]
		clear(row)
		for k, av := range a[i*K : (i+1)*K] {
			for j, bv := range b[k*N : (k+1)*N] {
				row[j] += float32(av * bv)
			}
		}
	}
}

func checkDense(op string, M, N, K, a, b, c int) error {
	if M < 1 || N < 1 || K < 1 {
		return fmt.Errorf("%s: M=%d N=%d K=%d, want >= 1", op, M, N, K)
	}
	if a < M*K || b < K*N || c < M*N {
		return fmt.Errorf("%s: A, B, C have %d, %d, %d elements, want %d, %d, %d", op, a, b, c, M*K, K*N, M*N)
	}
	return nil
}

// DenseGemm computes C = alpha*op(A) op(B) + beta*C, each element
// float32(alpha*sum) + float32(beta*C) (beta 0: C not read).
func DenseGemm(transA, transB bool, M, N, K int, alpha float32, A, B []float32, beta float32, C []float32) error {
	if err := checkDense("dense gemm", M, N, K, len(A), len(B), len(C)); err != nil {
		return err
	}
	return denseGemmRows(denseOperand(A, transA, M, K), denseOperand(B, transB, K, N), N, K, alpha, beta, C, 0, M)
}

// denseGemmRows is DenseGemm on rows [lo,hi) of C, with a and b already
// op(A) and op(B).
func denseGemmRows(a, b []float32, N, K int, alpha, beta float32, C []float32, lo, hi int) error {
	sum := make([]float32, (hi-lo)*N)
	if err := denseRows(sum, a, b, N, K, lo, hi); err != nil {
		return err
	}
	for k, s := range sum {
		c := &C[lo*N+k]
		if beta == 0 {
			*c = float32(alpha * s)
		} else {
			*c = float32(alpha*s) + float32(beta**c)
		}
	}
	return nil
}

// DenseApply updates the bf16 W [M,N] <- decay*W + alpha*op(A) op(B), each
// element float32(decay*W) + float32(alpha*sum) stored by stochastic
// rounding with the bits of element i*N+j under SRKey(seed, step,
// matrix): the reference of the op on a bf16 W.
func DenseApply(transA, transB bool, M, N, K int, alpha float32, A, B []float32, decay float32, W []uint16,
	seed, step uint64, matrix uint32) error {
	if err := checkDense("dense apply", M, N, K, len(A), len(B), len(W)); err != nil {
		return err
	}
	w := widen(W, M*N)
	if err := denseApplyRows(denseOperand(A, transA, M, K), denseOperand(B, transB, K, N), N, K, alpha, decay, w, 0, M); err != nil {
		return err
	}
	sparseRoundW(W, w, SRKey(seed, step, matrix), 0, M*N)
	return nil
}

// denseApplyRows is the fp32 update of rows [lo,hi) of w in place, a and
// b already op(A) and op(B).
func denseApplyRows(a, b []float32, N, K int, alpha, decay float32, w []float32, lo, hi int) error {
	sum := make([]float32, (hi-lo)*N)
	if err := denseRows(sum, a, b, N, K, lo, hi); err != nil {
		return err
	}
	for k, s := range sum {
		v := &w[lo*N+k]
		*v = float32(decay**v) + float32(alpha*s)
	}
	return nil
}

// DenseGemm implements backend.Ops: C [M,N] F32 = alpha op(A) op(B) +
// beta C in fp32, products rounded before their adds.
func (b *Backend) DenseGemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	const op = "dense gemm"
	return b.op(s, backend.Calls.DenseGemm(transA, transB, M, N, K, alpha, A, B, beta, C), func() error {
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
	return b.op(s, backend.Calls.DenseApply(transA, transB, M, N, K, alpha, A, B, decay, W, skip, seed, step, matrix), func() error {
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
