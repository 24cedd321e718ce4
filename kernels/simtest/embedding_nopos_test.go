//go:build lsp_sim || cuda

// Tests of kernels/embedding.cu without a position table (wpe and dwpe
// NULL, LLaMA's embedding) against the CPU backend with absent wpe and
// dwpe: the forward copies the token's row (-0 stays -0, which adding a
// zero position would break), the backward accumulates dwte only. Exact
// comparisons, as for the GPT-2 encoder.

package simtest

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

func TestEmbeddingNoPositions(t *testing.T) {
	for _, c := range []embCase{{3, 131, 95, 257, "skewed", false}, {2, 5, 7, 11, "uniform", false}} {
		for _, xb := range []bool{true, false} {
			t.Run(c.String()+"_"+dtName(xb), func(t *testing.T) {
				ids := embTokens(c, uint64(c.V+2*c.T))
				wte := Rand(uint64(c.V)+9, c.V*c.C, 1)
				wte[int(ids[0])*c.C] = float32(math.Copysign(0, -1)) // a -0 the copy must keep
				rig := newCPURig(t)
				out := rig.tensor("out", make([]float32, c.B*c.T*c.C), xb)
				rig.run("encoder forward", rig.be.EncoderForward(rig.s, out, rig.ints("inp", ids), backend.Tensor{},
					rig.tensor("wte", wte, xb), backend.Tensor{}, c.B, c.T, c.C))
				want := rig.get(out)
				if !math.Signbit(float64(want[0])) {
					t.Fatalf("CPU backend lost the sign of -0 in row %d", ids[0])
				}
				dwte0, dout := Rand(uint64(c.V)+3, c.V*c.C, 1), Rand(uint64(c.B*c.T)+3, c.B*c.T*c.C, 1)
				gw := rig.tensor("dwte", dwte0, xb)
				rig.run("encoder backward", rig.be.EncoderBackward(rig.s, gw, backend.Tensor{}, rig.tensor("dout", dout, xb),
					rig.ints("inp", ids), backend.Tensor{}, c.B, c.T, c.C))
				wantW := rig.get(gw)
				for i, seed := range Seeds {
					before := i%2 == 0
					o := outBuf(t, c.B*c.T*c.C, xb, before)
					SetSeed(seed)
					mustLaunch(t, kernels.EncoderForward(o.Dev(), FromInt32(t, ids).Dev(), 0, NewFloatBuf(t, wte, xb, !before).Dev(),
						0, c.B, c.T, c.C, c.V, dtype(xb), 0))
					got := o.Values()
					Compare(t, "out", got, want, 0, 0)
					if !math.Signbit(float64(got[0])) {
						t.Fatalf("kernel lost the sign of -0 in row %d", ids[0])
					}
					g := NewFloatBuf(t, dwte0, xb, before)
					mustLaunch(t, kernels.EncoderBackward(g.Dev(), 0, NewFloatBuf(t, dout, xb, !before).Dev(),
						FromInt32(t, ids).Dev(), 0, c.B, c.T, c.C, c.V, dtype(xb), dtype(xb), 0))
					Compare(t, "dwte", g.Values(), wantW, 0, 0)
				}
			})
		}
	}
}
