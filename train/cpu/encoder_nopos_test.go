package cpu

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// TestEncoderWithoutPositions: an absent wpe (LLaMA) copies the token's
// row exactly (-0 included) and the backward then takes an absent dwpe and
// accumulates dwte only, at fp32 and bf16.
func TestEncoderWithoutPositions(t *testing.T) {
	for _, dt := range []backend.DType{backend.F32, backend.BF16} {
		be := newBE(t, Config{})
		s := be.DefaultStream()
		const B, T, C, V = 2, 3, 4, 5
		r := newRand(11)
		w := randVals(r, V*C, 1)
		w[2*C] = float32(math.Copysign(0, -1))
		ids := []int32{2, 0, 4, 2, 2, 1}
		wte := tensorOf(t, be, "wte", dt, w)
		out := tensorOf(t, be, "out", dt, make([]float32, B*T*C))
		inp := intsOf(t, be, "inp", ids)
		ok(t, be.EncoderForward(s, out, inp, backend.Tensor{}, wte, backend.Tensor{}, B, T, C))
		got, ref := get(t, be, out), get(t, be, wte)
		for bt, id := range ids {
			for c := range C {
				g, want := got[bt*C+c], ref[int(id)*C+c]
				if math.Float32bits(float32(g)) != math.Float32bits(float32(want)) {
					t.Fatalf("%v: out[%d,%d] = %v, want wte[%d,%d] = %v", dt, bt, c, g, id, c, want)
				}
			}
		}
		d0, dy := randVals(r, V*C, 1), randVals(r, B*T*C, 1)
		dwte := tensorOf(t, be, "dwte", backend.F32, d0)
		ok(t, be.EncoderBackward(s, dwte, backend.Tensor{}, tensorOf(t, be, "dout", backend.F32, dy), inp, backend.Tensor{}, B, T, C))
		want := f64s(d0)
		for bt, id := range ids {
			for c := range C {
				want[int(id)*C+c] += float64(dy[bt*C+c])
			}
		}
		near(t, "dwte", get(t, be, dwte), want, 1e-6, 1e-6)
	}
}
