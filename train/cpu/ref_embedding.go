// CPU reference for GPT-2's token + position embedding ("encoder") of
// kernels/embedding.cu, with the launchers' names and argument order
// (lsp_encoder_forward/backward):
//
//	forward:  out[b,t,:] = wte[inp[b,t],:] + wpe[p,:]
//	backward: dwte[inp[b,t],:] += dout[b,t,:],  dwpe[p,:] += dout[b,t,:]
//
// where p is pos[b,t], the token's position within its document in a
// packed row (backend.Positions), or t when pos is nil.
//
// Shapes: inp int32 [B, T] token ids; wte, dwte [V, C]; wpe, dwpe at least
// [T, C], or nil for a model without a position table (LLaMA: out is the
// token's row, copied exactly, and dwpe is not computed); out, dout
// [B, T, C].
//
// Pure fp32 over plain slices; callers holding bf16 tensors widen them
// before the call and round the outputs after it, as the kernels do. The
// backward adds dout into each gradient element over (b, t) in increasing
// order, one fp32 add at a time, which the kernel matches bit for bit; the
// op splits the channels over threads (encoderBackwardChannels), never the
// positions. Limits: a token id outside [0, V) is an error here, where the
// kernel, which cannot report it, writes NaN rows (forward) or skips it
// (backward).

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// EncoderForward writes out = wte[inp] + wpe[pos] (wte[inp] alone when
// wpe is nil; pos nil is t); it stops at the first token id outside
// [0, V), with the rows before it written.
func EncoderForward(out []float32, inp, pos []int32, wte, wpe []float32, B, T, C, V int) error {
	if err := checkEncoder(out, inp, pos, wte, wpe, B, T, C, V); err != nil {
		return err
	}
	for bt := 0; bt < B*T; bt++ {
		tok, t := int(inp[bt]), position(pos, bt, T)
		if tok < 0 || tok >= V {
			return fmt.Errorf("token id %d at position %d outside vocabulary of %d", tok, bt, V)
		}
		o, w := out[bt*C:(bt+1)*C], wte[tok*C:(tok+1)*C]
		if wpe == nil {
			copy(o, w)
			continue
		}
		p := wpe[t*C : (t+1)*C]
		for i := range o {
			o[i] = w[i] + p[i]
		}
	}
	return nil
}

// EncoderBackward accumulates dwte[inp] += dout and, unless dwpe is nil,
// dwpe[pos] += dout; it checks every token id first and then writes
// nothing if one is outside [0, V).
func EncoderBackward(dwte, dwpe, dout []float32, inp, pos []int32, B, T, C, V int) error {
	if err := checkEncoder(dout, inp, pos, dwte, dwpe, B, T, C, V); err != nil {
		return err
	}
	if err := checkTokens(inp[:B*T], V); err != nil {
		return err
	}
	encoderBackwardChannels(dwte, dwpe, dout, inp, pos, B, T, C, 0, C)
	return nil
}

// checkEncoder checks the lengths of the activations x [B,T,C] (out or
// dout), inp [B,T], pos (nil or a valid packing of [B,T]) and the tables
// [V,C] and, unless nil, [T,C] (or more).
func checkEncoder(x []float32, inp, pos []int32, wte, wpe []float32, B, T, C, V int) error {
	if B < 0 || T < 0 || C < 1 || V < 0 || len(x) < B*T*C || len(inp) < B*T || len(wte) < V*C || wpe != nil && len(wpe) < T*C {
		return fmt.Errorf("encoder: B=%d T=%d C=%d V=%d with %d activations, %d ids, tables of %d and %d",
			B, T, C, V, len(x), len(inp), len(wte), len(wpe))
	}
	if pos != nil {
		if err := backend.CheckPositions(pos, B, T); err != nil {
			return fmt.Errorf("encoder: %w", err)
		}
	}
	return nil
}

// position is token bt's position within its document: pos[bt], or bt's
// place in its row of T when pos is nil (an unpacked row).
func position(pos []int32, bt, T int) int {
	if pos == nil {
		return bt % T
	}
	return int(pos[bt])
}

// checkTokens returns an error naming the first token id outside [0, V).
func checkTokens(inp []int32, V int) error {
	for bt, tok := range inp {
		if tok < 0 || int(tok) >= V {
			return fmt.Errorf("token id %d at position %d outside vocabulary of %d", tok, bt, V)
		}
	}
	return nil
}

// encoderBackwardChannels accumulates channels [lo,hi) of every gradient
// row, in (b, t) order for every channel.
func encoderBackwardChannels(dwte, dwpe, dout []float32, inp, pos []int32, B, T, C, lo, hi int) {
	for bt := 0; bt < B*T; bt++ {
		tok, t := int(inp[bt]), position(pos, bt, T)
		d := dout[bt*C : (bt+1)*C]
		for i := lo; i < hi; i++ {
			dwte[tok*C+i] += d[i]
		}
		if dwpe == nil {
			continue
		}
		for i := lo; i < hi; i++ {
			dwpe[t*C+i] += d[i]
		}
	}
}
