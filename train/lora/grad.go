// grad.go: the adapter's gradients from the dense gradient of the merged
// matrix, the host reference that the engine's device path and the tests
// compare with.

package lora

import "fmt"

// Grads writes the gradients of A and B given g, the gradient of the loss
// with respect to the effective matrix W + scale (B A)^T (in x out,
// row-major M x N, the dense gradient a model computes for a merged
// matrix; the unmerged forward has the same one):
//
//	dA[k, i] = scale * sum_j g[i, j] B[j, k]    (R x M)
//	dB[j, k] = scale * sum_i g[i, j] A[k, i]    (N x R)
//
// Sums are taken in float64 in a fixed order, so the result does not
// depend on the machine. da and db are overwritten.
func Grads(g []float32, site Site, a, b []float32, scale float32, da, db []float32) error {
	m, n := site.M, site.N
	r, err := checkShapes("grads", "the gradient", g, site, a, b)
	if err != nil {
		return err
	}
	switch {
	case len(da) != len(a):
		return fmt.Errorf("lora grads %s: dA has %d elements, want %d x %d", site.Module, len(da), r, m)
	case len(db) != len(b):
		return fmt.Errorf("lora grads %s: dB has %d elements, want %d x %d", site.Module, len(db), n, r)
	}
	s := float64(scale)
	acc := make([]float64, max(m, n)*r)
	// dA: row i of g times B (N x R) gives dA's column i.
	clear(acc)
	for i := range m {
		gi := g[i*n : (i+1)*n]
		for j, gv := range gi {
			bj := b[j*r : (j+1)*r]
			for k := range r {
				acc[i*r+k] += float64(gv) * float64(bj[k])
			}
		}
	}
	for i := range m {
		for k := range r {
			da[k*m+i] = float32(s * acc[i*r+k])
		}
	}
	// dB: column j of g against A's rows.
	clear(acc)
	for i := range m {
		gi := g[i*n : (i+1)*n]
		for j, gv := range gi {
			for k := range r {
				acc[j*r+k] += float64(gv) * float64(a[k*m+i])
			}
		}
	}
	for j := range n {
		for k := range r {
			db[j*r+k] = float32(s * acc[j*r+k])
		}
	}
	return nil
}
