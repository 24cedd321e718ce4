// What the engine measures of a projector pair besides the bias ratio:
// the per-column gains that keep the update's size independent of
// fitting, the compressed gradient S = P^T G Q itself, and the share of a
// gradient's energy inside the pair's subspace, which does not depend on
// the projectors' scale and so can compare a fitted pair with a random one.

package lsp

import (
	"fmt"
	"math"
)

// Gains returns one gain per column of P (m x d): g_a = sqrt((m/d) /
// ||P[:,a]||^2), 1 for a column without entries. A fresh random projector
// has E||P[:,a]||^2 = m/d (r entries of variance 1/r per row, spread over d
// columns), so its gains are about 1; a fitted one tends toward
// orthonormal columns, whose update P Delta Q^T would be about
// sqrt(m n)/d times smaller than a random pair's at the same learning rate.
// Scaling Delta[a,b] by g_a h_b (P's and Q's gains) is the update of the
// pair with every column rescaled to the random squared norm, and the same
// Adam moments (Adam does not see a per-coordinate scale of S).
func (p *Projector) Gains() []float32 {
	norm := make([]float64, p.D)
	for s, a := range p.Idx {
		v := float64(p.Val[s])
		norm[a] += v * v
	}
	want := float64(p.M) / float64(p.D)
	g := make([]float32, p.D)
	for a, n := range norm {
		g[a] = 1
		if n > 0 {
			g[a] = float32(math.Sqrt(want / n))
		}
	}
	return g
}

// Project returns S = P^T G Q (d x d, row-major, float64) of one m x n
// gradient.
func Project(P, Q *Projector, G []float32) ([]float64, error) {
	if err := checkPair(P, Q); err != nil {
		return nil, fmt.Errorf("lsp project: %w", err)
	}
	if err := checkG(G, P.M, Q.M); err != nil {
		return nil, fmt.Errorf("lsp project: %w", err)
	}
	return leftProject(rightProject(G, P.M, Q.view()), P.D, P.view()), nil
}

// Capture returns the share of ||G||^2 that lies in the subspace of the
// pair: ||Pi_P G Pi_Q||^2 / ||G||^2 with Pi_P = P (P^T P)^-1 P^T the
// orthogonal projection onto P's columns (Q likewise), computed as
// tr(S^T A^-1 S B^-1) / ||G||^2 with S = P^T G Q, A = P^T P, B = Q^T Q and
// a ridge of 1e-9 of A's (B's) mean diagonal. In [0, 1]; random pairs
// capture about d^2 / (m n) of a gradient without structure. Unlike the
// bias ratio it is the same for P and P diag(c), so it compares a fitted
// pair with any other.
func Capture(P, Q *Projector, G []float32) (float64, error) {
	S, err := Project(P, Q, G)
	if err != nil {
		return 0, err
	}
	g2 := sqNorm32(G)
	if !(g2 > 0) || math.IsInf(g2, 0) {
		return 0, fmt.Errorf("lsp capture: ||G||^2 = %v, want finite and positive", g2)
	}
	d := P.D
	solver := func(p *Projector) ([]float64, error) {
		A := gram(p.view())
		var tr float64
		for a := range d {
			tr += A[a*d+a]
		}
		return ridgeCholesky(A, d, 1e-9*max(tr/float64(d), math.SmallestNonzeroFloat64))
	}
	la, err := solver(P)
	if err != nil {
		return 0, fmt.Errorf("lsp capture: P^T P: %w", err)
	}
	lb, err := solver(Q)
	if err != nil {
		return 0, fmt.Errorf("lsp capture: Q^T Q: %w", err)
	}
	// Z = A^-1 S, column by column (the rows of S^T), then Z B^-1 row by
	// row (B is symmetric).
	Z := transpose(S, d, d)
	for a := range d {
		cholSolve(la, Z[a*d:(a+1)*d], d)
	}
	Z = transpose(Z, d, d)
	for a := range d {
		cholSolve(lb, Z[a*d:(a+1)*d], d)
	}
	return min(max(dot(S, Z)/g2, 0), 1), nil
}

// BiasRatio is one matrix's bias ratio ||P P^T G Q Q^T - G|| / ||G||, as a
// fit measures it.
func BiasRatio(P, Q *Projector, G []float32) (float64, error) {
	if err := checkPair(P, Q); err != nil {
		return 0, fmt.Errorf("lsp bias ratio: %w", err)
	}
	if err := checkG(G, P.M, Q.M); err != nil {
		return 0, fmt.Errorf("lsp bias ratio: %w", err)
	}
	g2 := sqNorm32(G)
	if !(g2 > 0) || math.IsInf(g2, 0) {
		return 0, fmt.Errorf("lsp bias ratio: ||G||^2 = %v, want finite and positive", g2)
	}
	return evaluate([][]float32{G}, []float64{g2}, P.view(), []sparse{Q.view()}, false).ratios[0], nil
}
