// CPU reference of the projector fit's value gradient (kernels/fit.cu,
// lsp_sparse_value_grad): the gradient of the bias objective
// (train/lsp/bias.go) gathered at a sparse projector's positions, the one
// product of the fit that no other op computes (docs/DESIGN.md, "Learning the
// projectors"; train/lsp/devicefit.go runs the fit on a backend).
//
// Arithmetic is fp32 in the kernel's fixed order, each product rounded
// before it is added (float32(a*b)), so Go never fuses it into an FMA and
// the simulator, which compiles without contraction, matches bit for bit;
// the kernel avoids contraction on the device too (__fmul_rn, __fadd_rn).

package cpu

import "fmt"

// SparseValueGrad is the reference of lsp_sparse_value_grad. X [rows, d]
// is in row storage (idx, val; r entries per row); for entry e = i*r+s at
// column a = idx[e]:
//
//	g = sum_b Y(i,b) M(a,b), b ascending from 0 (skipped when Y is nil)
//	g += val[t] K[idx[t]*d + a] for row i's entries t ascending
//	out[e] = w*g, or out[e] += w*g when accumulate
//
// with Y(i,b) = Y[i*d+b], M(a,b) = M[a*d+b] (Y [rows, d]), or, when
// trans, Y(i,b) = Y[b*rows+i] and M(a,b) = M[b*d+a] (Y [d, rows]): the
// gradients in P's values (Y = G Q) and in Q's (Y = P^T G, M used
// transposed).
func SparseValueGrad(out, Y, M, K []float32, idx []int32, val []float32, rows, d, r int, w float32, trans, accumulate bool) error {
	if err := CheckSparseRows(idx, val, rows, d, r); err != nil {
		return fmt.Errorf("sparse value grad: %w", err)
	}
	if len(out) < rows*r || len(K) < d*d || Y != nil && (len(Y) < rows*d || len(M) < d*d) {
		return fmt.Errorf("sparse value grad: out, Y, M, K have %d, %d, %d, %d elements, want %d, %d (or none), %d, %d",
			len(out), len(Y), len(M), len(K), rows*r, rows*d, d*d, d*d)
	}
	sparseValueGrad(out, Y, M, K, idx, val, rows, d, r, w, trans, accumulate, 0, rows)
	return nil
}

// sparseValueGrad computes the entries of rows [lo, hi); the op splits
// rows over threads, each entry summed by one in the fixed order.
func sparseValueGrad(out, Y, M, K []float32, idx []int32, val []float32, rows, d, r int, w float32, trans, accumulate bool, lo, hi int) {
	for i := lo; i < hi; i++ {
		for e := i * r; e < (i+1)*r; e++ {
			a := int(idx[e])
			var g float32
			if Y != nil {
				if trans {
					for b := range d {
						g += float32(Y[b*rows+i] * M[b*d+a])
					}
				} else {
					yi, ma := Y[i*d:(i+1)*d], M[a*d:(a+1)*d]
					for b, y := range yi {
						g += float32(y * ma[b])
					}
				}
			}
			for t := i * r; t < (i+1)*r; t++ {
				g += float32(val[t] * K[int(idx[t])*d+a])
			}
			if accumulate {
				out[e] += float32(w * g)
			} else {
				out[e] = float32(w * g)
			}
		}
	}
}
