//go:build lsp_sim || cuda

// Tests of kernels/embedding.cu under the simulator against the CPU
// backend's EncoderForward/EncoderBackward (train/cpu) on tensors of the
// same dtypes. Both sides add in the same order in fp32 and round once, so
// every comparison is exact (atol = rtol = 0): bit-identical results.
//
// Shapes (B, T, C, V): 3 x 131 x 95 x 257 (ragged: 393 positions are 3 full
// chunks of 128 and a partial one; 257 rows are 8 full row ranges of 32 and
// a partial one), 4 x 64 x 768 x 1007 (GPT-2 small's C), 2 x 100 x 130 x
// 50257 (GPT-2's vocabulary: 1571 row ranges, 2 channel tiles), 1 x 1 x 1 x
// 1. Token ids: uniform over V, or skewed (70% from {0, 1, 31, 32, 33,
// V-1}, so some rows are hit hundreds of times and every chunk has hits in
// several warps, in varying numbers), or all the same id. fp32 and bf16
// values in the forward; in the backward every mix of dout's dtype (g_bf16)
// and dwte's and dwpe's (dw_bf16).
// The gradients start from random values (they are accumulated); outputs of
// the forward start as NaN. The seeds of Seeds alternate the guard page
// after and before the buffers. Ids outside [0, V) are checked on their
// own: NaN rows in the forward, skipped for dwte in the backward. Packed
// cases give both sides positions of random ragged documents
// (backend.Positions): wpe rows by position, dwpe summed over the tokens
// at each position.

package simtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

type embCase struct {
	B, T, C, V int
	tokens     string // "uniform", "skewed" or "same"
	packed     bool   // positions of packed documents
}

var embCases = []embCase{
	{3, 131, 95, 257, "skewed", false},
	{3, 131, 95, 257, "uniform", false},
	{4, 64, 768, 1007, "skewed", false},
	{2, 100, 130, 50257, "uniform", false},
	{2, 100, 130, 50257, "skewed", false},
	{2, 300, 64, 40, "same", false},
	{1, 1, 1, 1, "uniform", false},
	{3, 131, 95, 257, "skewed", true},
	{2, 300, 64, 40, "same", true},
}

func (c embCase) String() string {
	s := fmt.Sprintf("B%d_T%d_C%d_V%d_%s", c.B, c.T, c.C, c.V, c.tokens)
	if c.packed {
		s += "_packed"
	}
	return s
}

// pos is the case's positions, nil unless packed.
func (c embCase) pos() []int32 {
	if !c.packed {
		return nil
	}
	return packedPositions(c.B, c.T, uint64(c.T))
}

// posPtr is pos on the device (a null pointer for nil).
func posPtr(t *testing.T, pos []int32) kernels.Ptr {
	if pos == nil {
		return 0
	}
	return FromInt32(t, pos).Dev()
}

// posTensor is pos on the CPU rig (absent for nil).
func (r *cpuRig) posTensor(pos []int32) backend.Tensor {
	if pos == nil {
		return backend.Tensor{}
	}
	return r.ints("pos", pos)
}

func embTokens(c embCase, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 7))
	hot := []int32{0, 1, 31, 32, 33, int32(c.V - 1)}
	ids := make([]int32, c.B*c.T)
	for i := range ids {
		switch {
		case c.tokens == "same":
			ids[i] = int32(min(c.V-1, 17))
		case c.tokens == "skewed" && r.Float64() < 0.7:
			ids[i] = min(hot[r.IntN(len(hot))], int32(c.V-1))
		default:
			ids[i] = int32(r.IntN(c.V))
		}
	}
	return ids
}

func TestEmbeddingForward(t *testing.T) {
	for _, c := range embCases {
		for _, xb := range []bool{true, false} {
			t.Run(c.String()+"_"+dtName(xb), func(t *testing.T) {
				ids := embTokens(c, uint64(c.V+c.T))
				wte, wpe := Rand(uint64(c.V), c.V*c.C, 1), Rand(uint64(c.T), c.T*c.C, 1)
				rig := newCPURig(t)
				out := rig.tensor("out", make([]float32, c.B*c.T*c.C), xb)
				pos := c.pos()
				rig.run("encoder forward", rig.be.EncoderForward(rig.s, out, rig.ints("inp", ids), rig.posTensor(pos),
					rig.tensor("wte", wte, xb), rig.tensor("wpe", wpe, xb), c.B, c.T, c.C))
				want := rig.get(out)
				for i, seed := range Seeds {
					before := i%2 == 0
					o := outBuf(t, c.B*c.T*c.C, xb, before)
					SetSeed(seed)
					mustLaunch(t, kernels.EncoderForward(o.Dev(), FromInt32(t, ids).Dev(), posPtr(t, pos),
						NewFloatBuf(t, wte, xb, !before).Dev(), NewFloatBuf(t, wpe, xb, before).Dev(), c.B, c.T, c.C, c.V, dtype(xb), 0))
					Compare(t, "out", o.Values(), want, 0, 0)
				}
			})
		}
	}
}

// cpuEncoderBackward returns the CPU backend's dwte and dwpe, with dout in
// bf16 when gb and the gradients dwte, dwpe in bf16 when wb.
func cpuEncoderBackward(t *testing.T, c embCase, ids []int32, dwte0, dwpe0, dout []float32, gb, wb bool) (dwte, dwpe []float32) {
	t.Helper()
	rig := newCPURig(t)
	gw, gp := rig.tensor("dwte", dwte0, wb), rig.tensor("dwpe", dwpe0, wb)
	rig.run("encoder backward", rig.be.EncoderBackward(rig.s, gw, gp, rig.tensor("dout", dout, gb), rig.ints("inp", ids),
		rig.posTensor(c.pos()), c.B, c.T, c.C))
	return rig.get(gw), rig.get(gp)
}

func TestEmbeddingBackward(t *testing.T) {
	for _, c := range embCases {
		// dout's dtype, dwte's and dwpe's: a bf16 model's two mixes first.
		for _, mix := range [][2]bool{{true, false}, {true, true}, {false, false}, {false, true}} {
			gb, wb := mix[0], mix[1]
			t.Run(c.String()+"_dout"+dtName(gb)+"_dw"+dtName(wb), func(t *testing.T) {
				ids := embTokens(c, uint64(c.V*3+c.T))
				dwte0, dwpe0 := Rand(uint64(c.V)+5, c.V*c.C, 1), Rand(uint64(c.T)+5, c.T*c.C, 1)
				dout := Rand(uint64(c.B*c.T), c.B*c.T*c.C, 1)
				wantW, wantP := cpuEncoderBackward(t, c, ids, dwte0, dwpe0, dout, gb, wb)
				for i, seed := range Seeds {
					before := i%2 == 0
					gw, gp := NewFloatBuf(t, dwte0, wb, before), NewFloatBuf(t, dwpe0, wb, !before)
					SetSeed(seed)
					mustLaunch(t, kernels.EncoderBackward(gw.Dev(), gp.Dev(), NewFloatBuf(t, dout, gb, before).Dev(),
						FromInt32(t, ids).Dev(), posPtr(t, c.pos()), c.B, c.T, c.C, c.V, dtype(gb), dtype(wb), 0))
					Compare(t, "dwte", gw.Values(), wantW, 0, 0)
					Compare(t, "dwpe", gp.Values(), wantP, 0, 0)
				}
			})
		}
	}
}

// TestEmbeddingInvalidTokens: ids outside [0, V) give NaN rows forward and
// are skipped for dwte (but not dwpe) backward.
func TestEmbeddingInvalidTokens(t *testing.T) {
	c := embCase{B: 2, T: 70, C: 37, V: 100}
	ids := embTokens(c, 1)
	bad := map[int]bool{3: true, 70: true, 139: true}
	ids[3], ids[70], ids[139] = -1, int32(c.V), math.MaxInt32
	clean := append([]int32(nil), ids...)
	for i := range bad {
		clean[i] = 5
	}
	wte, wpe := Rand(2, c.V*c.C, 1), Rand(3, c.T*c.C, 1)
	dwte0, dwpe0, dout := Rand(4, c.V*c.C, 1), Rand(5, c.T*c.C, 1), Rand(6, c.B*c.T*c.C, 1)
	// dwte as if the bad positions had no gradient; dwpe with all of them.
	zeroed := append([]float32(nil), dout...)
	for i := range bad {
		clear(zeroed[i*c.C : (i+1)*c.C])
	}
	wantW, _ := cpuEncoderBackward(t, c, clean, dwte0, dwpe0, zeroed, false, false)
	_, wantP := cpuEncoderBackward(t, c, clean, dwte0, dwpe0, dout, false, false)

	for _, seed := range Seeds {
		SetSeed(seed)
		o := outBuf(t, c.B*c.T*c.C, false, false)
		mustLaunch(t, kernels.EncoderForward(o.Dev(), FromInt32(t, ids).Dev(), 0, NewFloatBuf(t, wte, false, false).Dev(),
			NewFloatBuf(t, wpe, false, true).Dev(), c.B, c.T, c.C, c.V, kernels.F32, 0))
		got := o.Values()
		for bt := range c.B * c.T {
			for k, v := range got[bt*c.C : (bt+1)*c.C] {
				want := wte[int(clean[bt])*c.C+k] + wpe[(bt%c.T)*c.C+k]
				if bad[bt] && !math.IsNaN(float64(v)) || !bad[bt] && v != want {
					t.Fatalf("forward out[%d][%d] = %v (id %d), want %v (NaN for a bad id)", bt, k, v, ids[bt], want)
				}
			}
		}
		gw, gp := NewFloatBuf(t, dwte0, false, true), NewFloatBuf(t, dwpe0, false, false)
		mustLaunch(t, kernels.EncoderBackward(gw.Dev(), gp.Dev(), NewFloatBuf(t, dout, false, false).Dev(),
			FromInt32(t, ids).Dev(), 0, c.B, c.T, c.C, c.V, kernels.F32, kernels.F32, 0))
		Compare(t, "dwte", gw.Values(), wantW, 0, 0)
		Compare(t, "dwpe", gp.Values(), wantP, 0, 0)
	}
}

// TestEmbeddingArgs checks the launchers' argument checks.
func TestEmbeddingArgs(t *testing.T) {
	f := NewFloatBuf(t, make([]float32, 16), false, false).Dev()
	ids := FromInt32(t, []int32{0, 1}).Dev()
	bad := []struct {
		name string
		err  error
	}{
		{"C=0", kernels.EncoderForward(f, ids, 0, f, f, 1, 2, 0, 4, kernels.F32, 0)},
		{"V=0", kernels.EncoderBackward(f, f, f, ids, 0, 1, 2, 4, 0, kernels.F32, kernels.F32, 0)},
		{"B<0", kernels.EncoderForward(f, ids, 0, f, f, -1, 2, 4, 4, kernels.F32, 0)},
		{"nil inp", kernels.EncoderBackward(f, f, f, 0, 0, 1, 2, 4, 4, kernels.F32, kernels.F32, 0)},
		{"bad dtype", kernels.EncoderForward(f, ids, 0, f, f, 1, 2, 4, 4, 2, 0)},
		{"bad dout dtype", kernels.EncoderBackward(f, f, f, ids, 0, 1, 2, 4, 4, 2, kernels.F32, 0)},
		{"bad parameter-gradient dtype", kernels.EncoderBackward(f, f, f, ids, 0, 1, 2, 4, 4, kernels.BF16, -1, 0)},
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	if err := kernels.EncoderBackward(0, 0, 0, 0, 0, 0, 2, 4, 4, kernels.F32, kernels.F32, 0); err != nil {
		t.Errorf("B=0 must be a no-op: %v", err)
	}
}
