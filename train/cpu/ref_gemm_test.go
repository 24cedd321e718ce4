// The float64 reference of the matrix multiply, naive loops that
// ops_test.go's TestGemm holds the op (and so ref_gemm.go's Gemm) to.

package cpu

// gemm64: C = alpha*op(A)*op(B) + beta*C, row-major, op(A) M x K.
func gemm64(transA, transB bool, M, N, K int, alpha float64, A, B []float64, beta float64, C []float64) []float64 {
	out := make([]float64, M*N)
	for i := range M {
		for j := range N {
			var s float64
			for k := range K {
				a, b := opAB(transA, transB, M, N, K, A, B, i, j, k)
				s += a * b
			}
			out[i*N+j] = alpha * s
			if beta != 0 {
				out[i*N+j] += beta * C[i*N+j]
			}
		}
	}
	return out
}

// opAB is op(A)[i,k] and op(B)[k,j] for row-major A and B, op(A) M x K
// and op(B) K x N, transposed where transA and transB say.
func opAB[T float32 | float64](transA, transB bool, M, N, K int, A, B []T, i, j, k int) (a, b T) {
	a, b = A[i*K+k], B[k*N+j]
	if transA {
		a = A[k*M+i]
	}
	if transB {
		b = B[j*K+k]
	}
	return a, b
}
