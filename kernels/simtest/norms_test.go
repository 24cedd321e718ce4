//go:build lsp_sim || cuda

// Tests of kernels/norms.cu under the simulator: LayerNorm against the CPU
// backend's LayerNormForward/LayerNormBackward (train/cpu) on tensors of
// the same dtypes, RMSNorm against cpu.RMSNormForward/RMSNormBackward
// (train/cpu/ref_norms.go) on the same (bf16-rounded) values. This file
// also holds the helpers the tests of activations, rope, embedding and
// softmax_ce share (cpuRig, roundIf, sameBits).
//
// Shapes (N rows x C): 256 x 768 (GPT-2 small, realistic), 37 x 95 and
// 100 x 33 (ragged: not multiples of the 8-row blocks, the 32 lanes or the
// 128-column tiles; 2 and 4 partial row chunks), 1 x 1, 3 x 1007, and
// 16411 x 5 (the 512-chunk cap, chunks of 33 rows, the last ones empty).
// Every dtype mix of values x_bf16, activation gradients g_bf16 (dinp,
// dout) and parameter gradients dw_bf16 (dweight, dbias) runs. Inputs:
// x uniform in [-2, 2) plus a per-row offset in [-3, 3) (so the mean
// matters), weight in [-1.5, 1.5), bias in [-1, 1), dout in [-1, 1); the
// gradients start from random values (they are accumulated). eps is 1e-5,
// and 0.5 in one case so that a lost eps shows; the 16411-row case runs in
// the backwards only, with the models' dtype mixes only (bf16 values and
// activation gradients with either parameter gradient). Data are fixed per case;
// the simulator seed loops over Seeds, with the guard page after the
// buffers or before them, and the results must be bit-identical across
// seeds (deterministic reductions).
//
// Tolerances, |got - want| <= atol + rtol |want|:
//   - fp32 outputs: out atol 2e-5, rtol 1e-5; mean atol 1e-5, rstd rtol
//     1e-5; dinp atol 2e-5, rtol 1e-5; dweight, dbias atol 1e-5 + 4e-7 N
//     (fp32 column sums of N terms of size <= 4, in another order than the
//     CPU's), rtol 1e-5. The CPU sums rows in float64, the kernels in fp32:
//     a few ulps of the row's scale.
//   - bf16 outputs: the same atol, rtol 2^-7 + 1e-5: both sides round once
//     to bf16 and may land one ulp (2^-8..2^-7 relative) apart.
//
// A wrong term, a missing eps (0.5 case) or a lost row chunk is off by far
// more.

package simtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// cpuRig runs CPU backend ops on tensors of chosen dtypes.
type cpuRig struct {
	t  *testing.T
	be *cpu.Backend
	s  backend.Stream
}

func newCPURig(t *testing.T) *cpuRig {
	t.Helper()
	be := cpu.New(cpu.Config{})
	t.Cleanup(func() { _ = be.Close() })
	return &cpuRig{t: t, be: be, s: be.DefaultStream()}
}

func dtypeOf(bf16 bool) backend.DType {
	if bf16 {
		return backend.BF16
	}
	return backend.F32
}

// tensor allocates a tensor holding vals (rounded when bf16).
func (r *cpuRig) tensor(name string, vals []float32, bf16 bool) backend.Tensor {
	r.t.Helper()
	x, err := r.be.Alloc(name, len(vals), dtypeOf(bf16))
	if err != nil {
		r.t.Fatalf("cpu alloc %s: %v", name, err)
	}
	if err := backend.Upload(r.be, r.s, x, vals); err != nil {
		r.t.Fatalf("cpu upload %s: %v", name, err)
	}
	return x
}

func (r *cpuRig) ints(name string, vals []int32) backend.Tensor {
	r.t.Helper()
	x, err := r.be.Alloc(name, len(vals), backend.I32)
	if err != nil {
		r.t.Fatalf("cpu alloc %s: %v", name, err)
	}
	if err := backend.UploadInt32(r.be, r.s, x, vals); err != nil {
		r.t.Fatalf("cpu upload %s: %v", name, err)
	}
	return x
}

// run fails the test when an op returned an error.
func (r *cpuRig) run(op string, err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("cpu %s: %v", op, err)
	}
}

// get waits for the stream and returns x as fp32.
func (r *cpuRig) get(x backend.Tensor) []float32 {
	r.t.Helper()
	v, err := backend.Download(r.be, r.s, x)
	if err != nil {
		r.t.Fatalf("cpu download %v: %v", x, err)
	}
	return v
}

// roundIf returns vals rounded to bf16 when bf16 (what a bf16 buffer
// holds), else a copy.
func roundIf(vals []float32, bf16 bool) []float32 {
	if bf16 {
		return RoundBF16(vals)
	}
	return append([]float32(nil), vals...)
}

// sameBits fails unless got is bit-identical to first (the result of the
// first simulator seed), and reports whether it is.
func sameBits(t *testing.T, name string, got, first []float32) bool {
	t.Helper()
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
			t.Errorf("%s: not deterministic: index %d is %g under one simulator seed and %g under another", name, i,
				got[i], first[i])
			failFast(t)
			return false
		}
	}
	return true
}

// seedResults holds each output's result under the first simulator seed,
// against which every later seed's must be bit-identical.
type seedResults map[string][]float32

// check keeps got as name's first result, or checks it against that one.
func (r seedResults) check(t *testing.T, name string, got []float32) {
	t.Helper()
	if first, ok := r[name]; ok {
		sameBits(t, name, got, first)
	} else {
		r[name] = got
	}
}

// tolFor widens the fp32 relative tolerance by one bf16 ulp for bf16 outputs.
func tolFor(bf16 bool, rtol float64) float64 {
	if bf16 {
		return rtol + math.Ldexp(1, -7)
	}
	return rtol
}

func dtName(bf16 bool) string {
	if bf16 {
		return "bf16"
	}
	return "fp32"
}

// outBuf allocates n values of the dtype without writing them: they are
// NaN (0xFF bytes), so an output a kernel forgets to write shows.
func outBuf(t *testing.T, n int, bf16, guardBefore bool) FloatBuf {
	t.Helper()
	size := 4
	if bf16 {
		size = 2
	}
	if guardBefore {
		return FloatBuf{Buf: AllocBefore(t, size*n), BF16: bf16}
	}
	return FloatBuf{Buf: Alloc(t, size*n), BF16: bf16}
}

// scratchBytes returns a function that fails the test when a scratch size
// helper returned an error, and returns its size otherwise.
func scratchBytes(t *testing.T) func(int, error) int {
	return func(n int, err error) int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// mustLaunch fails the test when a launcher returned an error.
func mustLaunch(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type normCase struct {
	N, C int
	eps  float32
	big  bool // only in the backwards, whose row chunks it is for
}

var normCases = []normCase{
	{N: 256, C: 768, eps: 1e-5}, // GPT-2 small
	{N: 37, C: 95, eps: 1e-5},
	{N: 100, C: 33, eps: 0.5},
	{N: 1, C: 1, eps: 1e-5},
	{N: 3, C: 1007, eps: 1e-5},
	{N: 16411, C: 5, eps: 1e-5, big: true},
}

// dtypeMixes are (x_bf16, g_bf16) pairs of values and activation
// gradients (the activation and sparse tests use them too); the first is
// a bf16 model's, which keeps its activation gradients in bf16.
var dtypeMixes = [][2]bool{{true, true}, {true, false}, {false, false}, {false, true}}

// normMix is the dtypes of a norm backward's values (x_bf16), activation
// gradients (g_bf16) and parameter gradients (dw_bf16).
type normMix struct{ x, g, dw bool }

func (m normMix) String() string {
	return fmt.Sprintf("x%s_g%s_dw%s", dtName(m.x), dtName(m.g), dtName(m.dw))
}

// normMixes are every mix of the three; the first two are a bf16 model's
// (--grad-dtype fp32 or bf16), the next two an fp32 model's.
var normMixes = []normMix{
	{true, true, false}, {true, true, true}, {false, false, false}, {false, false, true},
	{true, false, false}, {true, false, true}, {false, true, false}, {false, true, true},
}

// normInputs are the values both sides see, before any bf16 rounding.
type normInputs struct {
	x, w, b, dout, dx0, dw0, db0 []float32
}

func newNormInputs(c normCase, seed uint64) normInputs {
	x := Rand(seed, c.N*c.C, 2)
	off := Rand(seed+1, c.N, 3)
	for r := range c.N {
		for i := range c.C {
			x[r*c.C+i] += off[r]
		}
	}
	return normInputs{
		x: x, w: Rand(seed+2, c.C, 1.5), b: Rand(seed+3, c.C, 1), dout: Rand(seed+4, c.N*c.C, 1),
		dx0: Rand(seed+5, c.N*c.C, 1), dw0: Rand(seed+6, c.C, 1), db0: Rand(seed+7, c.C, 1),
	}
}

func (c normCase) String() string { return fmt.Sprintf("N%d_C%d", c.N, c.C) }

// paramAtol is the absolute tolerance of column sums over N rows.
func paramAtol(N int) float64 { return 1e-5 + 4e-7*float64(N) }

// eachForwardCase runs f as a subtest for every shape but the big one, with
// fp32 and bf16 values.
func eachForwardCase(t *testing.T, f func(t *testing.T, c normCase, xb bool)) {
	for _, c := range normCases {
		if c.big {
			continue
		}
		for _, xb := range []bool{true, false} {
			t.Run(c.String()+"_"+dtName(xb), func(t *testing.T) { f(t, c, xb) })
		}
	}
}

// eachBackwardCase runs f as a subtest for every shape and dtype mix; the
// big shape only with a bf16 model's two mixes.
func eachBackwardCase(t *testing.T, f func(t *testing.T, c normCase, m normMix)) {
	for _, c := range normCases {
		for k, mix := range normMixes {
			if c.big && k > 1 {
				continue
			}
			t.Run(fmt.Sprintf("%v_%v", c, mix), func(t *testing.T) { f(t, c, mix) })
		}
	}
}

func TestNormsLayerNormForward(t *testing.T) {
	eachForwardCase(t, func(t *testing.T, c normCase, xb bool) {
		in := newNormInputs(c, uint64(c.N*7+c.C))
		rig := newCPURig(t)
		out, mean, rstd := rig.tensor("out", make([]float32, c.N*c.C), xb),
			rig.tensor("mean", make([]float32, c.N), false), rig.tensor("rstd", make([]float32, c.N), false)
		rig.run("layernorm forward", rig.be.LayerNormForward(rig.s, out, mean, rstd, rig.tensor("x", in.x, xb),
			rig.tensor("w", in.w, xb), rig.tensor("b", in.b, xb), c.N, c.C, c.eps))
		wantOut, wantMean, wantRstd := rig.get(out), rig.get(mean), rig.get(rstd)

		first := seedResults{}
		for i, seed := range Seeds {
			before := i%2 == 1
			o := NewFloatBuf(t, make([]float32, c.N*c.C), xb, before)
			m, r := Alloc(t, 4*c.N), AllocBefore(t, 4*c.N)
			SetSeed(seed)
			mustLaunch(t, kernels.LayerNormForward(o.Dev(), m.Dev(), r.Dev(), NewFloatBuf(t, in.x, xb, before).Dev(),
				NewFloatBuf(t, in.w, xb, before).Dev(), NewFloatBuf(t, in.b, xb, !before).Dev(), c.N, c.C, c.eps, dtype(xb), 0))
			got := o.Values()
			Compare(t, "out", got, wantOut, 2e-5, tolFor(xb, 1e-5))
			Compare(t, "mean", m.Float32(), wantMean, 1e-5, 1e-6)
			Compare(t, "rstd", r.Float32(), wantRstd, 0, 1e-5)
			first.check(t, "out", got)
		}
	})
}

func TestNormsLayerNormBackward(t *testing.T) {
	eachBackwardCase(t, func(t *testing.T, c normCase, mix normMix) {
		xb, gb, wb := mix.x, mix.g, mix.dw
		in := newNormInputs(c, uint64(c.N*5+c.C))
		rig := newCPURig(t)
		x, w := rig.tensor("x", in.x, xb), rig.tensor("w", in.w, xb)
		mean, rstd := rig.tensor("mean", make([]float32, c.N), false), rig.tensor("rstd", make([]float32, c.N), false)
		rig.run("layernorm forward", rig.be.LayerNormForward(rig.s, rig.tensor("out", make([]float32, c.N*c.C), xb),
			mean, rstd, x, w, rig.tensor("b", in.b, xb), c.N, c.C, c.eps))
		dx, dw, db := rig.tensor("dx", in.dx0, gb), rig.tensor("dw", in.dw0, wb), rig.tensor("db", in.db0, wb)
		// The Go size of the scratch (what callers allocate) is the launcher's.
		if got, want := 4*backend.LayerNormBackwardScratch(c.N, c.C), scratchBytes(t)(kernels.LayerNormBackwardScratchBytes(c.N, c.C)); got != want {
			t.Fatalf("backend.LayerNormBackwardScratch(%d, %d) is %d bytes, the launcher needs %d", c.N, c.C, got, want)
		}
		rig.run("layernorm backward", rig.be.LayerNormBackward(rig.s, dx, dw, db, rig.tensor("dout", in.dout, gb),
			x, w, mean, rstd, rig.tensor("scratch", make([]float32, backend.LayerNormBackwardScratch(c.N, c.C)), false), c.N, c.C))
		meanV, rstdV := rig.get(mean), rig.get(rstd)
		wantDx, wantDw, wantDb := rig.get(dx), rig.get(dw), rig.get(db)

		first := seedResults{}
		for i, seed := range Seeds {
			before := i%2 == 1
			gdx, gdw, gdb := NewFloatBuf(t, in.dx0, gb, before), NewFloatBuf(t, in.dw0, wb, !before),
				NewFloatBuf(t, in.db0, wb, before)
			scratch := Alloc(t, 4*backend.LayerNormBackwardScratch(c.N, c.C))
			SetSeed(seed)
			mustLaunch(t, kernels.LayerNormBackward(gdx.Dev(), gdw.Dev(), gdb.Dev(), NewFloatBuf(t, in.dout, gb, before).Dev(),
				NewFloatBuf(t, in.x, xb, !before).Dev(), NewFloatBuf(t, in.w, xb, before).Dev(),
				FromFloat32(t, meanV).Dev(), FromFloat32(t, rstdV).Dev(), scratch.Dev(), c.N, c.C, dtype(xb), dtype(gb), dtype(wb), 0))
			dxV, dwV, dbV := gdx.Values(), gdw.Values(), gdb.Values()
			Compare(t, "dinp", dxV, wantDx, 2e-5, tolFor(gb, 1e-5))
			Compare(t, "dweight", dwV, wantDw, paramAtol(c.N), tolFor(wb, 1e-5))
			Compare(t, "dbias", dbV, wantDb, paramAtol(c.N), tolFor(wb, 1e-5))
			first.check(t, "dinp", dxV)
			first.check(t, "dweight", dwV)
			first.check(t, "dbias", dbV)
		}
	})
}

func TestNormsRMSNormForward(t *testing.T) {
	eachForwardCase(t, func(t *testing.T, c normCase, xb bool) {
		in := newNormInputs(c, uint64(c.N*3+c.C))
		x, w := roundIf(in.x, xb), roundIf(in.w, xb)
		wantOut, wantRstd := make([]float32, c.N*c.C), make([]float32, c.N)
		cpu.RMSNormForward(wantOut, wantRstd, x, w, c.N, c.C, c.eps)

		first := seedResults{}
		for i, seed := range Seeds {
			before := i%2 == 1
			o := NewFloatBuf(t, make([]float32, c.N*c.C), xb, !before)
			r := Alloc(t, 4*c.N)
			SetSeed(seed)
			mustLaunch(t, kernels.RMSNormForward(o.Dev(), r.Dev(), NewFloatBuf(t, x, xb, before).Dev(),
				NewFloatBuf(t, w, xb, before).Dev(), c.N, c.C, c.eps, dtype(xb), 0))
			got := o.Values()
			Compare(t, "out", got, wantOut, 2e-5, tolFor(xb, 1e-5))
			Compare(t, "rstd", r.Float32(), wantRstd, 0, 1e-5)
			first.check(t, "out", got)
		}
	})
}

func TestNormsRMSNormBackward(t *testing.T) {
	eachBackwardCase(t, func(t *testing.T, c normCase, mix normMix) {
		xb, gb, wb := mix.x, mix.g, mix.dw
		in := newNormInputs(c, uint64(c.N*9+c.C))
		x, w := roundIf(in.x, xb), roundIf(in.w, xb)
		dout, dx0, dw0 := roundIf(in.dout, gb), roundIf(in.dx0, gb), roundIf(in.dw0, wb)
		rstd := make([]float32, c.N)
		cpu.RMSNormForward(make([]float32, c.N*c.C), rstd, x, w, c.N, c.C, c.eps)
		wantDx, wantDw := append([]float32(nil), dx0...), append([]float32(nil), dw0...)
		cpu.RMSNormBackward(wantDx, wantDw, dout, x, w, rstd, c.N, c.C)

		first := seedResults{}
		for i, seed := range Seeds {
			before := i%2 == 1
			gdx, gdw := NewFloatBuf(t, dx0, gb, before), NewFloatBuf(t, dw0, wb, !before)
			scratch := AllocBefore(t, scratchBytes(t)(kernels.RMSNormBackwardScratchBytes(c.N, c.C)))
			SetSeed(seed)
			mustLaunch(t, kernels.RMSNormBackward(gdx.Dev(), gdw.Dev(), NewFloatBuf(t, dout, gb, before).Dev(),
				NewFloatBuf(t, x, xb, before).Dev(), NewFloatBuf(t, w, xb, !before).Dev(), FromFloat32(t, rstd).Dev(),
				scratch.Dev(), c.N, c.C, dtype(xb), dtype(gb), dtype(wb), 0))
			dxV, dwV := gdx.Values(), gdw.Values()
			Compare(t, "dinp", dxV, roundIf(wantDx, gb), 2e-5, tolFor(gb, 1e-5))
			Compare(t, "dweight", dwV, roundIf(wantDw, wb), paramAtol(c.N), tolFor(wb, 1e-5))
			first.check(t, "dinp", dxV)
			first.check(t, "dweight", dwV)
		}
	})
}

// TestNormsArgs checks the launchers' argument checks and the scratch sizes.
func TestNormsArgs(t *testing.T) {
	f := NewFloatBuf(t, make([]float32, 8), false, false).Dev()
	s := Alloc(t, 64).Dev()
	if got, want := scratchBytes(t)(kernels.LayerNormBackwardScratchBytes(100, 33)), 2*4*33*4; got != want {
		t.Errorf("layernorm scratch for N=100, C=33: %d bytes, want %d (4 chunks)", got, want)
	}
	if got, want := scratchBytes(t)(kernels.RMSNormBackwardScratchBytes(1<<20, 3)), 512*3*4; got != want {
		t.Errorf("rmsnorm scratch for N=2^20, C=3: %d bytes, want %d (512 chunks)", got, want)
	}
	if got := scratchBytes(t)(kernels.LayerNormBackwardScratchBytes(0, 5)); got != 0 {
		t.Errorf("scratch for N=0: %d bytes, want 0", got)
	}
	if _, err := kernels.RMSNormBackwardScratchBytes(1<<31, 5); err == nil {
		t.Errorf("scratch for N=2^31 (not a C int): no error")
	}
	bad := []struct {
		name string
		err  error
	}{
		{"C=0", kernels.LayerNormForward(f, s, s, f, f, f, 1, 0, 1e-5, kernels.F32, 0)},
		{"N<0", kernels.RMSNormForward(f, s, f, f, -1, 4, 1e-5, kernels.F32, 0)},
		{"nil weight", kernels.LayerNormForward(f, s, s, f, 0, f, 2, 4, 1e-5, kernels.F32, 0)},
		{"nil scratch", kernels.RMSNormBackward(f, f, f, f, f, s, 0, 2, 4, kernels.F32, kernels.F32, kernels.F32, 0)},
		{"nil dbias", kernels.LayerNormBackward(f, f, 0, f, f, f, s, s, s, 2, 4, kernels.F32, kernels.F32, kernels.F32, 0)},
		{"bad value dtype", kernels.RMSNormForward(f, s, f, f, 2, 4, 1e-5, 2, 0)},
		{"bad gradient dtype", kernels.LayerNormBackward(f, f, f, f, f, f, s, s, s, 2, 4, kernels.F32, -1, kernels.F32, 0)},
		{"bad parameter-gradient dtype", kernels.LayerNormBackward(f, f, f, f, f, f, s, s, s, 2, 4, kernels.F32, kernels.F32, 2, 0)},
		{"bad rmsnorm parameter-gradient dtype", kernels.RMSNormBackward(f, f, f, f, f, s, s, 2, 4, kernels.BF16, kernels.BF16, -1, 0)},
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	if err := kernels.LayerNormForward(0, 0, 0, 0, 0, 0, 0, 4, 1e-5, kernels.F32, 0); err != nil {
		t.Errorf("N=0 must be a no-op: %v", err)
	}
}
