//go:build lsp_sim || cuda

// Tests of kernels/activations.cu under the simulator: GELU against the CPU
// backend's GeluForward/GeluBackward (train/cpu) on tensors of the same
// dtypes, SwiGLU against cpu.SwiGLUForward/SwiGLUBackward
// (train/cpu/ref_activations.go) on the same (bf16-rounded) values.
//
// Sizes: 1, 1007 (ragged), 4*64*3072 (the MLP activations of GPT-2 small
// at B=4, T=64) and 8192*256 + 1007 (past the 8192-block grid cap, so the
// grid-stride loop takes a second lap; first dtype mix only). Every dtype mix of values x_bf16
// and gradients g_bf16 runs, and every backward also in place (dinp, resp.
// dgate, aliasing dout). Inputs: x, gate uniform in [-6, 6) (both tails of
// the sigmoid), up in [-3, 3), dout in [-1, 1). Outputs start as NaN
// (fresh buffers), so an element not written shows. The seeds of Seeds
// alternate the guard page after and before the buffers.
//
// Tolerances, |got - want| <= atol + rtol |want|: fp32 forward atol 1e-7,
// rtol 1e-6 and backward atol 1e-6, rtol 1e-5 (expf against the CPU's
// float64 exp: an ulp or two, grown by the 1 - tanh^2 and 1 - sigmoid
// cancellations in the derivatives); bf16 outputs add 2^-7 to rtol (both
// sides round once and may land an ulp apart).

package simtest

import (
	"fmt"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// bigSize takes the grid-stride loop past its first lap; it runs with the
// first dtype (mix) only, as the loop does not depend on the dtypes.
const bigSize = 8192*256 + 1007

var activationSizes = []int{1, 1007, 4 * 64 * 3072, bigSize}

type actInputs struct{ x, up, dout []float32 }

func newActInputs(n int) actInputs {
	return actInputs{x: Rand(uint64(n), n, 6), up: Rand(uint64(n)+1, n, 3), dout: Rand(uint64(n)+2, n, 1)}
}

// eachActSize calls f for each size of activationSizes and each of the
// variants (dtype mixes) k of a test, but only the first variant (all
// bf16, the model's mix) at bigSize.
func eachActSize(variants int, f func(n, k int)) {
	for _, n := range activationSizes {
		for k := range variants {
			if n == bigSize && k > 0 {
				continue
			}
			f(n, k)
		}
	}
}

func TestActivationsGeluForward(t *testing.T) {
	eachActSize(2, func(n, k int) {
		xb := k == 0
		t.Run(fmt.Sprintf("n%d_%s", n, dtName(xb)), func(t *testing.T) {
			in := newActInputs(n)
			rig := newCPURig(t)
			out := rig.tensor("out", make([]float32, n), xb)
			rig.run("gelu forward", rig.be.GeluForward(rig.s, out, rig.tensor("x", in.x, xb)))
			want := rig.get(out)
			for i, seed := range Seeds {
				o := outBuf(t, n, xb, i%2 == 0)
				SetSeed(seed)
				mustLaunch(t, kernels.GeluForward(o.Dev(), NewFloatBuf(t, in.x, xb, i%2 == 1).Dev(), int64(n), dtype(xb), 0))
				Compare(t, "out", o.Values(), want, 1e-7, tolFor(xb, 1e-6))
			}
		})
	})
}

func TestActivationsGeluBackward(t *testing.T) {
	eachActSize(len(dtypeMixes), func(n, k int) {
		xb, gb := dtypeMixes[k][0], dtypeMixes[k][1]
		t.Run(fmt.Sprintf("n%d_x%s_g%s", n, dtName(xb), dtName(gb)), func(t *testing.T) {
			in := newActInputs(n)
			rig := newCPURig(t)
			dx := rig.tensor("dx", make([]float32, n), gb)
			rig.run("gelu backward", rig.be.GeluBackward(rig.s, dx, rig.tensor("x", in.x, xb), rig.tensor("dout", in.dout, gb)))
			want := rig.get(dx)
			for i, seed := range Seeds {
				before := i%2 == 0
				x := NewFloatBuf(t, in.x, xb, !before)
				d := outBuf(t, n, gb, before)
				SetSeed(seed)
				mustLaunch(t, kernels.GeluBackward(d.Dev(), x.Dev(), NewFloatBuf(t, in.dout, gb, !before).Dev(), int64(n), dtype(xb), dtype(gb), 0))
				Compare(t, "dinp", d.Values(), want, 1e-6, tolFor(gb, 1e-5))
				inPlace := NewFloatBuf(t, in.dout, gb, before)
				mustLaunch(t, kernels.GeluBackward(inPlace.Dev(), x.Dev(), inPlace.Dev(), int64(n), dtype(xb), dtype(gb), 0))
				Compare(t, "dinp in place", inPlace.Values(), want, 1e-6, tolFor(gb, 1e-5))
			}
		})
	})
}

func TestActivationsSwiGLUForward(t *testing.T) {
	eachActSize(2, func(n, k int) {
		xb := k == 0
		t.Run(fmt.Sprintf("n%d_%s", n, dtName(xb)), func(t *testing.T) {
			in := newActInputs(n)
			gate, up := roundIf(in.x, xb), roundIf(in.up, xb)
			want := make([]float32, n)
			cpu.SwiGLUForward(want, gate, up)
			for i, seed := range Seeds {
				before := i%2 == 0
				o := outBuf(t, n, xb, before)
				SetSeed(seed)
				mustLaunch(t, kernels.SwiGLUForward(o.Dev(), NewFloatBuf(t, gate, xb, !before).Dev(), NewFloatBuf(t, up, xb, before).Dev(),
					int64(n), dtype(xb), 0))
				Compare(t, "out", o.Values(), roundIf(want, xb), 1e-7, tolFor(xb, 1e-6))
			}
		})
	})
}

func TestActivationsSwiGLUBackward(t *testing.T) {
	eachActSize(len(dtypeMixes), func(n, k int) {
		xb, gb := dtypeMixes[k][0], dtypeMixes[k][1]
		t.Run(fmt.Sprintf("n%d_x%s_g%s", n, dtName(xb), dtName(gb)), func(t *testing.T) {
			in := newActInputs(n)
			gate, up, dout := roundIf(in.x, xb), roundIf(in.up, xb), roundIf(in.dout, gb)
			wantG, wantU := make([]float32, n), make([]float32, n)
			cpu.SwiGLUBackward(wantG, wantU, dout, gate, up)
			wantG, wantU = roundIf(wantG, gb), roundIf(wantU, gb)
			for i, seed := range Seeds {
				before := i%2 == 0
				g, u := NewFloatBuf(t, gate, xb, before), NewFloatBuf(t, up, xb, !before)
				dg, du := outBuf(t, n, gb, before), outBuf(t, n, gb, !before)
				SetSeed(seed)
				mustLaunch(t, kernels.SwiGLUBackward(dg.Dev(), du.Dev(), NewFloatBuf(t, dout, gb, before).Dev(), g.Dev(), u.Dev(),
					int64(n), dtype(xb), dtype(gb), 0))
				Compare(t, "dgate", dg.Values(), wantG, 1e-6, tolFor(gb, 1e-5))
				Compare(t, "dup", du.Values(), wantU, 1e-6, tolFor(gb, 1e-5))
				inPlace, du2 := NewFloatBuf(t, dout, gb, !before), outBuf(t, n, gb, before)
				mustLaunch(t, kernels.SwiGLUBackward(inPlace.Dev(), du2.Dev(), inPlace.Dev(), g.Dev(), u.Dev(), int64(n), dtype(xb),
					dtype(gb), 0))
				Compare(t, "dgate in place", inPlace.Values(), wantG, 1e-6, tolFor(gb, 1e-5))
				Compare(t, "dup (dgate in place)", du2.Values(), wantU, 1e-6, tolFor(gb, 1e-5))
			}
		})
	})
}

// TestActivationsArgs checks the launchers' argument checks.
func TestActivationsArgs(t *testing.T) {
	f := NewFloatBuf(t, make([]float32, 4), false, false).Dev()
	bad := []struct {
		name string
		err  error
	}{
		{"n<0", kernels.GeluForward(f, f, -1, kernels.F32, 0)},
		{"nil inp", kernels.GeluForward(f, 0, 4, kernels.F32, 0)},
		{"nil dup", kernels.SwiGLUBackward(f, 0, f, f, f, 4, kernels.F32, kernels.F32, 0)},
		{"bad gradient dtype", kernels.GeluBackward(f, f, f, 4, kernels.F32, 2, 0)},
		{"bad value dtype", kernels.SwiGLUForward(f, f, f, 4, -1, 0)},
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	if err := kernels.SwiGLUForward(0, 0, 0, 0, kernels.F32, 0); err != nil {
		t.Errorf("n=0 must be a no-op: %v", err)
	}
}
