// The host fit's objective and gradient at given projectors, exported as
// the float64 reference of the fit on a backend (devicefit_test.go).

package lsp

// FitObjective is the objective FitSamples minimises at P and the Qs (the
// mean over samples of the sum of ratio^2, plus the orthogonality penalty
// weighted by ortho), the per-matrix ratios, and its gradient in the
// values: grads[0] P's, grads[1+k] Q_k's, in row storage order. float64
// throughout, from the float32 values as stored.
func FitObjective(P *Projector, Qs []*Projector, samples [][][]float32, ortho float64) (obj float64, ratios []float64, grads [][]float64, err error) {
	g2s, err := CheckFitSamples(P, Qs, samples, 0.5, FitOptions{LR: 1, Ortho: ortho})
	if err != nil {
		return 0, nil, nil, err
	}
	qs := make([]sparse, len(Qs))
	for k, q := range Qs {
		qs[k] = q.view()
	}
	p := P.view()
	ev := evaluateSamples(samples, g2s, p, qs, true)
	if ortho > 0 {
		addOrtho(&ev, p, qs, ortho, true)
	}
	return ev.obj, ev.ratios, append([][]float64{ev.gp}, ev.gqs...), nil
}
