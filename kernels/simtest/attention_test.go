//go:build lsp_sim || cuda

// Tests of kernels/attention.cu (lsp_attention_forward and
// lsp_attention_backward) under the simulator against the CPU backend's
// AttentionForward and AttentionBackward (train/cpu) on the same bf16
// inputs. Shapes: realistic ones (B=2, T=128, C=256 with HS 64 and 128,
// several query and key tiles), ragged ones for the tensor-core path (T 1,
// 37, 65: not multiples of the 64/32 tiles), the generic path (HS 16, 24,
// 40, 96, 256 with T 19, 33, 40, 9) and HS 64 through a 2-byte-misaligned
// view (which must fall back to the generic path), each for every seed of
// Seeds. Those are GPT-2's heads (KVH == NH, fused q|k|v rows); the
// grouped-query cases add KVH 1 (multi-query) and 2 with NH 4 or 6, in
// both layouts (fused rows and LLaMA's planar q, k, v), on both paths and
// misaligned, and KVH == NH in the planar layout. A key/value head's
// gradient is a sum over its query heads, so a head mapped to the wrong
// group or a sum missing a query head is off by O(max|want|). Inputs are uniform: qkv in [-2, 2) (scaled scores of standard
// deviation ~1.3, neither flat nor one-hot softmax rows), dout in [-1, 1).
// Outputs start as NaN (fresh buffers), so anything not written shows.
// Buffers rotate per seed between a 256-byte-aligned start, a guard page
// right after the end and one right before the start. The backward gets the
// CPU forward's out and lse on both sides, so it is checked on its own.
//
// Tolerances, |got - want| <= atol + rtol |want|:
//   - out, dq, dk, dv (bf16): rtol 2^-7, atol 2^-8 max|want| + 2^-14
//     (max over that tensor or third of dqkv). Both sides round their
//     result to bf16 once (up to 1 ulp = 2^-8 relative apart); the kernel
//     also rounds P (forward and backward) and dS to bf16 before the
//     tensor-core products, relative errors of 2^-9 per term that average
//     out in the sums but show in outputs that are sums with cancellation:
//     hence atol relative to the tensor's scale. The 2^-14 floor covers
//     outputs that are exactly 0 on one side (T=1: dq = dk = 0 up to the
//     rounding of dP - D). A stale or missing tile (what a removed barrier
//     gives) is off by O(max|want|).
//   - lse (fp32): atol 2^-16, rtol 2^-17. Scores are fp32 sums of the same
//     exact bf16 products in another order (plus exp2/log2 against exp/log):
//     a few ulps of O(10) values.
//
// Packed cases (packed: true) give both sides positions (backend.Positions)
// of random ragged documents, 1 to 40 tokens, so that documents start
// inside key and query tiles and rows of a tile see no key of the first
// tiles: attention is then masked to each document on both sides.
//
// A second run with another simulator seed must give bit-identical
// results (fixed summation orders, no atomics).

package simtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

type attnCase struct {
	B, T, NH, KVH, HS int
	layout            backend.QKVLayout
	off               int  // bytes added to the bf16 pointers (2: misaligned)
	packed            bool // rows of several documents (positions)
}

func (c attnCase) String() string {
	s := fmt.Sprintf("B%d_T%d_NH%d_KVH%d_HS%d_%v", c.B, c.T, c.NH, c.KVH, c.HS, c.layout)
	if c.off != 0 {
		s += fmt.Sprintf("_off%d", c.off)
	}
	if c.packed {
		s += "_packed"
	}
	return s
}

// packedPositions is B rows of T tokens cut into documents of 1 to 40
// tokens (the last one of a row cut by T), positions restarting at each.
func packedPositions(B, T int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 42))
	pos := make([]int32, 0, B*T)
	for range B {
		for t := 0; t < T; {
			n := min(1+r.IntN(40), T-t)
			for i := range n {
				pos = append(pos, int32(i))
			}
			t += n
		}
	}
	return pos
}

// qkvLen and outLen are the element counts of qkv (and dqkv) and of out
// (and dout).
func (c attnCase) qkvLen() int { return c.B * c.T * (c.NH + 2*c.KVH) * c.HS }
func (c attnCase) outLen() int { return c.B * c.T * c.NH * c.HS }

// mha is GPT-2's attention: NH heads of HS, KVH == NH, fused rows.
func mha(B, T, C, NH int) attnCase { return attnCase{B: B, T: T, NH: NH, KVH: NH, HS: C / NH} }

var attnCases = []attnCase{
	mha(2, 128, 256, 4), // realistic, HS 64
	mha(2, 128, 256, 2), // realistic, HS 128
	mha(1, 1, 128, 2),
	mha(2, 37, 128, 2),
	mha(1, 65, 128, 2),
	mha(1, 65, 256, 2),
	mha(2, 19, 48, 2),  // generic HS 24
	mha(1, 19, 120, 3), // generic HS 40
	mha(1, 40, 32, 2),  // generic HS 16
	mha(1, 33, 192, 2), // generic HS 96
	mha(1, 9, 256, 1),  // generic HS 256, the largest
	{B: 1, T: 37, NH: 2, KVH: 2, HS: 64, off: 2},
	// Grouped-query heads, tensor-core path.
	{B: 2, T: 37, NH: 4, KVH: 1, HS: 64},
	{B: 2, T: 37, NH: 4, KVH: 2, HS: 64, layout: backend.QKVPlanar},
	{B: 1, T: 65, NH: 4, KVH: 2, HS: 128},
	{B: 1, T: 70, NH: 4, KVH: 1, HS: 128, layout: backend.QKVPlanar},
	{B: 2, T: 33, NH: 2, KVH: 2, HS: 64, layout: backend.QKVPlanar},
	// Generic path.
	{B: 2, T: 19, NH: 6, KVH: 2, HS: 24, layout: backend.QKVPlanar},
	{B: 1, T: 33, NH: 3, KVH: 1, HS: 40},
	{B: 2, T: 7, NH: 4, KVH: 1, HS: 16, layout: backend.QKVPlanar},
	{B: 1, T: 37, NH: 4, KVH: 2, HS: 64, layout: backend.QKVPlanar, off: 2},
	// Packed rows: tensor-core path (fused and planar, grouped), generic
	// path, misaligned.
	{B: 2, T: 70, NH: 2, KVH: 2, HS: 64, packed: true},
	{B: 2, T: 67, NH: 4, KVH: 2, HS: 128, layout: backend.QKVPlanar, packed: true},
	{B: 2, T: 45, NH: 6, KVH: 2, HS: 24, layout: backend.QKVPlanar, packed: true},
	{B: 1, T: 70, NH: 2, KVH: 2, HS: 40, packed: true},
	{B: 1, T: 37, NH: 4, KVH: 2, HS: 64, layout: backend.QKVPlanar, off: 2, packed: true},
}

// attnInputs are the values both sides see (already bf16), and the
// positions of a packed case (nil otherwise).
type attnInputs struct {
	qkv, dout []float32
	pos       []int32
}

func newAttnInputs(c attnCase, seed uint64) attnInputs {
	in := attnInputs{
		qkv:  RoundBF16(Rand(seed*11+1, c.qkvLen(), 2)),
		dout: RoundBF16(Rand(seed*11+2, c.outLen(), 1)),
	}
	if c.packed {
		in.pos = packedPositions(c.B, c.T, seed)
	}
	return in
}

// attnRef holds the CPU backend's results.
type attnRef struct {
	out, lse, dqkv []float32
}

// cpuAttention runs the CPU backend's forward and then its backward on the
// forward's own out and lse.
func cpuAttention(t *testing.T, c attnCase, in attnInputs) attnRef {
	t.Helper()
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	tensor := func(name string, n int, dt backend.DType, vals []float32) backend.Tensor {
		x, err := be.Alloc(name, n, dt)
		if err != nil {
			t.Fatalf("cpu alloc %s: %v", name, err)
		}
		if vals != nil {
			if err := backend.Upload(be, s, x, vals); err != nil {
				t.Fatalf("cpu upload %s: %v", name, err)
			}
		}
		return x
	}
	qkv := tensor("qkv", c.qkvLen(), backend.BF16, in.qkv)
	dout := tensor("dout", c.outLen(), backend.BF16, in.dout)
	out := tensor("out", c.outLen(), backend.BF16, nil)
	lse := tensor("lse", c.B*c.NH*c.T, backend.F32, nil)
	dqkv := tensor("dqkv", c.qkvLen(), backend.BF16, nil)
	scratch := tensor("scratch", backend.AttentionBackwardScratch(c.B, c.T, c.NH), backend.F32, nil)
	pos := backend.Tensor{}
	if in.pos != nil {
		pos = tensor("pos", len(in.pos), backend.I32, nil)
		if err := backend.UploadInt32(be, s, pos, in.pos); err != nil {
			t.Fatalf("cpu upload pos: %v", err)
		}
	}
	if err := be.AttentionForward(s, out, lse, qkv, pos, c.B, c.T, c.NH, c.KVH, c.HS, c.layout); err != nil {
		t.Fatalf("cpu attention forward: %v", err)
	}
	if err := be.AttentionBackward(s, dqkv, dout, qkv, out, lse, pos, scratch, c.B, c.T, c.NH, c.KVH, c.HS, c.layout); err != nil {
		t.Fatalf("cpu attention backward: %v", err)
	}
	var r attnRef
	for _, d := range []struct {
		dst *[]float32
		x   backend.Tensor
	}{{&r.out, out}, {&r.lse, lse}, {&r.dqkv, dqkv}} {
		v, err := backend.Download(be, s, d.x)
		if err != nil {
			t.Fatalf("cpu download: %v", err)
		}
		*d.dst = v
	}
	return r
}

// attnAlloc allocates bytes (plus off) with the guard placement picked by
// mode.
func attnAlloc(t *testing.T, bytes int, mode uint64) *Buffer {
	t.Helper()
	switch mode % 3 {
	case 0:
		return AllocAligned(t, bytes, 256)
	case 1:
		return Alloc(t, bytes)
	default:
		return AllocBefore(t, bytes)
	}
}

// bf16Buffer allocates a bf16 buffer of n elements at byte offset off,
// holding vals when not nil.
func bf16Buffer(t *testing.T, n, off int, mode uint64, vals []float32) *Buffer {
	t.Helper()
	b := attnAlloc(t, 2*n+off, mode)
	if vals != nil {
		copy(b.Uint16()[off/2:], BF16Bits(vals))
	}
	return b
}

func bf16At(b *Buffer, off int) []float32 { return BF16Values(b.Uint16()[off/2:]) }

// posBuffer holds pos (nil: no buffer, a null pointer), with the guard
// placement picked by mode.
func posBuffer(t *testing.T, pos []int32, mode uint64) *Buffer {
	t.Helper()
	if pos == nil {
		return nil
	}
	b := attnAlloc(t, 4*len(pos), mode)
	copy(b.Int32(), pos)
	return b
}

// runAttnForward runs the kernel forward with simulator seed simSeed and
// returns out and lse.
func runAttnForward(t *testing.T, c attnCase, in attnInputs, mode, simSeed uint64) (out, lse []float32) {
	t.Helper()
	a := attnArgs{B: c.B, T: c.T, NH: c.NH, KVH: c.KVH, HS: c.HS, Layout: int(c.layout), Off: c.off,
		Qkv: bf16Buffer(t, c.qkvLen(), c.off, mode, in.qkv),
		Out: bf16Buffer(t, c.outLen(), c.off, mode+1, nil),
		Lse: attnAlloc(t, 4*c.B*c.NH*c.T, mode+2),
		Pos: posBuffer(t, in.pos, mode),
	}
	SetSeed(simSeed)
	if err := a.forward(); err != nil {
		t.Fatalf("%v: %v", c, err)
	}
	return bf16At(a.Out, c.off), append([]float32(nil), a.Lse.Float32()...)
}

// runAttnBackward runs the kernel backward on the reference's out and lse
// with simulator seed simSeed and returns dqkv.
func runAttnBackward(t *testing.T, c attnCase, in attnInputs, ref attnRef, mode, simSeed uint64) []float32 {
	t.Helper()
	a := attnArgs{B: c.B, T: c.T, NH: c.NH, KVH: c.KVH, HS: c.HS, Layout: int(c.layout), Off: c.off,
		Qkv:     bf16Buffer(t, c.qkvLen(), c.off, mode, in.qkv),
		Dout:    bf16Buffer(t, c.outLen(), c.off, mode+1, in.dout),
		Out:     bf16Buffer(t, c.outLen(), c.off, mode+2, ref.out),
		Lse:     attnAlloc(t, 4*c.B*c.NH*c.T, mode),
		Scratch: attnAlloc(t, 4*backend.AttentionBackwardScratch(c.B, c.T, c.NH), mode+1), // the Go size: guards catch a launcher needing more
		Dqkv:    bf16Buffer(t, c.qkvLen(), c.off, mode+2, nil),
		Pos:     posBuffer(t, in.pos, mode+1),
	}
	copy(a.Lse.Float32(), ref.lse)
	SetSeed(simSeed)
	if err := a.backward(); err != nil {
		t.Fatalf("%v: %v", c, err)
	}
	return bf16At(a.Dqkv, c.off)
}

// bf16Tol is the tolerance of a bf16 result (see the file comment).
func bf16Tol(want []float32) (atol, rtol float64) {
	var mx float64
	for _, w := range want {
		mx = math.Max(mx, math.Abs(float64(w)))
	}
	return math.Ldexp(mx, -8) + math.Ldexp(1, -14), math.Ldexp(1, -7)
}

// dqkvPart extracts part p (0 q, 1 k, 2 v) of a dqkv of c's shape and
// layout, position by position.
func dqkvPart(x []float32, c attnCase, p int) []float32 {
	BT := c.B * c.T
	ix := c.layout.Index(BT, c.NH, c.KVH, c.HS)
	base, row, n := ix.QBase, ix.QRow, c.NH*c.HS
	switch p {
	case 1:
		base, row, n = ix.KBase, ix.KVRow, c.KVH*c.HS
	case 2:
		base, row, n = ix.VBase, ix.KVRow, c.KVH*c.HS
	}
	out := make([]float32, 0, BT*n)
	for r := range BT {
		out = append(out, x[base+r*row:][:n]...)
	}
	return out
}

// TestAttentionForward compares out and lse with the CPU backend.
// attnArgs are the buffers and sizes of the attention launchers (see
// kernels/attention.cu): qkv, out, dout, dqkv bf16; lse, scratch fp32;
// pos int32. A nil buffer is passed as a null pointer. Off (bytes) is added to every
// bf16 pointer (qkv, out, dout, dqkv) to test unaligned views; the buffers
// must then be Off bytes longer.
type attnArgs struct {
	Out, Lse, Qkv, Dqkv, Dout, Scratch *Buffer
	Pos                                *Buffer
	B, T, NH, KVH, HS, Layout          int
	Off                                int
}

// at is b's device address plus off bytes (null for a nil b).
func (a attnArgs) at(b *Buffer, off int) kernels.Ptr {
	if b == nil {
		return 0
	}
	return b.Dev().Add(off)
}

// forward runs lsp_attention_forward(Out, Lse, Qkv, Pos, B, T, NH, KVH,
// HS, Layout).
func (a attnArgs) forward() error {
	return kernels.AttentionForward(a.at(a.Out, a.Off), a.at(a.Lse, 0), a.at(a.Qkv, a.Off), a.at(a.Pos, 0), a.B, a.T,
		a.NH, a.KVH, a.HS, a.Layout, 0)
}

// backward runs lsp_attention_backward(Dqkv, Dout, Qkv, Out, Lse, Pos,
// Scratch, B, T, NH, KVH, HS, Layout).
func (a attnArgs) backward() error {
	return kernels.AttentionBackward(a.at(a.Dqkv, a.Off), a.at(a.Dout, a.Off), a.at(a.Qkv, a.Off), a.at(a.Out, a.Off),
		a.at(a.Lse, 0), a.at(a.Pos, 0), a.at(a.Scratch, 0), a.B, a.T, a.NH, a.KVH, a.HS, a.Layout, 0)
}

// eachAttnSeed runs check as a subtest per case of attnCases, for each
// seed, with that seed's inputs, the CPU backend's results on them and the
// name of the seed's checks; a false from check skips the case's later
// seeds.
func eachAttnSeed(t *testing.T, check func(t *testing.T, c attnCase, seed uint64, in attnInputs, ref attnRef, name string) bool) {
	for _, c := range attnCases {
		t.Run(c.String(), func(t *testing.T) {
			for _, seed := range Seeds {
				in := newAttnInputs(c, seed)
				if !check(t, c, seed, in, cpuAttention(t, c, in), fmt.Sprintf("%v seed %d", c, seed)) {
					return
				}
			}
		})
	}
}

func TestAttentionForward(t *testing.T) {
	eachAttnSeed(t, func(t *testing.T, c attnCase, seed uint64, in attnInputs, ref attnRef, name string) bool {
		out, lse := runAttnForward(t, c, in, seed, seed)
		atol, rtol := bf16Tol(ref.out)
		if !Compare(t, name+" out", out, ref.out, atol, rtol) ||
			!Compare(t, name+" lse", lse, ref.lse, math.Ldexp(1, -16), math.Ldexp(1, -17)) {
			return false
		}
		if seed == Seeds[0] {
			out2, lse2 := runAttnForward(t, c, in, seed+1, seed+100)
			return sameBits(t, name+" out", out, out2) && sameBits(t, name+" lse", lse, lse2)
		}
		return true
	})
}

// TestAttentionBackward compares dq, dk and dv with the CPU backend.
func TestAttentionBackward(t *testing.T) {
	eachAttnSeed(t, func(t *testing.T, c attnCase, seed uint64, in attnInputs, ref attnRef, name string) bool {
		got := runAttnBackward(t, c, in, ref, seed, seed)
		for p, part := range []string{"dq", "dk", "dv"} {
			want := dqkvPart(ref.dqkv, c, p)
			atol, rtol := bf16Tol(want)
			if !Compare(t, name+" "+part, dqkvPart(got, c, p), want, atol, rtol) {
				return false
			}
		}
		if seed == Seeds[0] {
			got2 := runAttnBackward(t, c, in, ref, seed+1, seed+100)
			return sameBits(t, name+" dqkv", got, got2)
		}
		return true
	})
}

// TestAttentionArgs: shapes and pointers the launchers must refuse.
func TestAttentionArgs(t *testing.T) {
	buf := func() *Buffer { return AllocAligned(t, 1<<16, 256) }
	ok := attnArgs{Out: buf(), Lse: buf(), Qkv: buf(), Dqkv: buf(), Dout: buf(), Scratch: buf(),
		B: 1, T: 4, NH: 2, KVH: 2, HS: 32}
	bad := map[string]func(a *attnArgs){
		"B=0":        func(a *attnArgs) { a.B = 0 },
		"T=0":        func(a *attnArgs) { a.T = 0 },
		"T<0":        func(a *attnArgs) { a.T = -3 },
		"NH%KVH":     func(a *attnArgs) { a.NH = 3 },
		"NH=0":       func(a *attnArgs) { a.NH = 0 },
		"KVH=0":      func(a *attnArgs) { a.KVH = 0 },
		"KVH>NH":     func(a *attnArgs) { a.KVH = 4 },
		"HS=0":       func(a *attnArgs) { a.HS = 0 },
		"HS=264":     func(a *attnArgs) { a.HS = 264 },
		"layout 2":   func(a *attnArgs) { a.Layout = 2 },
		"layout -1":  func(a *attnArgs) { a.Layout = -1 },
		"B*NH>65535": func(a *attnArgs) { a.B, a.NH, a.KVH, a.HS = 65536, 1, 1, 16 },
		"qkv nil":    func(a *attnArgs) { a.Qkv = nil },
		"out nil":    func(a *attnArgs) { a.Out = nil },
		"lse nil":    func(a *attnArgs) { a.Lse = nil },
	}
	for name, f := range bad {
		a := ok
		f(&a)
		if err := a.forward(); err == nil {
			t.Errorf("forward with %s: no error", name)
		}
		if err := a.backward(); err == nil {
			t.Errorf("backward with %s: no error", name)
		}
	}
	for name, f := range map[string]func(a *attnArgs){
		"dqkv nil":    func(a *attnArgs) { a.Dqkv = nil },
		"dout nil":    func(a *attnArgs) { a.Dout = nil },
		"scratch nil": func(a *attnArgs) { a.Scratch = nil },
	} {
		a := ok
		f(&a)
		if err := a.backward(); err == nil {
			t.Errorf("backward with %s: no error", name)
		}
	}
}
