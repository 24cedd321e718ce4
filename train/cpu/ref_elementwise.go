// CPU references for the small ops of kernels/elementwise.cu, with the
// launchers' names and argument order, which touch each element once:
//
//	lsp_fill           Fill          t[i] = v                           t [n]
//	lsp_scale          Scale         t[i] = t[i] * a                    t [n]
//	lsp_add            Add           out[i] = a[i] + b[i]               out, a, b [n]
//	lsp_accumulate     Accumulate    dst[i] = dst[i] + src[i]           dst, src [n]
//	lsp_add_bias       AddBias       out[r,j] = out[r,j] + bias[j]      out [N,OC], bias [OC]
//	lsp_bias_backward  BiasBackward  dbias[j] = dbias[j] + s_j          dbias [OC], dout [N,OC]
//	                   s_j = (((0 + dout[0,j]) + dout[1,j]) + ...) + dout[N-1,j]
//
// Each output is one fp32 add or multiply, or for the bias gradient a
// sequential fp32 sum over rows from +0 and then one add, so the kernels
// give these bits (a NaN made by arithmetic may carry another payload on
// the GPU). out may alias a or b, and src dst: every element is read
// before it is written.
//
// Pure fp32 over plain slices; callers holding bf16 tensors widen them
// before the call and round the outputs after it, as the kernels do. The
// ops split elements, rows (AddBias) or columns (BiasBackward) over threads
// and call these on their part, which never changes a bit. Limits: sizes
// are trusted, the slices must hold what the shapes say.

package cpu

// Fill sets every element of t to v.
func Fill(t []float32, v float32) {
	for i := range t {
		t[i] = v
	}
}

// Scale multiplies every element of t by a.
func Scale(t []float32, a float32) {
	for i := range t {
		t[i] *= a
	}
}

// Add writes out = a + b over len(out) elements.
func Add(out, a, b []float32) {
	for i := range out {
		out[i] = a[i] + b[i]
	}
}

// Accumulate adds src into dst over len(dst) elements.
func Accumulate(dst, src []float32) {
	for i := range dst {
		dst[i] += src[i]
	}
}

// AddBias adds bias [OC] to each of the N rows of out [N, OC].
func AddBias(out, bias []float32, N, OC int) {
	for i := 0; i < N; i++ {
		row := out[i*OC : (i+1)*OC]
		for j := range row {
			row[j] += bias[j]
		}
	}
}

// BiasBackward adds to dbias [OC] the column sums of dout [N, OC], each
// summed over rows 0..N-1 in order from +0.
func BiasBackward(dbias, dout []float32, N, OC int) { biasBackwardColumns(dbias, dout, N, OC, 0, OC) }

// biasBackwardColumns does BiasBackward's columns [lo,hi).
func biasBackwardColumns(dbias, dout []float32, N, OC, lo, hi int) {
	// Rows outer: each column sums its rows in ascending order, as a
	// column at a time would, reading memory along rows.
	sum := make([]float32, hi-lo)
	for i := 0; i < N; i++ {
		for k, v := range dout[i*OC+lo : i*OC+hi] {
			sum[k] += v
		}
	}
	for k, v := range sum {
		dbias[lo+k] += v
	}
}
