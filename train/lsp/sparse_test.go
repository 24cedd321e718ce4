// Tests of the sparse products of the bias objective (G Q, P^T G and
// P^T (G Q)) against dense float64 products.

package lsp

import (
	"fmt"
	"testing"
)

var compressShapes = []struct{ m, n, d, r int }{
	{70, 45, 12, 3}, // ragged
	{64, 64, 16, 4},
	{33, 100, 7, 7}, // r = d: dense rows
	{9, 5, 5, 1},    // d capped to the short side
}

func TestSparseProductsMatchDense(t *testing.T) {
	for _, sh := range compressShapes {
		t.Run(fmt.Sprintf("%dx%d_d%d_r%d", sh.m, sh.n, sh.d, sh.r), func(t *testing.T) {
			rng := newRNG(uint64(sh.m*1000 + sh.n))
			P := mustProjector(t, sh.m, sh.d, sh.r, rng)
			Q := mustProjector(t, sh.n, sh.d, sh.r, rng)
			G := randMat(rng, sh.m, sh.n)
			gq := rightProject(G, sh.m, Q.view())
			if e := maxRelDiff(gq, dMul(to64(G), Q.dense(), sh.m, sh.n, sh.d)); e > 1e-12 {
				t.Errorf("G Q vs dense: max relative difference %.3g", e)
			}
			if e := maxRelDiff(leftProject(G, sh.n, P.view()), dMul(transpose(P.dense(), sh.m, sh.d), to64(G), sh.d, sh.m, sh.n)); e > 1e-12 {
				t.Errorf("P^T G vs dense: max relative difference %.3g", e)
			}
			if e := maxRelDiff(leftProject(gq, sh.d, P.view()), denseS(P, Q, G)); e > 1e-12 {
				t.Errorf("P^T G Q vs dense: max relative difference %.3g", e)
			}
		})
	}
}
