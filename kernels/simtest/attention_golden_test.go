//go:build lsp_sim

// TestAttentionGPT2Bits pins GPT-2's attention (KVH == NH, fused q|k|v
// rows) to the bits the kernels gave before grouped-query heads and the
// planar layout were added (attention.cu as of commit 59938ea, which took
// C and NH): grouping must not change a single bit of the case it
// generalizes. The pins are sha256 prefixes of out and lse from the
// forward and of dqkv from the backward (run on the kernel forward's own
// out and lse), for the tensor-core path (HS 64 and 128, ragged T), the
// generic path (HS 24) and a misaligned view of HS 64 (generic too).
// Simulator only: on a GPU the tensor cores' summation order is the
// hardware's, not the simulator's.
//
// The pins were computed by this same test against the old launchers
// (lsp_attention_forward(out, lse, qkv, B, T, C=NH*HS, NH)); a change to
// the kernels' arithmetic that is meant must update them and say why.

package simtest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
)

var attnGolden = []struct {
	B, T, NH, HS, off int
	out, lse, dqkv    string
}{
	{B: 2, T: 37, NH: 2, HS: 64, out: "a32ab39e1684b191", lse: "5f21c495432bb5e1", dqkv: "69d8a749cb1089a7"},
	{B: 1, T: 65, NH: 2, HS: 128, out: "7797d6f836a566c3", lse: "6a382d5f4233a6f6", dqkv: "2c9862f79e789ce0"},
	{B: 2, T: 19, NH: 2, HS: 24, out: "a0200370a02b4ad6", lse: "6fbaccb3d6653150", dqkv: "6130159736254c2b"},
	{B: 1, T: 37, NH: 2, HS: 64, off: 2, out: "f57bf4c87b5ac2cb", lse: "6e027dc9a7b7631f", dqkv: "ba33c8b3167da549"},
}

// bitsHash is the first 16 hex digits of the sha256 of xs' float32 bits.
func bitsHash(xs []float32) string {
	h := sha256.New()
	var b [4]byte
	for _, x := range xs {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func TestAttentionGPT2Bits(t *testing.T) {
	for _, c := range attnGolden {
		t.Run(fmt.Sprintf("B%d_T%d_NH%d_HS%d_off%d", c.B, c.T, c.NH, c.HS, c.off), func(t *testing.T) {
			n := c.B * c.T * c.NH * c.HS
			seed := uint64(7*c.T + c.HS)
			qkv := RoundBF16(Rand(seed, 3*n, 2))
			dout := RoundBF16(Rand(seed+1, n, 1))
			buf := func(n int, vals []float32) *Buffer {
				b := AllocAligned(t, 2*n+c.off, 256)
				if vals != nil {
					copy(b.Uint16()[c.off/2:], BF16Bits(vals))
				}
				return b
			}
			q, o, d, dq := buf(3*n, qkv), buf(n, nil), buf(n, dout), buf(3*n, nil)
			lse := AllocAligned(t, 4*c.B*c.NH*c.T, 256)
			scratch := AllocAligned(t, 4*c.B*c.NH*c.T, 256)
			SetSeed(Seeds[0])
			mustLaunch(t, goldenForward(o.Dev().Add(c.off), lse.Dev(), q.Dev().Add(c.off), c.B, c.T, c.NH, c.HS))
			mustLaunch(t, goldenBackward(dq.Dev().Add(c.off), d.Dev().Add(c.off), q.Dev().Add(c.off), o.Dev().Add(c.off),
				lse.Dev(), scratch.Dev(), c.B, c.T, c.NH, c.HS))
			vals := [3][]float32{bf16At(o, c.off), lse.Float32(), bf16At(dq, c.off)}
			var got [3]string
			for i, v := range vals {
				for j, x := range v {
					if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
						t.Fatalf("output %d: element %d is %v (not written?)", i, j, x)
					}
				}
				got[i] = bitsHash(v)
			}
			for i, want := range [3]string{c.out, c.lse, c.dqkv} {
				if got[i] != want {
					t.Errorf("%s: bits hash %s, pinned %s (GPT-2's attention changed)", [3]string{"out", "lse", "dqkv"}[i], got[i], want)
				}
			}
		})
	}
}

func goldenForward(out, lse, qkv kernels.Ptr, B, T, NH, HS int) error {
	return kernels.AttentionForward(out, lse, qkv, 0, B, T, NH, NH, HS, 0, 0)
}

func goldenBackward(dqkv, dout, qkv, out, lse, scratch kernels.Ptr, B, T, NH, HS int) error {
	return kernels.AttentionBackward(dqkv, dout, qkv, out, lse, 0, scratch, B, T, NH, NH, HS, 0, 0)
}
