// Packed rows (--pack, backend.Positions) on the CPU backend: every op that
// takes positions gives, for each document of a packed row, the bits of
// that document run alone as a row of its own. That is the property the
// packed trainer's loss rests on (no attention across documents, positions
// restarted), and the CPU backend, whose sums run over a document's keys
// in the order of an unpacked row, keeps it exactly.

package cpu

import (
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// packing is B rows of T tokens holding documents of the given lengths
// end to end; a row's tokens after its documents are padding, a document
// of their own (positions from 0), so that they touch no real document.
type packing struct {
	B, T int
	docs [][]int // per row
}

// pos is the packing's positions, [B,T].
func (p packing) pos() []int32 {
	out := make([]int32, 0, p.B*p.T)
	for _, row := range p.docs {
		n := 0
		for _, l := range row {
			for i := range l {
				out = append(out, int32(i))
			}
			n += l
		}
		for i := int32(0); n < p.T; n++ {
			out = append(out, i)
			i++
		}
	}
	return out
}

// each calls f for every document: its row, first token and length.
func (p packing) each(f func(b, start, n int)) {
	for b, row := range p.docs {
		start := 0
		for _, l := range row {
			f(b, start, l)
			start += l
		}
	}
}

// testPacking is ragged: a one-token document, documents that are not a
// multiple of anything, and a row whose tail is padding.
var testPacking = packing{B: 2, T: 13, docs: [][]int{{5, 1, 7}, {9, 3}}}

// sameBits fails unless got and want are the same bits.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v (the document run alone)", what, i, got[i], want[i])
		}
	}
}

// qkvOf lays rows q [BT][NH*HS], k and v [BT][KVH*HS] out as layout says.
func qkvOf(layout backend.QKVLayout, q, k, v [][]float32, NH, KVH, HS int) []float32 {
	BT := len(q)
	x := layout.Index(BT, NH, KVH, HS)
	out := make([]float32, BT*(NH+2*KVH)*HS)
	for p := range BT {
		copy(out[x.QBase+p*x.QRow:], q[p])
		copy(out[x.KBase+p*x.KVRow:], k[p])
		copy(out[x.VBase+p*x.KVRow:], v[p])
	}
	return out
}

// rowsOf splits x into rows of n.
func rowsOf(x []float32, n int) [][]float32 {
	var out [][]float32
	for i := 0; i+n <= len(x); i += n {
		out = append(out, x[i:i+n])
	}
	return out
}

func TestPackedAttentionEqualsDocuments(t *testing.T) {
	p := testPacking
	const NH, KVH, HS = 4, 2, 6
	BT := p.B * p.T
	for _, layout := range []backend.QKVLayout{backend.QKVFused, backend.QKVPlanar} {
		be := newBE(t, Config{})
		s := be.DefaultStream()
		r := newRand(42)
		q := rowsOf(randVals(r, BT*NH*HS, 1), NH*HS)
		k := rowsOf(randVals(r, BT*KVH*HS, 1), KVH*HS)
		v := rowsOf(randVals(r, BT*KVH*HS, 1), KVH*HS)
		dy := randVals(r, BT*NH*HS, 1)

		run := func(B, T int, pos []int32, q, k, v [][]float32, dy []float32) (out, lse, dq []float32) {
			qkv := tensorOf(t, be, "qkv", backend.F32, qkvOf(layout, q, k, v, NH, KVH, HS))
			o := alloc(t, be, "out", B*T*NH*HS, backend.F32)
			l := alloc(t, be, "lse", B*NH*T, backend.F32)
			d := alloc(t, be, "dqkv", qkv.Len(), backend.F32)
			sc := alloc(t, be, "scratch", backend.AttentionBackwardScratch(B, T, NH), backend.F32)
			ps := backend.Tensor{}
			if pos != nil {
				ps = intsOf(t, be, "pos", pos)
			}
			ok(t, be.AttentionForward(s, o, l, qkv, ps, B, T, NH, KVH, HS, layout))
			ok(t, be.AttentionBackward(s, d, tensorOf(t, be, "dout", backend.F32, dy), qkv, o, l, ps, sc, B, T, NH, KVH, HS, layout))
			return get(t, be, o), get(t, be, l), get(t, be, d)
		}
		out, lse, dqkv := run(p.B, p.T, p.pos(), q, k, v, dy)
		px := layout.Index(BT, NH, KVH, HS)
		p.each(func(b, start, n int) {
			o0 := b*p.T + start
			dout, dl, dd := run(1, n, nil, q[o0:o0+n], k[o0:o0+n], v[o0:o0+n], dy[o0*NH*HS:(o0+n)*NH*HS])
			sameBits(t, layout.String()+" out", out[o0*NH*HS:(o0+n)*NH*HS], dout)
			for h := range NH {
				at := (b*NH+h)*p.T + start
				sameBits(t, layout.String()+" lse", lse[at:at+n], dl[h*n:(h+1)*n])
			}
			dx := layout.Index(n, NH, KVH, HS)
			for i := range n {
				sameBits(t, layout.String()+" dq", dqkv[px.QBase+(o0+i)*px.QRow:][:NH*HS], dd[dx.QBase+i*dx.QRow:][:NH*HS])
				sameBits(t, layout.String()+" dk", dqkv[px.KBase+(o0+i)*px.KVRow:][:KVH*HS], dd[dx.KBase+i*dx.KVRow:][:KVH*HS])
				sameBits(t, layout.String()+" dv", dqkv[px.VBase+(o0+i)*px.KVRow:][:KVH*HS], dd[dx.VBase+i*dx.KVRow:][:KVH*HS])
			}
		})
		// Positions 0..T-1 are an unpacked row: the absent pos's bits.
		seq := make([]int32, BT)
		for i := range seq {
			seq[i] = int32(i % p.T)
		}
		o1, l1, d1 := run(p.B, p.T, seq, q, k, v, dy)
		o2, l2, d2 := run(p.B, p.T, nil, q, k, v, dy)
		sameBits(t, "out 0..T-1", o1, o2)
		sameBits(t, "lse 0..T-1", l1, l2)
		sameBits(t, "dqkv 0..T-1", d1, d2)
	}
}

func TestPackedRoPEEqualsDocuments(t *testing.T) {
	p := testPacking
	const NH, HS = 3, 8
	BT := p.B * p.T
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(7)
	x := randVals(r, BT*NH*HS, 1)
	inv := tensorOf(t, be, "inv", backend.F32, RoPEInvFreq(HS, 10000))
	run := func(B, T int, pos []int32, x []float32, fwd bool) []float32 {
		in := tensorOf(t, be, "x", backend.F32, x)
		out := alloc(t, be, "out", len(x), backend.F32)
		ps := backend.Tensor{}
		if pos != nil {
			ps = intsOf(t, be, "pos", pos)
		}
		if fwd {
			ok(t, be.RoPEForward(s, out, in, ps, inv, B, T, NH, HS))
		} else {
			ok(t, be.RoPEBackward(s, out, in, ps, inv, B, T, NH, HS))
		}
		return get(t, be, out)
	}
	for _, fwd := range []bool{true, false} {
		got := run(p.B, p.T, p.pos(), x, fwd)
		p.each(func(b, start, n int) {
			o := (b*p.T + start) * NH * HS
			sameBits(t, "rope", got[o:o+n*NH*HS], run(1, n, nil, x[o:o+n*NH*HS], fwd))
		})
	}
}

func TestPackedEncoderEqualsDocuments(t *testing.T) {
	p := testPacking
	const C, V = 5, 11
	BT := p.B * p.T
	be := newBE(t, Config{})
	s := be.DefaultStream()
	r := newRand(3)
	ids := make([]int32, BT)
	for i := range ids {
		ids[i] = int32(r.IntN(V))
	}
	wte := tensorOf(t, be, "wte", backend.F32, randVals(r, V*C, 1))
	wpe := tensorOf(t, be, "wpe", backend.F32, randVals(r, p.T*C, 1))
	dy := randVals(r, BT*C, 1)
	d0w, d0p := randVals(r, V*C, 1), randVals(r, p.T*C, 1)

	out := alloc(t, be, "out", BT*C, backend.F32)
	pos := intsOf(t, be, "pos", p.pos())
	inp := intsOf(t, be, "inp", ids)
	ok(t, be.EncoderForward(s, out, inp, pos, wte, wpe, p.B, p.T, C))
	got := get(t, be, out)
	dwte, dwpe := tensorOf(t, be, "dwte", backend.F32, d0w), tensorOf(t, be, "dwpe", backend.F32, d0p)
	ok(t, be.EncoderBackward(s, dwte, dwpe, tensorOf(t, be, "dout", backend.F32, dy), inp, pos, p.B, p.T, C))

	// The documents one at a time, in the packed rows' order: each gradient
	// element then adds the same values in the same order.
	ewte, ewpe := tensorOf(t, be, "dwte1", backend.F32, d0w), tensorOf(t, be, "dwpe1", backend.F32, d0p)
	p.each(func(b, start, n int) {
		o := b*p.T + start
		di := intsOf(t, be, "inp1", ids[o:o+n])
		dout := alloc(t, be, "out1", n*C, backend.F32)
		ok(t, be.EncoderForward(s, dout, di, backend.Tensor{}, wte, wpe, 1, n, C))
		sameBits(t, "encoder out", got[o*C:(o+n)*C], get(t, be, dout))
		ok(t, be.EncoderBackward(s, ewte, ewpe, tensorOf(t, be, "dy1", backend.F32, dy[o*C:(o+n)*C]), di, backend.Tensor{}, 1, n, C))
	})
	// The padding tail of row 1, a document of its own at position 0.
	tail := 1*p.T + 12
	pad := p.pos()[tail]
	dpad := make([]float32, p.T*C)
	copy(dpad[int(pad)*C:], dy[tail*C:(tail+1)*C])
	dw := get(t, be, ewte)
	for c := range C {
		dw[int(ids[tail])*C+c] += dy[tail*C+c]
	}
	dp := get(t, be, ewpe)
	for i := range dp {
		dp[i] += dpad[i]
	}
	sameBits(t, "dwte", get(t, be, dwte), dw)
	sameBits(t, "dwpe", get(t, be, dwpe), dp)
}

// TestPositionsRefused: a position that does not continue its document
// (or start one) is an error of the op, on every op that takes them.
func TestPositionsRefused(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	const B, T, NH, HS = 1, 4, 1, 2
	bad := intsOf(t, be, "pos", []int32{0, 1, 3, 0})
	qkv := tensorOf(t, be, "qkv", backend.F32, make([]float32, B*T*3*NH*HS))
	out := alloc(t, be, "out", B*T*NH*HS, backend.F32)
	lse := alloc(t, be, "lse", B*NH*T, backend.F32)
	ok(t, be.AttentionForward(s, out, lse, qkv, bad, B, T, NH, NH, HS, backend.QKVFused))
	err := be.Synchronize(s)
	if err == nil || !strings.Contains(err.Error(), "token 2 has position 3") {
		t.Fatalf("attention with bad positions: %v", err)
	}
	be2 := newBE(t, Config{})
	short := alloc(t, be2, "pos", 3, backend.I32)
	x := alloc(t, be2, "x", B*T*NH*HS, backend.F32)
	inv := alloc(t, be2, "inv", HS/2, backend.F32)
	if err := be2.RoPEForward(be2.DefaultStream(), x, x, short, inv, B, T, NH, HS); err == nil || !strings.Contains(err.Error(), "pos") {
		t.Fatalf("rope with 3 positions for 4 tokens: %v", err)
	}
}
