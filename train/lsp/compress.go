// Compression S = P^T G Q in float64 on the host, computed sparsely: from a
// full gradient G (Compress) or from the activations without forming G
// (ProjectActs, ProjectGrads, CompressActs: S = (P^T X^T)(dY Q)). The
// reference for the CUDA and CPU kernels and for the calibration math; it
// is written for clarity, not speed (single thread, O(m n r) for Compress).

package lsp

import "fmt"

// sparse is the float64 row view of a projector used by the reference
// math: row i's columns idx[i*r:(i+1)*r], values val[i*r:(i+1)*r].
type sparse struct {
	rows, d, r int
	idx        []int32
	val        []float64
}

func (p *Projector) view() sparse {
	return sparse{rows: p.M, d: p.D, r: p.R, idx: p.Idx, val: p.values()}
}

// checkPair validates P (m x d) and Q (n x d) and that they share d.
func checkPair(P, Q *Projector) error {
	if err := P.Validate(); err != nil {
		return fmt.Errorf("P: %w", err)
	}
	if err := Q.Validate(); err != nil {
		return fmt.Errorf("Q: %w", err)
	}
	if P.D != Q.D {
		return fmt.Errorf("P is %dx%d and Q %dx%d: they must share d", P.M, P.D, Q.M, Q.D)
	}
	return nil
}

// checkG validates the length of an m x n gradient.
func checkG(G []float32, m, n int) error {
	if len(G) != m*n {
		return fmt.Errorf("G has %d entries, want m*n = %d*%d = %d", len(G), m, n, m*n)
	}
	return nil
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

// leftProject returns P^T G (d x n) for G m x n row-major, using P's rows.
func leftProject(G []float32, n int, p sparse) []float64 {
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

// leftProject64 returns P^T Y (d x d) for Y m x d, using P's rows.
func leftProject64(Y []float64, p sparse) []float64 {
	d, r := p.d, p.r
	out := make([]float64, d*d)
	for i := range p.rows {
		yi := Y[i*d : (i+1)*d]
		for s := i * r; s < (i+1)*r; s++ {
			oa := out[int(p.idx[s])*d : (int(p.idx[s])+1)*d]
			v := p.val[s]
			for b, y := range yi {
				oa[b] += v * y
			}
		}
	}
	return out
}

// Compress returns S = P^T G Q (d x d, row-major, float64) for G (m x n,
// row-major) without densifying P or Q: G Q gathers r entries of Q per
// column of G, then row a of S sums column a of P (column storage) against
// the rows of G Q.
func Compress(P, Q *Projector, G []float32) ([]float64, error) {
	if err := checkPair(P, Q); err != nil {
		return nil, fmt.Errorf("lsp compress: %w", err)
	}
	if err := checkG(G, P.M, Q.M); err != nil {
		return nil, fmt.Errorf("lsp compress: %w", err)
	}
	d := P.D
	gq := rightProject(G, P.M, Q.view())
	S := make([]float64, d*d)
	for a := range d {
		sa := S[a*d : (a+1)*d]
		for k := P.ColPtr[a]; k < P.ColPtr[a+1]; k++ {
			v := float64(P.ColVal[k])
			for b, y := range gq[int(P.RowIdx[k])*d : (int(P.RowIdx[k])+1)*d] {
				sa[b] += v * y
			}
		}
	}
	return S, nil
}

// ProjectActs returns A = P^T X^T (d x bt, row-major) for activations X (bt
// x m, row-major), walking P's columns as the compress kernel does. This is
// what the forward pass keeps instead of X; matrices sharing P share A.
func ProjectActs(P *Projector, X []float32, bt int) ([]float64, error) {
	if err := P.Validate(); err != nil {
		return nil, fmt.Errorf("lsp project activations: P: %w", err)
	}
	if bt < 1 || len(X) != bt*P.M {
		return nil, fmt.Errorf("lsp project activations: X has %d entries, want bt*m = %d*%d (bt >= 1)", len(X), bt, P.M)
	}
	m, d := P.M, P.D
	A := make([]float64, d*bt)
	for a := range d {
		lo, hi := P.ColPtr[a], P.ColPtr[a+1]
		for t := range bt {
			xt := X[t*m : (t+1)*m]
			var acc float64
			for k := lo; k < hi; k++ {
				acc += float64(P.ColVal[k]) * float64(xt[P.RowIdx[k]])
			}
			A[a*bt+t] = acc
		}
	}
	return A, nil
}

// ProjectGrads returns B = dY Q (bt x d, row-major) for output gradients dY
// (bt x n, row-major), gathering Q's r entries per output column.
func ProjectGrads(Q *Projector, dY []float32, bt int) ([]float64, error) {
	if err := Q.Validate(); err != nil {
		return nil, fmt.Errorf("lsp project gradients: Q: %w", err)
	}
	if bt < 1 || len(dY) != bt*Q.M {
		return nil, fmt.Errorf("lsp project gradients: dY has %d entries, want bt*n = %d*%d (bt >= 1)", len(dY), bt, Q.M)
	}
	return rightProject(dY, bt, Q.view()), nil
}

// CompressActs returns S = (P^T X^T)(dY Q) = P^T G Q for G = X^T dY without
// forming G: X is bt x m, dY bt x n, both row-major.
func CompressActs(P, Q *Projector, X, dY []float32, bt int) ([]float64, error) {
	if err := checkPair(P, Q); err != nil {
		return nil, fmt.Errorf("lsp compress activations: %w", err)
	}
	A, err := ProjectActs(P, X, bt)
	if err != nil {
		return nil, err
	}
	B, err := ProjectGrads(Q, dY, bt)
	if err != nil {
		return nil, err
	}
	d := P.D
	S := make([]float64, d*d)
	for a := range d {
		sa := S[a*d : (a+1)*d]
		for t, at := range A[a*bt : (a+1)*bt] {
			if at == 0 {
				continue
			}
			for b, y := range B[t*d : (t+1)*d] {
				sa[b] += at * y
			}
		}
	}
	return S, nil
}
