// The float64 references of LayerNorm and RMSNorm, written from the
// definitions with a full Jacobian per row for the backwards, which central
// finite differences check; the RMSNorm reference is checked against its
// float64 one here, LayerNorm's through the op (ops_test.go's TestLayerNorm).

package cpu

import (
	"fmt"
	"math"
	"testing"
)

// layerNorm64 normalises each of the N rows of x over C (biased variance).
func layerNorm64(x, w, b []float64, N, C int, eps float64) (out, mean, rstd []float64) {
	out, mean, rstd = make([]float64, N*C), make([]float64, N), make([]float64, N)
	for r := range N {
		row := x[r*C : (r+1)*C]
		var m, v float64
		for _, a := range row {
			m += a
		}
		m /= float64(C)
		for _, a := range row {
			v += (a - m) * (a - m)
		}
		v /= float64(C)
		s := 1 / math.Sqrt(v+eps)
		for i, a := range row {
			out[r*C+i] = (a-m)*s*w[i] + b[i]
		}
		mean[r], rstd[r] = m, s
	}
	return out, mean, rstd
}

// layerNormBackward64 returns the gradients of sum(out * dout) by the chain
// rule through norm = (x - mean) * rstd, written with the full Jacobian of
// each row rather than the closed form the op uses.
func layerNormBackward64(dout, x, w []float64, N, C int, eps float64) (dx, dw, db []float64) {
	_, mean, rstd := layerNorm64(x, w, make([]float64, C), N, C, eps)
	dx, dw, db = make([]float64, N*C), make([]float64, C), make([]float64, C)
	for r := range N {
		m, s := mean[r], rstd[r]
		for i := range C {
			n := (x[r*C+i] - m) * s
			dw[i] += dout[r*C+i] * n
			db[i] += dout[r*C+i]
		}
		// d norm_i / d x_j = s*(delta_ij - 1/C) - s^3 (x_i - m)(x_j - m)/C
		for j := range C {
			var g float64
			for i := range C {
				d := 0.0
				if i == j {
					d = 1
				}
				jac := s*(d-1/float64(C)) - s*s*s*(x[r*C+i]-m)*(x[r*C+j]-m)/float64(C)
				g += dout[r*C+i] * w[i] * jac
			}
			dx[r*C+j] = g
		}
	}
	return dx, dw, db
}

// rmsNorm64 normalises each row of x by its root mean square.
func rmsNorm64(x, w []float64, N, C int, eps float64) (out, rstd []float64) {
	out, rstd = make([]float64, N*C), make([]float64, N)
	for r := range N {
		var ss float64
		for _, v := range x[r*C : (r+1)*C] {
			ss += v * v
		}
		s := 1 / math.Sqrt(ss/float64(C)+eps)
		for i := range C {
			out[r*C+i] = x[r*C+i] * s * w[i]
		}
		rstd[r] = s
	}
	return out, rstd
}

// rmsNormBackward64 returns the gradients of sum(out * dout) through the
// Jacobian d(x_i s)/dx_j = s delta_ij - s^3 x_i x_j / C of each row.
func rmsNormBackward64(dout, x, w []float64, N, C int, eps float64) (dx, dw []float64) {
	_, rstd := rmsNorm64(x, w, N, C, eps)
	dx, dw = make([]float64, N*C), make([]float64, C)
	for r := range N {
		s := rstd[r]
		for i := range C {
			dw[i] += dout[r*C+i] * x[r*C+i] * s
		}
		for j := range C {
			var g float64
			for i := range C {
				jac := -s * s * s * x[r*C+i] * x[r*C+j] / float64(C)
				if i == j {
					jac += s
				}
				g += dout[r*C+i] * w[i] * jac
			}
			dx[r*C+j] = g
		}
	}
	return dx, dw
}

// TestLayerNormReference64 checks the float64 LayerNorm backward against
// central differences of its forward.
func TestLayerNormReference64(t *testing.T) {
	const B, T, C, eps = 2, 5, 12, 1e-5
	r := newRand(99)
	N := B * T
	x, w, bb := f64s(randVals(r, N*C, 2)), f64s(randVals(r, C, 1)), f64s(randVals(r, C, 1))
	dout := f64s(randVals(r, N*C, 1))
	dx, dw, db := layerNormBackward64(dout, x, w, N, C, eps)
	lnLoss := func(x, w, b []float64) float64 {
		out, _, _ := layerNorm64(x, w, b, N, C, eps)
		return dot64(out, dout)
	}
	fdCheck(t, "layernorm dx", func(v []float64) float64 { return lnLoss(v, w, bb) }, x, dx, 1e-6)
	fdCheck(t, "layernorm dw", func(v []float64) float64 { return lnLoss(x, v, bb) }, w, dw, 1e-6)
	fdCheck(t, "layernorm db", func(v []float64) float64 { return lnLoss(x, w, v) }, bb, db, 1e-6)
}

func TestRMSNormReference64(t *testing.T) {
	const N, C, eps = 3, 7, 1e-5
	r := newRand(5)
	x, w, dout := f64s(randVals(r, N*C, 2)), f64s(randVals(r, C, 1)), f64s(randVals(r, N*C, 1))
	dx, dw := rmsNormBackward64(dout, x, w, N, C, eps)
	loss := func(x, w []float64) float64 {
		out, _ := rmsNorm64(x, w, N, C, eps)
		return dot64(out, dout)
	}
	fdCheck(t, "rmsnorm dx", func(v []float64) float64 { return loss(v, w) }, x, dx, 1e-6)
	fdCheck(t, "rmsnorm dw", func(v []float64) float64 { return loss(x, v) }, w, dw, 1e-6)
}

func TestRMSNormReference(t *testing.T) {
	const eps = 1e-5
	for _, sh := range []struct{ N, C int }{{1, 1}, {2, 8}, {37, 95}, {4, 768}} {
		t.Run(fmt.Sprintf("N%d_C%d", sh.N, sh.C), func(t *testing.T) {
			N, C := sh.N, sh.C
			r := newRand(uint64(N*1000 + C))
			x, w := randVals(r, N*C, 3), randVals(r, C, 1.5)
			dout, dx0, dw0 := randVals(r, N*C, 1), randVals(r, N*C, 1), randVals(r, C, 1)

			out, rstd := make([]float32, N*C), make([]float32, N)
			RMSNormForward(out, rstd, x, w, N, C, eps)
			wantOut, wantRstd := rmsNorm64(f64s(x), f64s(w), N, C, eps)
			near(t, "out", out, wantOut, 1e-6, 1e-5)
			near(t, "rstd", rstd, wantRstd, 0, 1e-6)

			dx, dw := append([]float32(nil), dx0...), append([]float32(nil), dw0...)
			RMSNormBackward(dx, dw, dout, x, w, rstd, N, C)
			gx, gw := rmsNormBackward64(f64s(dout), f64s(x), f64s(w), N, C, eps)
			for i := range gx {
				gx[i] += float64(dx0[i])
			}
			for i := range gw {
				gw[i] += float64(dw0[i])
			}
			near(t, "dinp", dx, gx, 1e-5, 1e-4)
			near(t, "dweight", dw, gw, 1e-5, 1e-4)
		})
	}
}
