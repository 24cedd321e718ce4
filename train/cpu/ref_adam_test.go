// The float64 reference of AdamW, written from torch.optim.AdamW's
// definition, which ops_test.go's TestAdamW holds the op (and so
// ref_adam.go's AdamW) to. The skip flag and NonFiniteFlag are tested on
// the ops in skip_test.go.

package cpu

import "math"

// adam64 is PyTorch's torch.optim.AdamW step (decoupled weight decay, bias
// correction, eps added outside the square root) on a gradient first scaled
// by min(1, maxNorm/(sqrt(sumSq)+1e-6)) when maxNorm > 0, as clip_grad_norm_
// does.
type adam64 struct {
	lr, b1, b2, eps, wd, maxNorm float64
}

func (a adam64) step(p, m, v, g []float64, step int, sumSq float64) {
	coef := 1.0
	if a.maxNorm > 0 {
		coef = min(1, a.maxNorm/(math.Sqrt(sumSq)+1e-6))
	}
	bc1 := 1 - math.Pow(a.b1, float64(step))
	bc2 := 1 - math.Pow(a.b2, float64(step))
	for i := range p {
		gi := g[i] * coef
		p[i] *= 1 - a.lr*a.wd
		m[i] = a.b1*m[i] + (1-a.b1)*gi
		v[i] = a.b2*v[i] + (1-a.b2)*gi*gi
		p[i] -= a.lr / bc1 * m[i] / (math.Sqrt(v[i])/math.Sqrt(bc2) + a.eps)
	}
}
