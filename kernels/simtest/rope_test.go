//go:build lsp_sim || cuda

// Tests of kernels/rope.cu under the simulator against cpu.RoPEForward and
// cpu.RoPEBackward (train/cpu/ref_rope.go) on the same (bf16-rounded)
// values.
//
// Shapes [B, T, NH, HS]: 2 x 13 x 3 x 10 (ragged), 2 x 64 x 12 x 64 (GPT-2
// small sized q at T=64), 1 x 1 x 1 x 2 (the smallest head), 1 x 7 x 2 x
// 512 (the largest), 3 x 257 x 5 x 128 (LLaMA's head size, positions past
// 256). fp32 and bf16, out of place (into a fresh NaN buffer) and in place;
// unpacked (a NULL pos: positions 0..T-1) and packed (positions of random
// ragged documents, backend.Positions).
// The inverse frequencies are a device tensor [HS/2] (as the Backend's
// RoPE ops take them): 1/theta^(2i/HS) with theta changing with the seed
// (10000, 500000), and for the third seed theta 10000's rescaled as
// llama3's rope_scaling does (low frequencies divided by 8, a smooth band
// between), so that a kernel computing its own frequencies from a theta
// would be caught. The inv_freq buffer ends at a guard page: HS/2 + 1
// reads crash. The seeds of Seeds alternate the guard page after and
// before the buffers.
//
// Tolerances, |got - want| <= atol + rtol |want|: fp32 atol 1e-6, rtol
// 1e-6 (the angles are the same fp32 numbers on both sides; sincosf
// against the CPU's float64 sin/cos rounded to fp32 is an ulp or two, on
// values of size <= 2); bf16 adds 2^-7 to rtol (one rounding each side).

package simtest

import (
	"fmt"
	"math"
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

// ropeInvFreq is the inverse frequencies of the i-th seed (see the file
// comment).
func ropeInvFreq(HS, i int) []float32 {
	switch i % 3 {
	case 0:
		return cpu.RoPEInvFreq(HS, 10000)
	case 1:
		return cpu.RoPEInvFreq(HS, 500000)
	}
	// llama3 scaling (factor 8, low 1, high 4, original context 8192),
	// as HF's _compute_llama3_parameters.
	inv := cpu.RoPEInvFreq(HS, 10000)
	const factor, low, high, orig = 8, 1, 4, 8192
	for j, f := range inv {
		wavelen := 2 * math.Pi / float64(f)
		switch {
		case wavelen > orig/low:
			inv[j] = f / factor
		case wavelen >= orig/high:
			smooth := (orig/wavelen - low) / (high - low)
			inv[j] = float32((1-smooth)*float64(f)/factor + smooth*float64(f))
		}
	}
	return inv
}

func TestRope(t *testing.T) {
	for _, c := range ropeCases {
		for _, xb := range []bool{true, false} {
			for _, packed := range []bool{false, true} {
				name := fmt.Sprintf("B%d_T%d_NH%d_HS%d_%s", c.B, c.T, c.NH, c.HS, dtName(xb))
				if packed {
					name += "_packed"
				}
				t.Run(name, func(t *testing.T) { testRope(t, c.B, c.T, c.NH, c.HS, xb, packed) })
			}
		}
	}
}

// testRope runs one case for every seed, unpacked or packed.
func testRope(t *testing.T, B, T, NH, HS int, xb, packed bool) {
	n := B * T * NH * HS
	x := roundIf(Rand(uint64(n), n, 2), xb)
	for i, seed := range Seeds {
		inv := ropeInvFreq(HS, i)
		before := i%2 == 0
		var pos []int32
		posDev := kernels.Ptr(0)
		if packed {
			pos = packedPositions(B, T, seed)
			posDev = FromInt32(t, pos).Dev()
		}
		wantF, wantB := make([]float32, n), make([]float32, n)
		cpu.RoPEForward(wantF, x, pos, inv, B, T, NH, HS)
		cpu.RoPEBackward(wantB, x, pos, inv, B, T, NH, HS)
		wantF, wantB = roundIf(wantF, xb), roundIf(wantB, xb)
		atol, rtol := 1e-6, tolFor(xb, 1e-6)

		SetSeed(seed)
		freq := FromFloat32(t, inv).Dev()
		in, out := NewFloatBuf(t, x, xb, before), outBuf(t, n, xb, !before)
		mustLaunch(t, kernels.RoPEForward(out.Dev(), in.Dev(), posDev, freq, B, T, NH, HS, dtype(xb), 0))
		Compare(t, "forward", out.Values(), wantF, atol, rtol)
		Compare(t, "forward input", in.Values(), x, 0, 0)
		mustLaunch(t, kernels.RoPEForward(in.Dev(), in.Dev(), posDev, freq, B, T, NH, HS, dtype(xb), 0))
		Compare(t, "forward in place", in.Values(), wantF, atol, rtol)

		din, dout := outBuf(t, n, xb, before), NewFloatBuf(t, x, xb, !before)
		mustLaunch(t, kernels.RoPEBackward(din.Dev(), dout.Dev(), posDev, freq, B, T, NH, HS, dtype(xb), 0))
		Compare(t, "backward", din.Values(), wantB, atol, rtol)
		mustLaunch(t, kernels.RoPEBackward(dout.Dev(), dout.Dev(), posDev, freq, B, T, NH, HS, dtype(xb), 0))
		Compare(t, "backward in place", dout.Values(), wantB, atol, rtol)
	}
}

// TestRopeArgs checks the launchers' argument checks.
func TestRopeArgs(t *testing.T) {
	f := NewFloatBuf(t, make([]float32, 1024), false, false).Dev()
	inv := FromFloat32(t, cpu.RoPEInvFreq(8, 10000)).Dev()
	bad := []struct {
		name string
		err  error
	}{
		{"odd HS", kernels.RoPEForward(f, f, 0, inv, 1, 1, 1, 9, kernels.F32, 0)},
		{"HS 0", kernels.RoPEForward(f, f, 0, inv, 1, 1, 1, 0, kernels.F32, 0)},
		{"HS 514", kernels.RoPEBackward(f, f, 0, inv, 1, 1, 1, 514, kernels.F32, 0)},
		{"T<0", kernels.RoPEForward(f, f, 0, inv, 1, -1, 1, 8, kernels.F32, 0)},
		{"nil out", kernels.RoPEForward(0, f, 0, inv, 1, 2, 1, 8, kernels.F32, 0)},
		{"nil inv_freq", kernels.RoPEForward(f, f, 0, 0, 1, 2, 1, 8, kernels.F32, 0)},
		{"bad dtype", kernels.RoPEBackward(f, f, 0, inv, 1, 2, 1, 8, 2, 0)},
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	if err := kernels.RoPEForward(0, 0, 0, 0, 0, 5, 2, 8, kernels.F32, 0); err != nil {
		t.Errorf("B=0 must be a no-op: %v", err)
	}
}
