//go:build lsp_sim || cuda

// Tests of kernels/fit.cu (the projector fit's value gradient) under the
// simulator, against the CPU reference (train/cpu/ref_fit.go) and a
// float64 sum, for every seed of Seeds.
//
// Shapes (rows, d, r): ragged (70, 12, 3) and (45, 13, 5), more entries
// per row than a warp's lanes (33, 40, 37), a full one (9, 7, 7) and the
// smallest (1, 1, 1); each with Y [rows,d] and, trans, Y [d,rows]; with
// and without Y; written and accumulated. Buffers alternate per seed
// between a guard page after their end and one before their start.
//
// Tolerances: against the CPU reference bit for bit (non-contracted fp32
// in the same order, on a GPU too); against float64 1e-5 times the sum of
// the magnitudes of the terms of each entry.

package simtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

func TestSparseValueGrad(t *testing.T) {
	for _, sh := range [][3]int{{70, 12, 3}, {45, 13, 5}, {33, 40, 37}, {9, 7, 7}, {1, 1, 1}} {
		rows, d, r := sh[0], sh[1], sh[2]
		for _, trans := range []bool{false, true} {
			for _, withY := range []bool{true, false} {
				for _, acc := range []bool{false, true} {
					name := fmt.Sprintf("rows%d_d%d_r%d_trans%v_Y%v_acc%v", rows, d, r, trans, withY, acc)
					t.Run(name, func(t *testing.T) {
						for _, seed := range Seeds {
							SetSeed(seed)
							rng := rand.New(rand.NewPCG(seed, 21))
							X := newSparseProj(t, rng, rows, d, r)
							K := randVals(rng, d*d, 1, false)
							out0 := randVals(rng, rows*r, 1, false)
							var Y, M []float32
							yDev, mDev := kernels.Ptr(0), kernels.Ptr(0)
							if withY {
								Y, M = randVals(rng, rows*d, 1, false), randVals(rng, d*d, 1, false)
								yDev, mDev = sparseAlloc(t, seed, Y).Dev(), sparseAlloc(t, seed, M).Dev()
							}
							const w = 0.625
							out := sparseAlloc(t, seed, out0)
							mustLaunch(t, kernels.SparseValueGrad(out.Dev(), yDev, mDev, sparseAlloc(t, seed, K).Dev(),
								sparseAlloc(t, seed, X.idx).Dev(), sparseAlloc(t, seed, X.val).Dev(), rows, d, r, w, trans, acc, 0))
							got := out.Float32()[:rows*r]
							want := append([]float32(nil), out0...)
							if err := cpu.SparseValueGrad(want, Y, M, K, X.idx, X.val, rows, d, r, w, trans, acc); err != nil {
								t.Fatal(err)
							}
							checkF32Bits(t, fmt.Sprintf("seed %d", seed), got, want)
							// float64: the same sums, exactly.
							for i := range rows {
								for e := i * r; e < (i+1)*r; e++ {
									a := int(X.idx[e])
									var g, mag float64
									if withY {
										for b := range d {
											y, m := float64(Y[i*d+b]), float64(M[a*d+b])
											if trans {
												y, m = float64(Y[b*rows+i]), float64(M[b*d+a])
											}
											g, mag = g+y*m, mag+math.Abs(y*m)
										}
									}
									for u := i * r; u < (i+1)*r; u++ {
										v := float64(X.val[u]) * float64(K[int(X.idx[u])*d+a])
										g, mag = g+v, mag+math.Abs(v)
									}
									g *= w
									if acc {
										g += float64(out0[e])
										mag = w*mag + math.Abs(float64(out0[e]))
									} else {
										mag *= w
									}
									if diff := math.Abs(float64(got[e]) - g); diff > 1e-5*mag+1e-30 {
										t.Fatalf("seed %d entry %d: %v, float64 %v (|diff| %.3g > 1e-5 * %.3g)", seed, e, got[e], g, diff, mag)
									}
								}
							}
						}
					})
				}
			}
		}
	}
}
