// svd.go: the singular vectors a refresh keeps, from a one-sided Jacobi
// SVD in float64. The matrices of the host reference are small, and Jacobi
// is simple and accurate (relative accuracy in the singular vectors of
// well separated values); it is not the device's method.

package galore

import (
	"math"
	"sort"
)

// svdTop returns the right singular vectors of a (rows x cols, row-major)
// belonging to its k largest singular values, as a cols x k row-major
// matrix (orthonormal columns, largest value first).
//
// One-sided Jacobi (Hestenes): rotate pairs of columns of a, and the same
// pairs of V (starting at the identity), until every pair is orthogonal;
// then a V = U S, the column norms are the singular values and V holds the
// right singular vectors. V is a product of rotations, so its columns are
// orthonormal even where a's rank is below k.
//
// Signs: each kept vector is flipped so that its entry of largest
// magnitude is positive (the first such on ties), a fixed convention where
// LAPACK's (torch's) is whatever its algorithm leaves.
func svdTop(a []float64, rows, cols, k int) []float64 {
	// Column-major copies: col[j] is column j of a, v[j] column j of V.
	col := make([][]float64, cols)
	v := make([][]float64, cols)
	for j := range cols {
		col[j] = make([]float64, rows)
		for i := range rows {
			col[j][i] = a[i*cols+j]
		}
		v[j] = make([]float64, cols)
		v[j][j] = 1
	}
	const tol = 1e-14
	for sweep := 0; sweep < 100; sweep++ {
		rotated := false
		for p := 0; p < cols-1; p++ {
			for q := p + 1; q < cols; q++ {
				alpha, beta, gamma := dot(col[p], col[p]), dot(col[q], col[q]), dot(col[p], col[q])
				if gamma == 0 || math.Abs(gamma) <= tol*math.Sqrt(alpha*beta) {
					continue
				}
				rotated = true
				zeta := (beta - alpha) / (2 * gamma)
				t := math.Copysign(1, zeta) / (math.Abs(zeta) + math.Sqrt(1+zeta*zeta))
				c := 1 / math.Sqrt(1+t*t)
				s := c * t
				rotate(col[p], col[q], c, s)
				rotate(v[p], v[q], c, s)
			}
		}
		if !rotated {
			break
		}
	}
	order := make([]int, cols)
	norms := make([]float64, cols)
	for j := range cols {
		order[j] = j
		norms[j] = math.Sqrt(dot(col[j], col[j]))
	}
	sort.SliceStable(order, func(x, y int) bool { return norms[order[x]] > norms[order[y]] })
	out := make([]float64, cols*k)
	for a := range k {
		vec := v[order[a]]
		big := 0
		for i := range vec {
			if math.Abs(vec[i]) > math.Abs(vec[big]) {
				big = i
			}
		}
		sign := 1.0
		if vec[big] < 0 {
			sign = -1
		}
		for i := range cols {
			out[i*k+a] = sign * vec[i]
		}
	}
	return out
}

func dot(x, y []float64) float64 {
	var s float64
	for i := range x {
		s += x[i] * y[i]
	}
	return s
}

// rotate applies the plane rotation (c, s) to the pair (x, y):
// x' = c x - s y, y' = s x + c y.
func rotate(x, y []float64, c, s float64) {
	for i := range x {
		xi, yi := x[i], y[i]
		x[i] = c*xi - s*yi
		y[i] = s*xi + c*yi
	}
}
