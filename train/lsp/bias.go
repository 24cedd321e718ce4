// The bias ratio ||P P^T G Q Q^T - G||_F / ||G||_F of one matrix's gradient
// and the analytic gradient of its square with respect to the projectors'
// non-zero values, both without forming the m x n reconstruction.
//
// Derivation. Let S = P^T G Q, A = P^T P, B = Q^T Q (d x d, symmetric) and
// R = P S Q^T, the reconstruction. Then
//
//	||R||^2   = tr(Q S^T P^T P S Q^T) = tr(S^T A S B) = sum_ab (A S)_ab (S B)_ab
//	<R, G>    = tr(Q S^T P^T G)       = tr(S^T P^T G Q) = ||S||^2
//	f = ||R - G||^2 = tr(S^T A S B) - 2 ||S||^2 + ||G||^2,  ratio^2 = f / ||G||^2.
//
// Differentiating in P (S = P^T (G Q), A = P^T P; A and B symmetric):
//
//	df = 2 <A S B, dS> - 4 <S, dS> + tr(S^T dA S B)
//	   = <H, dP^T G Q> + tr(S B S^T (dP^T P + P^T dP)),   H = 2 (A S B - 2 S)
//	grad_P f = (G Q) H^T + 2 P (S B S^T)                    (m x d)
//
// and symmetrically in Q (S = (P^T G) Q, B = Q^T Q):
//
//	grad_Q f = (P^T G)^T H + 2 Q (S^T A S)                  (n x d)
//
// Only the entries at the projectors' positions are needed: entry (i,a) of
// grad_P costs one length-d dot of row i of G Q with row a of H plus r
// terms of P K, so the gradient costs O(m r d + n r d + d^3) on top of the
// O(m n r) products G Q and P^T G. f is small relative to its terms when
// the ratio is small; in float64 that cancellation loses about
// 16 - 2 log10(1/ratio) digits, ample for ratios above 1e-4.

package lsp

import "math"

// gram returns P^T P (d x d) from P's rows: O(m r^2).
func gram(p sparse) []float64 {
	d, r := p.d, p.r
	out := make([]float64, d*d)
	for i := range p.rows {
		for s := i * r; s < (i+1)*r; s++ {
			a, v := int(p.idx[s]), p.val[s]
			for t := i * r; t < (i+1)*r; t++ {
				out[a*d+int(p.idx[t])] += v * p.val[t]
			}
		}
	}
	return out
}

// crossGram returns X^T Y (d x d) for projectors X, Y of the same rows and
// d: O(m r_x r_y).
func crossGram(x, y sparse) []float64 {
	d := x.d
	out := make([]float64, d*d)
	for i := range x.rows {
		for s := i * x.r; s < (i+1)*x.r; s++ {
			a, v := int(x.idx[s]), x.val[s]
			for t := i * y.r; t < (i+1)*y.r; t++ {
				out[a*d+int(y.idx[t])] += v * y.val[t]
			}
		}
	}
	return out
}

// sqNorm32 is ||G||_F^2 in float64.
func sqNorm32(G []float32) float64 {
	var s float64
	for _, g := range G {
		s += float64(g) * float64(g)
	}
	return s
}

// evaluation is the bias objective of a set of matrices sharing P, and
// optionally its gradient in the values of P and of each Q.
type evaluation struct {
	obj    float64     // sum over matrices of f_k / ||G_k||^2
	ratios []float64   // per matrix, sqrt(max(f_k,0) / ||G_k||^2)
	s2, r2 []float64   // per matrix, ||S_k||^2 and ||R_k||^2 over ||G_k||^2
	gp     []float64   // d obj / d P's values (row storage order)
	gqs    [][]float64 // d obj / d Q_k's values
}

// evaluate computes the objective sum_k ||P P^T G_k Q_k Q_k^T - G_k||^2 /
// ||G_k||^2 and, when grad, its gradient, following the derivation at the
// top of this file. g2s[k] = ||G_k||^2 > 0.
func evaluate(Gs [][]float32, g2s []float64, p sparse, qs []sparse, grad bool) evaluation {
	m, d := p.rows, p.d
	A := gram(p)
	ev := evaluation{ratios: make([]float64, len(qs)), s2: make([]float64, len(qs)), r2: make([]float64, len(qs))}
	if grad {
		ev.gp = make([]float64, len(p.val))
		ev.gqs = make([][]float64, len(qs))
	}
	for k, q := range qs {
		G, g2, n := Gs[k], g2s[k], q.rows
		gq := rightProject(G, m, q) // G Q, m x d
		S := leftProject(gq, d, p)  // P^T G Q
		B := gram(q)
		AS, SB := matMul(A, S, d), matMul(S, B, d)
		r2, s2 := dot(AS, SB), dot(S, S)
		ev.s2[k], ev.r2[k] = s2/g2, r2/g2
		f := r2 - 2*s2 + g2
		ev.obj += f / g2
		ev.ratios[k] = math.Sqrt(max(f, 0) / g2)
		if !grad {
			continue
		}
		w := 2 / g2 // H = 2 (A S B - 2 S); the factor 2 and 1/||G||^2 go in w
		H := matMul(AS, B, d)
		for e := range H {
			H[e] -= 2 * S[e]
		}
		St := transpose(S, d, d)
		K := matMul(SB, St, d) // S B S^T
		L := matMul(St, AS, d) // S^T A S
		// P: (G Q H^T)[i,a] = row i of G Q . row a of H; (2 P K)[i,a].
		addValueGrad(ev.gp, p, gq, H, K, w)
		// Q: ((P^T G)^T H)[j,a] = column j of P^T G . column a of H.
		gtp := transpose(leftProject(G, n, p), d, n) // G^T P, n x d
		ev.gqs[k] = make([]float64, len(q.val))
		addValueGrad(ev.gqs[k], q, gtp, transpose(H, d, d), L, w)
	}
	return ev
}

// addValueGrad adds w times the gradient in x's values to out, the same
// formula for P and for Q: entry s of row i, at column a, gets
// Y[i,:] . M[a,:] + sum over row i's entries t of x.val[t] K[x.idx[t], a]
// (Y is x.rows x d; M and K are d x d).
func addValueGrad(out []float64, x sparse, Y, M, K []float64, w float64) {
	d, r := x.d, x.r
	for i := range x.rows {
		yi := Y[i*d : (i+1)*d]
		for s := i * r; s < (i+1)*r; s++ {
			a := int(x.idx[s])
			g := dot(yi, M[a*d:(a+1)*d])
			for t := i * r; t < (i+1)*r; t++ {
				g += x.val[t] * K[int(x.idx[t])*d+a]
			}
			out[s] += w * g
		}
	}
}

// orthoPenalty is ||A/t - I||_F^2 / d for A = P^T P and t = tr(A)/d, how far
// P's columns are from orthogonal with equal norms (0 for such columns,
// whatever their scale), and its gradient in P's values:
//
//	E = A/t - I (symmetric), dA = dP^T P + P^T dP, dt = 2 <P, dP> / d
//	d pen = (2/d) <E, dA/t - A dt/t^2> = (4/(d t)) <P E - (<E, A>/(t d)) P, dP>
//
// A fit that only lowers the bias ratio turns many columns toward the
// gradient's few top directions; the update P Delta Q^T of subspace Adam,
// whose entries are all about the learning rate, then adds up along those
// directions instead of spreading over d^2 of them as with random
// projectors. O(m r^2 + d^2).
func orthoPenalty(p sparse) (float64, []float64) {
	d, r := p.d, p.r
	A := gram(p)
	var t float64
	for a := range d {
		t += A[a*d+a]
	}
	t /= float64(d)
	if !(t > 0) {
		return 0, make([]float64, len(p.val))
	}
	E := make([]float64, d*d)
	var pen, ea float64
	for e, v := range A {
		E[e] = v / t
		if e%(d+1) == 0 {
			E[e]--
		}
		pen += E[e] * E[e]
		ea += E[e] * v
	}
	pen /= float64(d)
	grad := make([]float64, len(p.val))
	c, shrink := 4/(float64(d)*t), ea/(t*float64(d))
	for i := range p.rows {
		for s := i * r; s < (i+1)*r; s++ {
			a := int(p.idx[s])
			var pe float64 // (P E)[i,a]
			for u := i * r; u < (i+1)*r; u++ {
				pe += p.val[u] * E[int(p.idx[u])*d+a]
			}
			grad[s] = c * (pe - shrink*p.val[s])
		}
	}
	return pen, grad
}
