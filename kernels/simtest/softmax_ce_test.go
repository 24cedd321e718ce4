//go:build lsp_sim || cuda

// Tests of kernels/softmax_ce.cu under the simulator against the CPU
// backend's CrossEntropyForwardBackward (train/cpu) on logits of the same
// dtype.
//
// Shapes (N rows, V classes): 9 x 257 and 7 x 1007 (ragged), 8 x 50257
// (GPT-2's vocabulary, a multiple of nothing), 3 x 1, 6 x 20 (fewer
// classes than a warp's lanes). Every third row is ignored (target -1).
// Logits: uniform in [-4, 4) plus a spike of +12 at a random class of each
// row (a peaked softmax; a third of the targets sit on the spike: small
// losses). scale 0.125 (losses and dlogits) and 0 (losses only: the logits
// must be left untouched, bit for bit). fp32 and bf16 logits. The seeds of
// Seeds alternate the guard page after and before the buffers; rows run in
// one block each, so a block that read the shared memory of the previous
// row (a missing barrier) is caught.
//
// Tolerances, |got - want| <= atol + rtol |want|:
//   - losses (fp32): atol 1e-5, rtol 1e-5. The kernel sums exp in fp32
//     with expf, the CPU in float64: log-sum-exp agrees to a few ulps of
//     its size (<= ~11).
//   - dlogits: atol 1e-6 |scale|, rtol 2e-5 (fp32) or 2^-7 + 2e-5 (bf16,
//     one rounding each side). p = exp(z - lse) inherits the lse error
//     (~1e-6 absolute in the exponent); the target's scale*(p - 1) is
//     scale*p - scale on both sides.

package simtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
)

var ceCases = []struct{ N, V int }{{9, 257}, {7, 1007}, {8, 50257}, {3, 1}, {6, 20}}

func ceInputs(N, V int, seed uint64) (logits []float32, targets []int32) {
	r := rand.New(rand.NewPCG(seed, 11))
	logits = Rand(seed, N*V, 4)
	targets = make([]int32, N)
	for row := range N {
		spike := r.IntN(V)
		logits[row*V+spike] += 12
		switch {
		case row%3 == 2:
			targets[row] = -1
		case row%3 == 1:
			targets[row] = int32(spike)
		default:
			targets[row] = int32(r.IntN(V))
		}
	}
	return logits, targets
}

func TestSoftmaxCe(t *testing.T) {
	for _, c := range ceCases {
		for _, xb := range []bool{true, false} {
			for _, scale := range []float32{0.125, 0} {
				t.Run(fmt.Sprintf("N%d_V%d_%s_scale%g", c.N, c.V, dtName(xb), scale), func(t *testing.T) {
					logits, targets := ceInputs(c.N, c.V, uint64(c.N*c.V))
					logits = roundIf(logits, xb)
					rig := newCPURig(t)
					losses, z := rig.tensor("losses", make([]float32, c.N), false), rig.tensor("logits", logits, xb)
					rig.run("cross entropy", rig.be.CrossEntropyForwardBackward(rig.s, losses, z, rig.ints("targets", targets),
						c.N, c.V, scale))
					wantL, wantZ := rig.get(losses), rig.get(z)
					atol, rtol := 1e-6*math.Abs(float64(scale)), tolFor(xb, 2e-5)
					for i, seed := range Seeds {
						before := i%2 == 0
						l, zb := Alloc(t, 4*c.N), NewFloatBuf(t, logits, xb, before)
						if before {
							l = AllocBefore(t, 4*c.N)
						}
						SetSeed(seed)
						mustLaunch(t, kernels.CrossEntropyForwardBackward(l.Dev(), zb.Dev(), FromInt32(t, targets).Dev(), c.N, c.V, scale,
							zb.DT(), 0))
						Compare(t, "losses", l.Float32(), wantL, 1e-5, 1e-5)
						if scale == 0 {
							Compare(t, "logits (scale 0: untouched)", zb.Values(), logits, 0, 0)
						} else {
							Compare(t, "dlogits", zb.Values(), wantZ, atol, rtol)
						}
					}
				})
			}
		}
	}
}

// TestSoftmaxCeBadTarget: a target >= V gives a NaN loss and scale*softmax
// as dlogits, without touching memory outside the row.
func TestSoftmaxCeBadTarget(t *testing.T) {
	const N, V, scale = 2, 77, 0.5
	logits, _ := ceInputs(N, V, 3)
	targets := []int32{V, 4}
	rig := newCPURig(t)
	z := rig.tensor("logits", logits, false)
	// The CPU refuses the bad target; row 0 as if ignored plus softmax.
	ok := []int32{0, 4}
	losses := rig.tensor("losses", make([]float32, N), false)
	rig.run("cross entropy", rig.be.CrossEntropyForwardBackward(rig.s, losses, z, rig.ints("t", ok), N, V, scale))
	want, wantL := rig.get(z), rig.get(losses)
	want[0] += scale // undo the one-hot at class 0 of row 0
	for _, seed := range Seeds {
		SetSeed(seed)
		l, zb := Alloc(t, 4*N), NewFloatBuf(t, logits, false, false)
		mustLaunch(t, kernels.CrossEntropyForwardBackward(l.Dev(), zb.Dev(), FromInt32(t, targets).Dev(), N, V, scale, zb.DT(), 0))
		if got := l.Float32(); !math.IsNaN(float64(got[0])) {
			t.Errorf("loss of a target >= V is %v, want NaN", got[0])
		}
		Compare(t, "loss of the good row", l.Float32()[1:], wantL[1:], 1e-5, 1e-5)
		Compare(t, "dlogits", zb.Values(), want, 1e-6*scale, 2e-5)
	}
}

// TestSoftmaxCeArgs checks the launcher's argument checks.
func TestSoftmaxCeArgs(t *testing.T) {
	l, tg := Alloc(t, 8).Dev(), FromInt32(t, []int32{0, 1}).Dev()
	z := NewFloatBuf(t, make([]float32, 8), false, false).Dev()
	ce := func(losses, logits, targets kernels.Ptr, N, V int, scale float32) error {
		return kernels.CrossEntropyForwardBackward(losses, logits, targets, N, V, scale, kernels.F32, 0)
	}
	for name, err := range map[string]error{
		"V=0":         ce(l, z, tg, 2, 0, 1),
		"N<0":         ce(l, z, tg, -1, 4, 1),
		"nil targets": ce(l, z, 0, 2, 4, 1),
		"nil losses":  ce(0, z, tg, 2, 4, 1),
		"bad dtype":   kernels.CrossEntropyForwardBackward(l, z, tg, 2, 4, 1, 2, 0),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := ce(0, 0, 0, 0, 4, 1); err != nil {
		t.Errorf("N=0 must be a no-op: %v", err)
	}
}
