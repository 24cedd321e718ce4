// Small dense linear algebra in float64 on square d x d row-major matrices,
// enough for the projector math (products, Gram matrices, Cholesky solves).
// Loops run in i-k-j order for contiguous inner access; no blocking or
// threads: d is at most a few thousand and these run once per check.

package lsp

import (
	"fmt"
	"math"
)

// matMul returns a*b for d x d row-major a, b.
func matMul(a, b []float64, d int) []float64 {
	out := make([]float64, d*d)
	for i := range d {
		oi := out[i*d : (i+1)*d]
		for k, aik := range a[i*d : (i+1)*d] {
			if aik == 0 {
				continue
			}
			for j, bkj := range b[k*d : (k+1)*d] {
				oi[j] += aik * bkj
			}
		}
	}
	return out
}

// transpose returns the transpose of a rows x cols row-major matrix.
func transpose(a []float64, rows, cols int) []float64 {
	out := make([]float64, rows*cols)
	for i := range rows {
		for j := range cols {
			out[j*rows+i] = a[i*cols+j]
		}
	}
	return out
}

// dot is the sum of the elementwise products of a and b.
func dot(a, b []float64) float64 {
	var s float64
	for k, v := range a {
		s += v * b[k]
	}
	return s
}

// cholesky factors the symmetric positive definite d x d matrix a (only the
// lower triangle is read) as L L^T and returns L row-major.
func cholesky(a []float64, d int) ([]float64, error) {
	l := make([]float64, d*d)
	for j := range d {
		s := a[j*d+j] - dot(l[j*d:j*d+j], l[j*d:j*d+j])
		if !(s > 0) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("matrix not positive definite at pivot %d (%v); use a positive ridge", j, s)
		}
		ljj := math.Sqrt(s)
		l[j*d+j] = ljj
		for i := j + 1; i < d; i++ {
			l[i*d+j] = (a[i*d+j] - dot(l[i*d:i*d+j], l[j*d:j*d+j])) / ljj
		}
	}
	return l, nil
}

// cholSolve solves L L^T x = b in place for one right-hand side b.
func cholSolve(l, b []float64, d int) {
	for i := range d { // L y = b
		b[i] = (b[i] - dot(l[i*d:i*d+i], b[:i])) / l[i*d+i]
	}
	for i := d - 1; i >= 0; i-- { // L^T x = y
		s := b[i]
		for k := i + 1; k < d; k++ {
			s -= l[k*d+i] * b[k]
		}
		b[i] = s / l[i*d+i]
	}
}
