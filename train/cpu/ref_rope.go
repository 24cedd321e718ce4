// CPU reference for rotary position embeddings (RoPE), the oracle of the
// kernels in kernels/rope.cu. Convention of LLaMA in HF transformers
// (rotate_half): in each head of size HS the pairs (i, i+HS/2), i < HS/2,
// are rotated by angle = p * theta^(-2i/HS) at position p of the token in
// its document (pos[b,t] of a packed row, backend.Positions; t when pos is
// nil):
//
//	out[i]      = x[i]*cos - x[i+HS/2]*sin
//	out[i+HS/2] = x[i+HS/2]*cos + x[i]*sin
//
// for q or k laid out [B, T, NH, HS]. The backward is the rotation by
// -angle. Angles are computed in fp32 as HF does: inv_freq = 1 /
// theta^(float32(2i)/HS), angle = float32(t) * inv_freq, then cos and sin of
// that fp32 angle; the rotation itself is fp32.
//
// Limits: HS must be even; no offset for a cache. Callers holding bf16 tensors widen them before the
// call and round the outputs after it, as the kernels do.

package cpu

import "math"

// RoPEInvFreq returns inv_freq[i] = 1 / theta^(float32(2i)/HS) for
// i < HS/2, in fp32 as HF's LLaMA computes it.
func RoPEInvFreq(HS int, theta float32) []float32 {
	f := make([]float32, HS/2)
	for i := range f {
		e := float32(2*i) / float32(HS)
		f[i] = 1 / float32(math.Pow(float64(theta), float64(e)))
	}
	return f
}

// ropeRows rotates every pair of rows bt in [lo,hi) of B*T by sign *
// position * inv[i]; out may alias inp.
func ropeRows(out, inp []float32, pos []int32, inv []float32, lo, hi, T, NH, HS int, sign float32) {
	h := HS / 2
	for bt := lo; bt < hi; bt++ {
		t := position(pos, bt, T)
		for i, f := range inv[:h] {
			a := float32(t) * f
			c := float32(math.Cos(float64(a)))
			s := sign * float32(math.Sin(float64(a)))
			for hd := range NH {
				o := (bt*NH + hd) * HS
				x0, x1 := inp[o+i], inp[o+i+h]
				out[o+i] = x0*c - x1*s
				out[o+i+h] = x1*c + x0*s
			}
		}
	}
}

// RoPEForward writes the rotated inp [B,T,NH,HS] to out (out may alias
// inp: in place), with the inverse frequencies invFreq [HS/2]
// (RoPEInvFreq, or scaled ones), at positions pos [B,T] (nil: 0..T-1).
func RoPEForward(out, inp []float32, pos []int32, invFreq []float32, B, T, NH, HS int) {
	ropeRows(out, inp, pos, invFreq, 0, B*T, T, NH, HS, 1)
}

// RoPEBackward writes dinp = the rotation of dout by -angle (not
// accumulated; dinp may alias dout).
func RoPEBackward(dinp, dout []float32, pos []int32, invFreq []float32, B, T, NH, HS int) {
	ropeRows(dinp, dout, pos, invFreq, 0, B*T, T, NH, HS, -1)
}
