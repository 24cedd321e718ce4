package cpu

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// TestSparseValueGradOp runs the op on ragged shapes (rows, d, r), with Y
// [rows,d] and transposed [d,rows], without Y, written and accumulated,
// with 1 and 3 threads in hazard-checking mode: bit for bit the reference
// (ref_fit.go), which is within 1e-5 of the magnitude of each entry's
// terms of a float64 sum.
func TestSparseValueGradOp(t *testing.T) {
	for _, sh := range [][3]int{{70, 12, 3}, {45, 13, 5}, {33, 40, 37}, {1, 1, 1}} {
		rows, d, r := sh[0], sh[1], sh[2]
		for _, trans := range []bool{false, true} {
			for _, withY := range []bool{true, false} {
				for _, acc := range []bool{false, true} {
					t.Run(fmt.Sprintf("rows%d_d%d_r%d_trans%v_Y%v_acc%v", rows, d, r, trans, withY, acc), func(t *testing.T) {
						rng := newRand(uint64(rows*100 + d))
						idx, val := fitRows(rng.IntN, rows, d, r, randVals(rng, rows*r, 1))
						K, out0 := randVals(rng, d*d, 1), randVals(rng, rows*r, 1)
						var Y, M []float32
						if withY {
							Y, M = randVals(rng, rows*d, 1), randVals(rng, d*d, 1)
						}
						const w = 0.625
						want := append([]float32(nil), out0...)
						ok(t, SparseValueGrad(want, Y, M, K, idx, val, rows, d, r, w, trans, acc))
						for _, threads := range []int{1, 3} {
							be := newBE(t, Config{Threads: threads, HazardCheck: true, KernelDTypes: true})
							s := be.DefaultStream()
							out := tensorOf(t, be, "out", backend.F32, out0)
							var yt, mt backend.Tensor
							if withY {
								yt, mt = tensorOf(t, be, "Y", backend.F32, Y), tensorOf(t, be, "M", backend.F32, M)
							}
							ok(t, be.SparseValueGrad(s, out, yt, mt, tensorOf(t, be, "K", backend.F32, K), intsOf(t, be, "idx", idx),
								tensorOf(t, be, "val", backend.F32, val), rows, d, r, w, trans, acc))
							mustSync(t, be, s)
							same(t, fmt.Sprintf("%d threads", threads), get(t, be, out), want)
						}
						for i := range rows {
							for e := i * r; e < (i+1)*r; e++ {
								a := int(idx[e])
								var g, mag float64
								for b := range d {
									if !withY {
										break
									}
									y, m := float64(Y[i*d+b]), float64(M[a*d+b])
									if trans {
										y, m = float64(Y[b*rows+i]), float64(M[b*d+a])
									}
									g, mag = g+y*m, mag+math.Abs(y*m)
								}
								for u := i * r; u < (i+1)*r; u++ {
									v := float64(val[u]) * float64(K[int(idx[u])*d+a])
									g, mag = g+v, mag+math.Abs(v)
								}
								g, mag = w*g, w*mag
								if acc {
									g, mag = g+float64(out0[e]), mag+math.Abs(float64(out0[e]))
								}
								if diff := math.Abs(float64(want[e]) - g); diff > 1e-5*mag+1e-30 {
									t.Fatalf("entry %d: %v, float64 %v", e, want[e], g)
								}
							}
						}
					})
				}
			}
		}
	}
}

// fitRows draws r distinct columns per row (a partial shuffle of 0..d-1).
func fitRows(intN func(int) int, rows, d, r int, val []float32) ([]int32, []float32) {
	idx := make([]int32, 0, rows*r)
	cols := make([]int32, d)
	for range rows {
		for c := range cols {
			cols[c] = int32(c)
		}
		for s := range r {
			j := s + intN(d-s)
			cols[s], cols[j] = cols[j], cols[s]
		}
		idx = append(idx, cols[:r]...)
	}
	return idx, val
}

// TestSparseValueGradErrors: sizes and dtypes are refused at enqueue, a
// bad index at Synchronize.
func TestSparseValueGradErrors(t *testing.T) {
	be := newBE(t, Config{KernelDTypes: true})
	s := be.DefaultStream()
	const rows, d, r = 5, 4, 2
	out, K := alloc(t, be, "out", rows*r, backend.F32), alloc(t, be, "K", d*d, backend.F32)
	val := alloc(t, be, "val", rows*r, backend.F32)
	good := intsOf(t, be, "idx", []int32{0, 1, 1, 2, 2, 3, 3, 0, 0, 2})
	for _, tc := range []struct {
		name, want string
		run        func() error
	}{
		{"r > d", "r=5 > d=4", func() error {
			return be.SparseValueGrad(s, out, backend.Tensor{}, backend.Tensor{}, K, good, val, 2, d, 5, 1, false, false)
		}},
		{"short out", "out has", func() error {
			return be.SparseValueGrad(s, out.Slice(0, 3), backend.Tensor{}, backend.Tensor{}, K, good, val, rows, d, r, 1, false, false)
		}},
		{"Y without M", "M", func() error {
			return be.SparseValueGrad(s, out, alloc(t, be, "Y", rows*d, backend.F32), backend.Tensor{}, K, good, val, rows, d, r, 1, false, false)
		}},
		{"bf16 K", "K", func() error {
			return be.SparseValueGrad(s, out, backend.Tensor{}, backend.Tensor{}, alloc(t, be, "Kb", d*d, backend.BF16), good, val, rows, d, r, 1, false, false)
		}},
	} {
		err := tc.run()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	bad := intsOf(t, be, "bad", []int32{0, 0, 1, 2, 2, 3, 3, 0, 0, 2}) // row 0 holds column 0 twice
	ok(t, be.SparseValueGrad(s, out, backend.Tensor{}, backend.Tensor{}, K, bad, val, rows, d, r, 1, false, false))
	if err := be.Synchronize(s); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate column: Synchronize says %v, want the row's error", err)
	}
}
