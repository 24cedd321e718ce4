// CPU references for the normalisations of kernels/norms.cu, over the last
// dimension C of N rows (N = B*T), with the launchers' names and argument
// order (lsp_layernorm_forward/backward, lsp_rmsnorm_forward/backward; the
// backwards' scratch is the kernels' own and has no counterpart here):
//
//	LayerNorm (GPT-2):  out = (x - mean) * rstd * weight + bias,
//	                    rstd = 1/sqrt(var + eps), biased variance
//	RMSNorm (LLaMA):    out = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps)
//
// Shapes: out, inp, dout, dinp [N, C]; weight, bias, dweight, dbias [C];
// mean, rstd [N], saved by the forward for the backward. The backwards
// accumulate (+=) into dinp, dweight and dbias, as the kernels do.
//
// Pure fp32 functions over plain slices with the row sums in float64.
// Callers holding bf16 tensors widen them before the call and round the
// outputs after it, as the kernels do at load and store (the Backend ops of
// ops.go do). The ops split rows (the input gradient, the forward) or
// columns (the parameter gradients) over threads and call the row and
// column functions below on their part: every element is summed by one
// call in one fixed order, so the split never changes a bit. Limits: sizes
// are trusted, the slices must hold N*C (or C, N) elements.

package cpu

import "math"

// LayerNormForward writes out[N,C] = (inp - mean) * rstd * weight + bias,
// and mean[N] and rstd[N] = 1/sqrt(var + eps) of each row for the
// backward; mean and variance are summed in float64.
func LayerNormForward(out, mean, rstd, inp, weight, bias []float32, N, C int, eps float32) {
	for r := range N {
		x := inp[r*C : (r+1)*C]
		var sum float64
		for _, v := range x {
			sum += float64(v)
		}
		m := sum / float64(C)
		var ss float64
		for _, v := range x {
			d := float64(v) - m
			ss += d * d
		}
		s := 1 / math.Sqrt(ss/float64(C)+float64(eps))
		o := out[r*C : (r+1)*C]
		for i, v := range x {
			o[i] = float32((float64(v)-m)*s)*weight[i] + bias[i]
		}
		mean[r], rstd[r] = float32(m), float32(s)
	}
}

// LayerNormBackward accumulates the gradients of LayerNormForward given
// dout: dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
// with norm = (inp - mean) * rstd and dnorm = dout * weight; dweight +=
// the column sums of dout * norm and dbias += those of dout, each summed
// over rows in order, then added.
func LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd []float32, N, C int) {
	layerNormBackwardInput(dinp, dout, inp, weight, mean, rstd, N, C)
	layerNormBackwardParams(dweight, dbias, dout, inp, mean, rstd, N, C, 0, C)
}

// layerNormBackwardInput accumulates dinp of N rows.
func layerNormBackwardInput(dinp, dout, inp, weight, mean, rstd []float32, N, C int) {
	for r := range N {
		x, dy, dx := inp[r*C:(r+1)*C], dout[r*C:(r+1)*C], dinp[r*C:(r+1)*C]
		m, s := mean[r], rstd[r]
		var a, bb float64
		for i := range x {
			n := (x[i] - m) * s
			dn := dy[i] * weight[i]
			a += float64(dn)
			bb += float64(dn * n)
		}
		a /= float64(C)
		bb /= float64(C)
		for i := range x {
			n := (x[i] - m) * s
			dn := dy[i] * weight[i]
			dx[i] += float32((float64(dn) - a - float64(n)*bb) * float64(s))
		}
	}
}

// layerNormBackwardParams accumulates dweight's and dbias's columns
// [lo,hi), each summed over the N rows in order.
func layerNormBackwardParams(dweight, dbias, dout, inp, mean, rstd []float32, N, C, lo, hi int) {
	// Rows outer, columns inner: each column still sums its rows in
	// ascending order (the same bits as a column at a time), but memory is
	// read along rows instead of one float per cache line.
	sw, sb := make([]float32, hi-lo), make([]float32, hi-lo)
	for r := 0; r < N; r++ {
		dy, x := dout[r*C+lo:r*C+hi], inp[r*C+lo:r*C+hi]
		m, s := mean[r], rstd[r]
		for k := range dy {
			sb[k] += dy[k]
			sw[k] += dy[k] * (x[k] - m) * s
		}
	}
	for k := range sw {
		dweight[lo+k] += sw[k]
		dbias[lo+k] += sb[k]
	}
}

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
