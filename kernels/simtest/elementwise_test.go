//go:build lsp_sim || cuda

// Tests of kernels/elementwise.cu under the simulator: Fill, Scale, Add,
// Accumulate, AddBias and BiasBackward against the CPU backend's ops of the
// same names (train/cpu/ops.go, whose arithmetic is the references of
// ref_elementwise.go) on tensors of the same dtypes holding the same
// values, bit for bit.
//
// Bit for bit means: every output's float32 pattern (bf16 outputs widened,
// which is exact) equals the CPU's, signed zeros, denormals and infinities
// included. The one allowance is that a NaN made by arithmetic matches any
// NaN, since a GPU returns the canonical NaN where x86 passes an operand's
// payload on; Fill does no arithmetic and is compared strictly, NaN bits
// included.
//
// Shapes: n = 1, 7, 1003, 1000003 and 8192*256 + 1007 (past the 8192-block
// grid cap, so the grid-stride loop takes a second lap; first dtype mix
// only); N x OC = 1x1, 17x33, 129x769, 6x130, 71x65, 64x1, 256x40,
// 3x5000 and 70001x3. For AddBias these are block layouts of 32 to 256
// columns, several column slabs (3x5000) and more row blocks than the
// grid's cap (70001x3: a second lap); for BiasBackward, 32-column blocks
// with a partial last one, 128-row tiles one partial (N < 128), two with a
// partial second (129), exactly full (256) and 547 (70001), and 0x5 (which
// still adds +0 to dbias, making -0 +0). Every dtype mix the CPU accepts runs: fp32 or bf16 for each tensor
// independently (8 mixes of Add, 4 of the two-tensor ops), plus in place:
// out = a, out = b, src = dst. Inputs are uniform random with special
// values spread once each through every input (signed zeros, infinities,
// NaNs, denormals, overflowing and bf16 rounding-tie values); a second
// input gets them rotated, so that pairs such as +Inf + -Inf, -0 + -0 and
// max + max meet. Outputs that are only written start as NaN (0xFF bytes),
// so an element left unwritten shows. The seeds of Seeds rotate each
// buffer's guard placement (aligned to 256, guard page after, guard page
// before), so a read or write one element outside any tensor crashes.
//
// The launchers' argument checks (negative sizes, NULL tensors, unknown
// dtype flags) are tested in TestElementwiseArgs, and so are the no-op
// sizes.

package simtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// ewBigSize takes the grid-stride loops past their first lap (8192 blocks
// of 256 threads).
const ewBigSize = 8192*256 + 1007

// ewSizes are the flat sizes; the last runs with the first dtype mix only,
// the 1000003 one with the first value of Fill and Scale only.
var ewSizes = []int{1, 7, 1003, 1000003, ewBigSize}

// ewSpecials are the values spread through every input.
var ewSpecials = func() []float32 {
	f := math.Float32frombits
	return []float32{
		0, float32(math.Copysign(0, -1)), float32(math.Copysign(0, -1)), float32(math.Inf(1)),
		float32(math.Inf(-1)), f(0x7fc01234), f(0x00000001), f(0x80400000), f(0x007fffff),
		math.MaxFloat32, math.MaxFloat32, f(0x7f7f8000), f(0x3f808000), f(0x3f818000), f(0xbf808000), 1e-38,
	}
}()

// ewInputs returns n values uniform in [-scale, scale) from seed, with the
// specials (rotated by rot) at the distinct positions k*n/len(specials), or
// the first n of them at 0..n-1 when fewer fit.
func ewInputs(seed uint64, n int, scale float32, rot int) []float32 {
	v := Rand(seed, n, scale)
	m := len(ewSpecials)
	for k := 0; k < m && k < n; k++ {
		pos := k
		if n >= m {
			pos = k * n / m
		}
		v[pos] = ewSpecials[(k+rot)%m]
	}
	return v
}

// ewAlloc returns a buffer for n elements of the dtype, placed by mode (0:
// 256-aligned, 1: guard page after, 2: guard page before), holding vals
// (rounded to nearest even when bf16) or, when vals is nil, 0xFF bytes.
func ewAlloc(t *testing.T, n int, vals []float32, bf16 bool, mode int) *Buffer {
	t.Helper()
	size := 4
	if bf16 {
		size = 2
	}
	var b *Buffer
	switch mode % 3 {
	case 0:
		b = AllocAligned(t, n*size, 256)
	case 1:
		b = Alloc(t, n*size)
	default:
		b = AllocBefore(t, n*size)
	}
	if vals != nil {
		if bf16 {
			b.SetBF16(vals)
		} else {
			copy(b.Float32(), vals)
		}
	}
	return b
}

// ewGet returns the buffer's n values widened to fp32 (exact).
func ewGet(b *Buffer, n int, bf16 bool) []float32 {
	if bf16 {
		return BF16Values(b.Uint16()[:n])
	}
	return append([]float32(nil), b.Float32()[:n]...)
}

// ewCPU allocates a CPU backend tensor holding vals (rounded when bf16).
func ewCPU(r *cpuRig, name string, vals []float32, bf16 bool) backend.Tensor {
	r.t.Helper()
	if len(vals) > 0 {
		return r.tensor(name, vals, bf16)
	}
	x, err := r.be.Alloc(name, 0, dtypeOf(bf16))
	if err != nil {
		r.t.Fatalf("cpu alloc %s: %v", name, err)
	}
	return x
}

// ewSame checks got against want bit for bit; with anyNaN a NaN matches
// any NaN. It reports the count of differences and the first one.
func ewSame(t *testing.T, name string, got, want []float32, anyNaN bool) bool {
	t.Helper()
	if !sameLen(t, name, len(got), len(want)) {
		return false
	}
	bad, first := countDiffs(len(got), func(i int) bool {
		g, w := got[i], want[i]
		return math.Float32bits(g) != math.Float32bits(w) && !(anyNaN && g != g && w != w)
	})
	if bad == 0 {
		return true
	}
	g, w := got[first], want[first]
	t.Errorf("%s: %d of %d values differ; first at index %d: got %g (0x%08x), want %g (0x%08x)", name, bad,
		len(got), first, g, math.Float32bits(g), w, math.Float32bits(w))
	failFast(t)
	return false
}

// ewMixes lists every dtype combination of k tensors (true: bf16), all
// bf16 first (the model's mix, the one the biggest size runs).
func ewMixes(k int) [][]bool {
	var out [][]bool
	for m := 0; m < 1<<k; m++ {
		mix := make([]bool, k)
		for i := range mix {
			mix[i] = m&(1<<i) == 0
		}
		out = append(out, mix)
	}
	return out
}

func ewMixName(names []string, mix []bool) string {
	s := ""
	for i, n := range names {
		if i > 0 {
			s += "_"
		}
		s += n + dtName(mix[i])
	}
	return s
}

func TestElementwiseFill(t *testing.T) {
	f := math.Float32frombits
	values := []float32{0.3, float32(math.Copysign(0, -1)), f(0x3f808000), f(0x3f818000), f(0x7f7f8000),
		f(0x00000003), f(0x7fc01234), f(0xff800001), float32(math.Inf(-1))}
	for _, n := range ewSizes {
		for k, tb := range []bool{true, false} {
			for vi, v := range values {
				if (n == ewBigSize && k > 0) || (n >= 1000003 && vi > 0) {
					continue
				}
				t.Run(fmt.Sprintf("n%d_%s_v%08x", n, dtName(tb), math.Float32bits(v)), func(t *testing.T) {
					rig := newCPURig(t)
					x := ewCPU(rig, "t", ewInputs(uint64(n), n, 1, 0), tb)
					rig.run("fill", rig.be.Fill(rig.s, x, v))
					want := rig.get(x)
					for i, seed := range Seeds {
						b := ewAlloc(t, n, ewInputs(uint64(n), n, 1, 0), tb, i)
						SetSeed(seed)
						mustLaunch(t, kernels.Fill(b.Dev(), v, int64(n), dtype(tb), 0))
						ewSame(t, "t", ewGet(b, n, tb), want, false)
					}
				})
			}
		}
	}
}

func TestElementwiseScale(t *testing.T) {
	scales := []float32{-2.5, 0.3, 0, 1e-30, 1}
	for _, n := range ewSizes {
		for k, tb := range []bool{true, false} {
			for ai, a := range scales {
				if (n == ewBigSize && k > 0) || (n >= 1000003 && ai > 0) {
					continue
				}
				t.Run(fmt.Sprintf("n%d_%s_a%g", n, dtName(tb), a), func(t *testing.T) {
					in := ewInputs(uint64(n)+1, n, 4, 0)
					rig := newCPURig(t)
					x := ewCPU(rig, "t", in, tb)
					rig.run("scale", rig.be.Scale(rig.s, x, a))
					want := rig.get(x)
					for i, seed := range Seeds {
						b := ewAlloc(t, n, in, tb, i)
						SetSeed(seed)
						mustLaunch(t, kernels.Scale(b.Dev(), a, int64(n), dtype(tb), 0))
						ewSame(t, "t", ewGet(b, n, tb), want, true)
					}
				})
			}
		}
	}
}

// eachEwMix runs body as a subtest for each size of ewSizes and each
// dtype mix of the tensors named (true: bf16; only the first mix, all
// bf16, at ewBigSize).
func eachEwMix(t *testing.T, names []string, body func(t *testing.T, n int, mix []bool)) {
	for _, n := range ewSizes {
		for k, mix := range ewMixes(len(names)) {
			if n == ewBigSize && k > 0 {
				continue
			}
			t.Run(fmt.Sprintf("n%d_%s", n, ewMixName(names, mix)), func(t *testing.T) { body(t, n, mix) })
		}
	}
}

func TestElementwiseAdd(t *testing.T) {
	eachEwMix(t, []string{"out", "a", "b"}, func(t *testing.T, n int, mix []bool) {
		ob, ab, bb := mix[0], mix[1], mix[2]
		av, bv := ewInputs(uint64(n)+2, n, 2, 0), ewInputs(uint64(n)+3, n, 2, 1)
		rig := newCPURig(t)
		out := ewCPU(rig, "out", make([]float32, n), ob)
		rig.run("add", rig.be.Add(rig.s, out, ewCPU(rig, "a", av, ab), ewCPU(rig, "b", bv, bb)))
		want := rig.get(out)
		for i, seed := range Seeds {
			o := ewAlloc(t, n, nil, ob, i)
			a, b := ewAlloc(t, n, av, ab, i+1), ewAlloc(t, n, bv, bb, i+2)
			SetSeed(seed)
			mustLaunch(t, kernels.Add(o.Dev(), a.Dev(), b.Dev(), int64(n), dtype(ob), dtype(ab), dtype(bb), 0))
			ewSame(t, "out", ewGet(o, n, ob), want, true)
			ewSame(t, "a (read only)", ewGet(a, n, ab), roundIf(av, ab), false)
			// In place, where out and the input share a dtype.
			if ob == ab {
				mustLaunch(t, kernels.Add(a.Dev(), a.Dev(), b.Dev(), int64(n), dtype(ab), dtype(ab), dtype(bb), 0))
				ewSame(t, "out = a", ewGet(a, n, ab), want, true)
			}
			if ob == bb {
				a2 := ewAlloc(t, n, av, ab, i+1)
				mustLaunch(t, kernels.Add(b.Dev(), a2.Dev(), b.Dev(), int64(n), dtype(bb), dtype(ab), dtype(bb), 0))
				ewSame(t, "out = b", ewGet(b, n, bb), want, true)
			}
		}
	})
}

func TestElementwiseAccumulate(t *testing.T) {
	eachEwMix(t, []string{"dst", "src"}, func(t *testing.T, n int, mix []bool) {
		db, sb := mix[0], mix[1]
		dv, sv := ewInputs(uint64(n)+4, n, 2, 0), ewInputs(uint64(n)+5, n, 2, 3)
		rig := newCPURig(t)
		dst := ewCPU(rig, "dst", dv, db)
		rig.run("accumulate", rig.be.Accumulate(rig.s, dst, ewCPU(rig, "src", sv, sb)))
		want := rig.get(dst)
		var wantSelf []float32
		if db == sb {
			self := ewCPU(rig, "self", dv, db)
			rig.run("accumulate self", rig.be.Accumulate(rig.s, self, ewCPU(rig, "self copy", dv, db)))
			wantSelf = rig.get(self)
		}
		for i, seed := range Seeds {
			d, s := ewAlloc(t, n, dv, db, i), ewAlloc(t, n, sv, sb, i+1)
			SetSeed(seed)
			mustLaunch(t, kernels.Accumulate(d.Dev(), s.Dev(), int64(n), dtype(db), dtype(sb), 0))
			ewSame(t, "dst", ewGet(d, n, db), want, true)
			if wantSelf != nil {
				d2 := ewAlloc(t, n, dv, db, i+2)
				mustLaunch(t, kernels.Accumulate(d2.Dev(), d2.Dev(), int64(n), dtype(db), dtype(db), 0))
				ewSame(t, "dst += dst", ewGet(d2, n, db), wantSelf, true)
			}
		}
	})
}

// ewBiasShapes are the N x OC cases of AddBias and BiasBackward.
var ewBiasShapes = [][2]int{{1, 1}, {17, 33}, {129, 769}, {6, 130}, {71, 65}, {64, 1}, {256, 40}, {3, 5000}, {70001, 3}}

func TestElementwiseAddBias(t *testing.T) {
	for _, sh := range ewBiasShapes {
		N, OC := sh[0], sh[1]
		for _, mix := range ewMixes(2) {
			ob, bb := mix[0], mix[1]
			t.Run(fmt.Sprintf("%dx%d_%s", N, OC, ewMixName([]string{"out", "bias"}, mix)), func(t *testing.T) {
				ov, bv := ewInputs(uint64(N*OC)+6, N*OC, 2, 0), ewInputs(uint64(OC)+7, OC, 1, 1)
				rig := newCPURig(t)
				out := ewCPU(rig, "out", ov, ob)
				rig.run("add bias", rig.be.AddBias(rig.s, out, ewCPU(rig, "bias", bv, bb), N, OC))
				want := rig.get(out)
				for i, seed := range Seeds {
					o, b := ewAlloc(t, N*OC, ov, ob, i), ewAlloc(t, OC, bv, bb, i+1)
					SetSeed(seed)
					mustLaunch(t, kernels.AddBias(o.Dev(), b.Dev(), N, OC, dtype(ob), dtype(bb), 0))
					ewSame(t, "out", ewGet(o, N*OC, ob), want, true)
				}
			})
		}
	}
}

func TestElementwiseBiasBackward(t *testing.T) {
	shapes := append([][2]int{{0, 5}}, ewBiasShapes...)
	for _, sh := range shapes {
		N, OC := sh[0], sh[1]
		for _, mix := range ewMixes(2) {
			db, gb := mix[0], mix[1]
			t.Run(fmt.Sprintf("%dx%d_%s", N, OC, ewMixName([]string{"dbias", "dout"}, mix)), func(t *testing.T) {
				// dbias starts with the specials too (-0 first, so the +0
				// that N = 0 adds shows).
				dv, gv := ewInputs(uint64(OC)+8, OC, 1, 1), ewInputs(uint64(N*OC)+9, N*OC, 1, 0)
				rig := newCPURig(t)
				dbias := ewCPU(rig, "dbias", dv, db)
				rig.run("bias backward", rig.be.BiasBackward(rig.s, dbias, ewCPU(rig, "dout", gv, gb), N, OC))
				want := rig.get(dbias)
				for i, seed := range Seeds {
					d := ewAlloc(t, OC, dv, db, i)
					var g *Buffer // NULL when N == 0, which the launcher allows
					if N > 0 {
						g = ewAlloc(t, N*OC, gv, gb, i+1)
					}
					SetSeed(seed)
					mustLaunch(t, kernels.BiasBackward(d.Dev(), g.Dev(), N, OC, dtype(db), dtype(gb), 0))
					ewSame(t, "dbias", ewGet(d, OC, db), want, true)
				}
			})
		}
	}
}

// TestElementwiseArgs checks each launcher's refusals (an error, and the
// tensors untouched) and its no-op sizes (accepted with NULL tensors).
func TestElementwiseArgs(t *testing.T) {
	vals := []float32{1, 2, 3, 4}
	x := ewAlloc(t, 4, vals, false, 1)
	y := ewAlloc(t, 4, vals, false, 2)
	bad := []struct {
		name string
		err  error
	}{
		{"fill n<0", kernels.Fill(x.Dev(), 1, -1, kernels.F32, 0)},
		{"fill nil t", kernels.Fill(0, 1, 4, kernels.F32, 0)},
		{"scale n<0", kernels.Scale(x.Dev(), 2, -1, kernels.F32, 0)},
		{"scale nil t", kernels.Scale(0, 2, 4, kernels.BF16, 0)},
		{"add n<0", kernels.Add(x.Dev(), x.Dev(), y.Dev(), -1, kernels.F32, kernels.F32, kernels.F32, 0)},
		{"add nil out", kernels.Add(0, x.Dev(), y.Dev(), 4, kernels.F32, kernels.F32, kernels.F32, 0)},
		{"add nil b", kernels.Add(x.Dev(), x.Dev(), 0, 4, kernels.F32, kernels.F32, kernels.F32, 0)},
		{"accumulate n<0", kernels.Accumulate(x.Dev(), y.Dev(), -1, kernels.F32, kernels.F32, 0)},
		{"accumulate nil src", kernels.Accumulate(x.Dev(), 0, 4, kernels.F32, kernels.F32, 0)},
		{"add bias N<0", kernels.AddBias(x.Dev(), y.Dev(), -1, 4, kernels.F32, kernels.F32, 0)},
		{"add bias OC<0", kernels.AddBias(x.Dev(), y.Dev(), 1, -4, kernels.F32, kernels.F32, 0)},
		{"add bias nil bias", kernels.AddBias(x.Dev(), 0, 1, 4, kernels.F32, kernels.F32, 0)},
		{"bias backward N<0", kernels.BiasBackward(x.Dev(), y.Dev(), -1, 4, kernels.F32, kernels.F32, 0)},
		{"bias backward OC<0", kernels.BiasBackward(x.Dev(), y.Dev(), 1, -4, kernels.F32, kernels.F32, 0)},
		{"bias backward nil dbias", kernels.BiasBackward(0, y.Dev(), 1, 4, kernels.F32, kernels.F32, 0)},
		{"bias backward nil dout", kernels.BiasBackward(x.Dev(), 0, 1, 4, kernels.F32, kernels.F32, 0)},
	}
	for i, err := range elementwiseBadDType(x, y, 4) {
		bad = append(bad, struct {
			name string
			err  error
		}{fmt.Sprintf("dtype flag 2 (launcher %d)", i), err})
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	ewSame(t, "x after refused calls", ewGet(x, 4, false), vals, false)
	ewSame(t, "y after refused calls", ewGet(y, 4, false), vals, false)

	noop := []struct {
		name string
		err  error
	}{
		{"fill n=0", kernels.Fill(0, 1, 0, kernels.BF16, 0)},
		{"scale n=0", kernels.Scale(0, 2, 0, kernels.F32, 0)},
		{"add n=0", kernels.Add(0, 0, 0, 0, kernels.BF16, kernels.F32, kernels.BF16, 0)},
		{"accumulate n=0", kernels.Accumulate(0, 0, 0, kernels.F32, kernels.BF16, 0)},
		{"add bias N=0", kernels.AddBias(0, 0, 0, 4, kernels.F32, kernels.F32, 0)},
		{"add bias OC=0", kernels.AddBias(0, 0, 4, 0, kernels.BF16, kernels.BF16, 0)},
		{"bias backward OC=0", kernels.BiasBackward(0, 0, 4, 0, kernels.F32, kernels.BF16, 0)},
	}
	for _, b := range noop {
		if b.err != nil {
			t.Errorf("%s must be a no-op: %v", b.name, b.err)
		}
	}
}

// elementwiseBadDType calls every launcher with the dtype flag 2 (no such
// dtype) in each flag position in turn, the others fp32, on the fp32
// buffers x and y of n elements (bias shapes 1 x n), and returns the
// errors, which should all be non-nil.
func elementwiseBadDType(x, y *Buffer, n int) []error {
	px, py, ln, f := x.Dev(), y.Dev(), int64(n), kernels.F32
	return []error{
		kernels.Fill(px, 1, ln, 2, 0),
		kernels.Scale(px, 2, ln, 2, 0),
		kernels.Add(px, px, py, ln, 2, f, f, 0),
		kernels.Add(px, px, py, ln, f, 2, f, 0),
		kernels.Add(px, px, py, ln, f, f, 2, 0),
		kernels.Accumulate(px, py, ln, 2, f, 0),
		kernels.Accumulate(px, py, ln, f, 2, 0),
		kernels.AddBias(px, py, 1, n, 2, f, 0),
		kernels.AddBias(px, py, 1, n, f, 2, 0),
		kernels.BiasBackward(px, py, 1, n, 2, f, 0),
		kernels.BiasBackward(px, py, 1, n, f, 2, 0),
	}
}
