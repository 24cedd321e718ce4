//go:build lsp_sim || cuda

// Tests of kernels/rope.cu under the simulator against cpu.RoPEForward and
// cpu.RoPEBackward (train/cpu/ref_rope.go) on the same (bf16-rounded)
// values.
//
// Shapes [B, T, NH, HS]: 2 x 13 x 3 x 10 (ragged), 2 x 64 x 12 x 64 (GPT-2
// small sized q at T=64), 1 x 1 x 1 x 2 (the smallest head), 1 x 7 x 2 x
// 512 (the largest), 3 x 257 x 5 x 128 (LLaMA's head size, positions past
// 256). fp32 and bf16, out of place (into a fresh NaN buffer) and in place.
// theta changes with the seed (10000, 500000, 1000), so a block that read
// the inverse frequencies of an earlier launch (left in shared memory)
// would be caught. The seeds of Seeds alternate the guard page after and
// before the buffers.
//
// Tolerances, |got - want| <= atol + rtol |want|: fp32 atol 1e-6, rtol
// 1e-6 (the angles are the same fp32 numbers on both sides; sincosf
// against the CPU's float64 sin/cos rounded to fp32 is an ulp or two, on
// values of size <= 2); bf16 adds 2^-7 to rtol (one rounding each side).

package simtest

import (
	"fmt"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

var ropeCases = []struct{ B, T, NH, HS int }{
	{2, 13, 3, 10},
	{2, 64, 12, 64},
	{1, 1, 1, 2},
	{1, 7, 2, 512},
	{3, 257, 5, 128},
}

var ropeThetas = []float32{10000, 500000, 1000}

func TestRope(t *testing.T) {
	for _, c := range ropeCases {
		for _, xb := range []bool{true, false} {
			t.Run(fmt.Sprintf("B%d_T%d_NH%d_HS%d_%s", c.B, c.T, c.NH, c.HS, dtName(xb)), func(t *testing.T) {
				n := c.B * c.T * c.NH * c.HS
				x := roundIf(Rand(uint64(n), n, 2), xb)
				for i, seed := range Seeds {
					theta := ropeThetas[i%len(ropeThetas)]
					before := i%2 == 0
					wantF, wantB := make([]float32, n), make([]float32, n)
					cpu.RoPEForward(wantF, x, c.B, c.T, c.NH, c.HS, theta)
					cpu.RoPEBackward(wantB, x, c.B, c.T, c.NH, c.HS, theta)
					wantF, wantB = roundIf(wantF, xb), roundIf(wantB, xb)
					atol, rtol := 1e-6, tolFor(xb, 1e-6)

					SetSeed(seed)
					in, out := NewFloatBuf(t, x, xb, before), outBuf(t, n, xb, !before)
					mustLaunch(t, kernels.RoPEForward(out.Dev(), in.Dev(), c.B, c.T, c.NH, c.HS, theta, dtype(xb), 0))
					Compare(t, "forward", out.Values(), wantF, atol, rtol)
					Compare(t, "forward input", in.Values(), x, 0, 0)
					mustLaunch(t, kernels.RoPEForward(in.Dev(), in.Dev(), c.B, c.T, c.NH, c.HS, theta, dtype(xb), 0))
					Compare(t, "forward in place", in.Values(), wantF, atol, rtol)

					din, dout := outBuf(t, n, xb, before), NewFloatBuf(t, x, xb, !before)
					mustLaunch(t, kernels.RoPEBackward(din.Dev(), dout.Dev(), c.B, c.T, c.NH, c.HS, theta, dtype(xb), 0))
					Compare(t, "backward", din.Values(), wantB, atol, rtol)
					mustLaunch(t, kernels.RoPEBackward(dout.Dev(), dout.Dev(), c.B, c.T, c.NH, c.HS, theta, dtype(xb), 0))
					Compare(t, "backward in place", dout.Values(), wantB, atol, rtol)
				}
			})
		}
	}
}

// TestRopeArgs checks the launchers' argument checks.
func TestRopeArgs(t *testing.T) {
	f := NewFloatBuf(t, make([]float32, 1024), false, false).Dev()
	bad := []struct {
		name string
		err  error
	}{
		{"odd HS", kernels.RoPEForward(f, f, 1, 1, 1, 9, 10000, kernels.F32, 0)},
		{"HS 0", kernels.RoPEForward(f, f, 1, 1, 1, 0, 10000, kernels.F32, 0)},
		{"HS 514", kernels.RoPEBackward(f, f, 1, 1, 1, 514, 10000, kernels.F32, 0)},
		{"theta 0", kernels.RoPEForward(f, f, 1, 1, 1, 8, 0, kernels.F32, 0)},
		{"T<0", kernels.RoPEForward(f, f, 1, -1, 1, 8, 10000, kernels.F32, 0)},
		{"nil out", kernels.RoPEForward(0, f, 1, 2, 1, 8, 10000, kernels.F32, 0)},
		{"bad dtype", kernels.RoPEBackward(f, f, 1, 2, 1, 8, 10000, 2, 0)},
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	if err := kernels.RoPEForward(0, 0, 0, 5, 2, 8, 10000, kernels.F32, 0); err != nil {
		t.Errorf("B=0 must be a no-op: %v", err)
	}
}
