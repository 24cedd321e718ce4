// CPU reference for RMSNorm (LLaMA), the oracle of the RMSNorm kernels in
// kernels/norms.cu: y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps)
// over the last dimension C of N rows.
//
// Pure fp32 functions over plain slices, with the row sums in float64 like
// the LayerNorm of math.go. Callers holding bf16 tensors widen them before
// the call and round the outputs after it, as the kernels do at load and
// store (the Backend ops RMSNormForward/Backward of ops.go do). Limits:
// sizes are trusted, the slices must hold N*C (or C, N) elements.

package cpu

import "math"

// RMSNormForward writes out[N,C] = inp * rstd * weight and rstd[N] =
// 1/sqrt(mean(inp^2) + eps) of each row, for the backward.
func RMSNormForward(out, rstd, inp, weight []float32, N, C int, eps float32) {
	for r := range N {
		x := inp[r*C : (r+1)*C]
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		s := float32(1 / math.Sqrt(ss/float64(C)+float64(eps)))
		o := out[r*C : (r+1)*C]
		for i, v := range x {
			o[i] = v * s * weight[i]
		}
		rstd[r] = s
	}
}

// RMSNormBackward accumulates the gradients of RMSNormForward given dout:
// dinp += rstd * (dnorm - norm * mean(dnorm * norm)) with norm = inp*rstd,
// dnorm = dout*weight, and dweight += sum over rows of dout * norm (summed
// over rows in order, then added).
func RMSNormBackward(dinp, dweight, dout, inp, weight, rstd []float32, N, C int) {
	rmsNormBackwardInput(dinp, dout, inp, weight, rstd, N, C)
	rmsNormBackwardWeight(dweight, dout, inp, rstd, N, C, 0, C)
}

// rmsNormBackwardInput accumulates dinp of N rows.
func rmsNormBackwardInput(dinp, dout, inp, weight, rstd []float32, N, C int) {
	for r := range N {
		x, dy, dx := inp[r*C:(r+1)*C], dout[r*C:(r+1)*C], dinp[r*C:(r+1)*C]
		s := rstd[r]
		var a float64
		for i := range x {
			a += float64(dy[i]*weight[i]) * float64(x[i]*s)
		}
		a /= float64(C)
		for i := range x {
			n := x[i] * s
			dn := dy[i] * weight[i]
			dx[i] += float32((float64(dn) - float64(n)*a) * float64(s))
		}
	}
}

// rmsNormBackwardWeight accumulates dweight's columns [lo,hi), each summed
// over the N rows in order.
func rmsNormBackwardWeight(dweight, dout, inp, rstd []float32, N, C, lo, hi int) {
	// Rows outer: each column sums its rows in ascending order, reading
	// memory along rows.
	sw := make([]float32, hi-lo)
	for r := range N {
		dy, x, rs := dout[r*C+lo:r*C+hi], inp[r*C+lo:r*C+hi], rstd[r]
		for k := range dy {
			sw[k] += dy[k] * (x[k] * rs)
		}
	}
	for k, v := range sw {
		dweight[lo+k] += v
	}
}
