// Carrying a matrix's d x d Adam moments into a new subspace after a refit
// (docs/DESIGN.md, "LSP as implemented"): with
//
//	C = (P_new^T P_old)(P_old^T P_old + ridge I)^-1
//	D = (Q_old^T Q_old + ridge I)^-1 (Q_old^T Q_new)
//
// M <- C M D and V <- (C o C) V (D o D), clamped at 0 (o: elementwise). C M D
// maps a compressed gradient of the old subspace to the new one through the
// least-squares lift G ~ P_old (P_old^T P_old)^-1 S (Q_old^T Q_old)^-1 Q_old^T.
// A side whose projector is unchanged uses C = I (D = I) exactly, not the
// ridge-perturbed A (A + ridge I)^-1, and when both are unchanged the moments
// are not touched at all. Dense d x d float64 arithmetic with Cholesky
// solves; O(d^3 + m r^2).

package lsp

import (
	"fmt"
	"math"
)

// Carry reports one moment carry-over.
type Carry struct {
	// Identity: both projectors were unchanged and M, V were left as they were.
	Identity bool
	// Change is max(||C - I||_F, ||D - I||_F) / sqrt(d): 0 for unchanged
	// projectors, about 1 for independent fresh ones. Ramp.Large decides
	// from it whether to re-warm the matrix's learning rate.
	Change float64
}

// Transition returns C and D (d x d, row-major, float64) as defined at the
// top of this file; an unchanged side (same pointer or Equal) gives the
// identity exactly. ridge >= 0 is added to the diagonals of P_old^T P_old
// and Q_old^T Q_old (their diagonals are about m/d and n/d for fresh
// projectors; a column no row uses makes them singular, so use ridge > 0).
func Transition(pOld, pNew, qOld, qNew *Projector, ridge float64) (C, D []float64, err error) {
	if err := checkTransition(pOld, pNew, qOld, qNew, ridge); err != nil {
		return nil, nil, err
	}
	d := pOld.D
	if pOld.Equal(pNew) {
		C = identity(d)
	} else {
		// (A + ridge I) C^T = (P_new^T P_old)^T: row j of C solves with row
		// j of P_new^T P_old (A is symmetric).
		C = crossGram(pNew.view(), pOld.view())
		l, err := ridgeCholesky(gram(pOld.view()), d, ridge)
		if err != nil {
			return nil, nil, fmt.Errorf("lsp carry: P_old^T P_old + %g I: %w", ridge, err)
		}
		for j := range d {
			cholSolve(l, C[j*d:(j+1)*d], d)
		}
	}
	if qOld.Equal(qNew) {
		D = identity(d)
	} else {
		// (B + ridge I) D = Q_old^T Q_new: column j of D solves with column
		// j; solve the transposed system row by row and transpose back.
		Dt := crossGram(qNew.view(), qOld.view()) // (Q_old^T Q_new)^T
		l, err := ridgeCholesky(gram(qOld.view()), d, ridge)
		if err != nil {
			return nil, nil, fmt.Errorf("lsp carry: Q_old^T Q_old + %g I: %w", ridge, err)
		}
		for j := range d {
			cholSolve(l, Dt[j*d:(j+1)*d], d)
		}
		D = transpose(Dt, d, d)
	}
	return C, D, nil
}

// CarryMoments carries the first and second Adam moments M and V (d x d,
// row-major) of one matrix from the subspace of (pOld, qOld) into that of
// (pNew, qNew) in place. When both projectors are unchanged it returns
// Identity without touching M or V.
func CarryMoments(pOld, pNew, qOld, qNew *Projector, M, V []float32, ridge float64) (Carry, error) {
	if err := checkTransition(pOld, pNew, qOld, qNew, ridge); err != nil {
		return Carry{}, err
	}
	d := pOld.D
	if len(M) != d*d || len(V) != d*d {
		return Carry{}, fmt.Errorf("lsp carry: moments have %d and %d entries, want d*d = %d", len(M), len(V), d*d)
	}
	if pOld.Equal(pNew) && qOld.Equal(qNew) {
		return Carry{Identity: true}, nil
	}
	C, D, err := Transition(pOld, pNew, qOld, qNew, ridge)
	if err != nil {
		return Carry{}, err
	}
	m64, v64 := make([]float64, d*d), make([]float64, d*d)
	for e := range M {
		m64[e], v64[e] = float64(M[e]), float64(V[e])
	}
	C2, D2 := make([]float64, d*d), make([]float64, d*d)
	for e := range C {
		C2[e], D2[e] = C[e]*C[e], D[e]*D[e]
	}
	mNew := matMul(matMul(C, m64, d), D, d)
	vNew := matMul(matMul(C2, v64, d), D2, d)
	for e := range M {
		M[e] = float32(mNew[e])
		V[e] = float32(max(vNew[e], 0))
	}
	return Carry{Change: max(distIdentity(C, d), distIdentity(D, d)) / math.Sqrt(float64(d))}, nil
}

// checkTransition validates the four projectors and the ridge.
func checkTransition(pOld, pNew, qOld, qNew *Projector, ridge float64) error {
	for _, x := range []struct {
		name string
		p    *Projector
	}{{"P_old", pOld}, {"P_new", pNew}, {"Q_old", qOld}, {"Q_new", qNew}} {
		if err := x.p.Validate(); err != nil {
			return fmt.Errorf("lsp carry: %s: %w", x.name, err)
		}
	}
	if pOld.M != pNew.M || qOld.M != qNew.M || pOld.D != pNew.D || pOld.D != qOld.D || pOld.D != qNew.D {
		return fmt.Errorf("lsp carry: P %dx%d -> %dx%d, Q %dx%d -> %dx%d: sides and d must not change",
			pOld.M, pOld.D, pNew.M, pNew.D, qOld.M, qOld.D, qNew.M, qNew.D)
	}
	if !(ridge >= 0) || math.IsInf(ridge, 0) {
		return fmt.Errorf("lsp carry: ridge %v, want finite and non-negative", ridge)
	}
	return nil
}

func identity(d int) []float64 {
	out := make([]float64, d*d)
	for i := range d {
		out[i*d+i] = 1
	}
	return out
}

// ridgeCholesky factors a + ridge I.
func ridgeCholesky(a []float64, d int, ridge float64) ([]float64, error) {
	for i := range d {
		a[i*d+i] += ridge
	}
	return cholesky(a, d)
}

// distIdentity is ||a - I||_F.
func distIdentity(a []float64, d int) float64 {
	var s float64
	for i := range d {
		for j := range d {
			v := a[i*d+j]
			if i == j {
				v--
			}
			s += v * v
		}
	}
	return math.Sqrt(s)
}
