// The sparse float64 products of a full gradient G (m x n) with the
// projectors that the bias objective (bias.go) needs: G Q, P^T G and
// P^T (G Q), each from the projectors' row storage without densifying them.
// They run on the host once per projector check, so they are written for
// clarity, not speed (one thread, O(m n r)). The per-step compression
// S = (P^T X^T)(dY Q) is a backend op, not this: its CPU reference is
// train/cpu's ref_sparse.go.

package lsp

// sparse is the float64 row view of a projector used by the bias math:
// row i's columns idx[i*r:(i+1)*r], values val[i*r:(i+1)*r].
type sparse struct {
	rows, d, r int
	idx        []int32
	val        []float64
}

// view returns p's row storage in float64.
func (p *Projector) view() sparse {
	return sparse{rows: p.M, d: p.D, r: p.R, idx: p.Idx, val: p.values()}
}

// rightProject returns G Q (m x d) for G m x n row-major, using Q's rows:
// (G Q)[i,b] = sum over j and Q's entries (j,b) of G[i,j] Q[j,b].
func rightProject(G []float32, m int, q sparse) []float64 {
	n, d, r := q.rows, q.d, q.r
	out := make([]float64, m*d)
	for i := range m {
		oi := out[i*d : (i+1)*d]
		for j, g := range G[i*n : (i+1)*n] {
			if g == 0 {
				continue
			}
			gv := float64(g)
			for s := j * r; s < (j+1)*r; s++ {
				oi[q.idx[s]] += gv * q.val[s]
			}
		}
	}
	return out
}

// leftProject returns P^T G (d x n) for G (m x n, row-major; the gradient
// in float32 or G Q in float64), using P's rows.
func leftProject[T float32 | float64](G []T, n int, p sparse) []float64 {
	d, r := p.d, p.r
	out := make([]float64, d*n)
	for i := range p.rows {
		gi := G[i*n : (i+1)*n]
		for s := i * r; s < (i+1)*r; s++ {
			oa := out[int(p.idx[s])*n : (int(p.idx[s])+1)*n]
			v := p.val[s]
			for j, g := range gi {
				oa[j] += v * float64(g)
			}
		}
	}
	return out
}
