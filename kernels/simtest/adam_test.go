//go:build lsp_sim || cuda

// Tests of kernels/adam.cu (lsp_adamw, lsp_non_finite_flag) under the
// simulator against the CPU backend's AdamW and NonFiniteFlag ops on the
// same inputs, for every seed of Seeds: every combination of param dtype
// (fp32, bf16), fp32 master (with, without) and grad dtype (fp32, bf16),
// with no clipping, a clip that scales and one that does not, over three
// successive steps (1, 2 and 1000, so the bias corrections differ; the
// second with a skip flag that is clear) from random non-zero moments, then
// a fourth with the flag set, NaN gradients and a NaN norm, which must
// leave every output bit as it was, on n = 1 and n = 1037. The flag
// itself on ragged lengths around the block size, with NaN, +Inf and -Inf
// at the first, a middle and the last position, and none.
//
// Tolerances: the kernel performs the CPU's fp32 operations in the CPU's
// order without contraction, and beta^step like Go's math.Pow, so where
// Go does not fuse float32 multiply-adds (amd64 below GOAMD64=v3, checked
// from the build info) every output must match bit for bit. Elsewhere Go
// may fuse, and fp32 outputs (m, v, master, fp32 param) must agree within
// atol 1e-30 + rtol 5e-7 (4 ulps), bf16 params within rtol 2^-7 (one bf16
// ulp, from a near-tie rounding the other way); the learning rate (1e-2)
// is far above that, so a missing update still fails.

package simtest

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// goFusesFloat reports whether this Go build may fuse x*y+z into an FMA.
func goFusesFloat() bool {
	if runtime.GOARCH != "amd64" {
		return true // arm64, ppc64, s390x, riscv64 fuse
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "GOAMD64" {
				return s.Value != "v1" && s.Value != "v2"
			}
		}
	}
	return false // the default, v1
}

type adamCase struct {
	paramBF16, master, gradBF16 bool
	clip                        string // "none", "scale" (norm above MaxNorm), "keep" (below)
	n                           int
}

func (c adamCase) String() string {
	dt := map[bool]string{false: "f32", true: "bf16"}
	s := fmt.Sprintf("param_%s_grad_%s_clip_%s_n%d", dt[c.paramBF16], dt[c.gradBF16], c.clip, c.n)
	if c.master {
		s += "_master"
	}
	return s
}

// adamArgs are the arguments of lsp_adamw (see kernels/adam.cu): Param
// (bf16 with ParamBF16, else fp32), optional fp32 Master (nil for none),
// Grad (bf16 with GradBF16), fp32 moments M and V, and SumSq (fp32 [1],
// read when MaxNorm > 0), all of N elements.
type adamArgs struct {
	Param, Master, Grad, M, V, SumSq *Buffer
	Skip                             *Buffer // the skip flag (fp32 [1]); nil: none
	ParamBF16, GradBF16              bool
	N                                int
	LR, Beta1, Beta2, Eps, WD        float32
	Step                             int
	MaxNorm                          float32
}

// launch runs lsp_adamw with a.
func (a adamArgs) launch() error {
	return kernels.AdamW(a.Param.Dev(), dtype(a.ParamBF16), a.Master.Dev(), a.Grad.Dev(), dtype(a.GradBF16), a.M.Dev(),
		a.V.Dev(), a.SumSq.Dev(), a.Skip.Dev(), int64(a.N), a.LR, a.Beta1, a.Beta2, a.Eps, a.WD, a.Step, a.MaxNorm, 0)
}

func TestAdamW(t *testing.T) {
	var cases []adamCase
	for _, pb := range []bool{false, true} {
		for _, ms := range []bool{false, true} {
			for _, gb := range []bool{false, true} {
				for _, clip := range []string{"none", "scale", "keep"} {
					for _, n := range []int{1, 1037} {
						cases = append(cases, adamCase{pb, ms, gb, clip, n})
					}
				}
			}
		}
	}
	exact := !goFusesFloat()
	for _, c := range cases {
		t.Run(c.String(), func(t *testing.T) {
			for _, seed := range Seeds {
				checkAdamW(t, c, seed, exact)
			}
		})
	}
}

func checkAdamW(t *testing.T, c adamCase, seed uint64, exact bool) {
	t.Helper()
	SetSeed(seed)
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	dtype := map[bool]backend.DType{false: backend.F32, true: backend.BF16}
	tensor := func(name string, dt backend.DType, vals []float32) backend.Tensor {
		x, err := be.Alloc(name, len(vals), dt)
		if err != nil {
			t.Fatal(err)
		}
		if err := backend.Upload(be, s, x, vals); err != nil {
			t.Fatal(err)
		}
		return x
	}
	// device puts vals in a simulator buffer of dtype bf16 or fp32.
	device := func(bf bool, vals []float32) *Buffer {
		if bf {
			return FromBF16(t, vals)
		}
		return FromFloat32(t, vals)
	}

	w0 := Rand(seed*11+1, c.n, 0.05)
	if c.paramBF16 && !c.master {
		w0 = RoundBF16(w0)
	}
	m0 := Rand(seed*11+2, c.n, 0.01)
	v0 := Rand(seed*11+3, c.n, 0.01)
	for i := range v0 {
		v0[i] *= v0[i]
	}
	param := tensor("param", dtype[c.paramBF16], w0)
	var master backend.Tensor
	dev := adamArgs{Param: device(c.paramBF16, w0), ParamBF16: c.paramBF16, GradBF16: c.gradBF16, N: c.n,
		M: FromFloat32(t, m0), V: FromFloat32(t, v0), SumSq: Alloc(t, 4),
		LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WD: 0.1}
	if c.master {
		master = tensor("master", backend.F32, w0)
		dev.Master = FromFloat32(t, w0)
	}
	mT, vT := tensor("m", backend.F32, m0), tensor("v", backend.F32, v0)
	sumSq := tensor("sumSq", backend.F32, []float32{0})
	skip := tensor("skip", backend.F32, []float32{0})

	for k, step := range []int{1, 2, 1000} {
		g := Rand(seed*11+4+uint64(k), c.n, 1)
		if c.gradBF16 {
			g = RoundBF16(g)
		}
		var ss float64
		for _, x := range g {
			ss += float64(x) * float64(x)
		}
		maxNorm := float32(0)
		switch c.clip {
		case "scale":
			maxNorm = float32(0.5 * math.Sqrt(ss))
		case "keep":
			maxNorm = float32(2 * math.Sqrt(ss))
		}
		grad := tensor("grad", dtype[c.gradBF16], g)
		if err := backend.Upload(be, s, sumSq, []float32{float32(ss)}); err != nil {
			t.Fatal(err)
		}
		p := backend.AdamParams{LR: dev.LR, Beta1: dev.Beta1, Beta2: dev.Beta2, Eps: dev.Eps,
			WeightDecay: dev.WD, Step: step, MaxNorm: maxNorm}
		// Step 2 passes a skip flag that is clear: it must update as
		// without one.
		var cSkip backend.Tensor
		dev.Skip = nil
		if k == 1 {
			cSkip, dev.Skip = skip, FromFloat32(t, []float32{0})
		}
		if err := be.AdamW(s, param, master, grad, mT, vT, sumSq, cSkip, p); err != nil {
			t.Fatal(err)
		}
		be.Free(grad)

		dev.Grad = device(c.gradBF16, g)
		dev.SumSq.Float32()[0] = float32(ss)
		dev.Step, dev.MaxNorm = step, maxNorm
		if err := dev.launch(); err != nil {
			t.Fatal(err)
		}

		name := fmt.Sprintf("seed %d step %d", seed, step)
		check := func(what string, got []float32, want backend.Tensor, bf bool) {
			t.Helper()
			w, err := backend.Download(be, s, want)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case exact:
				Compare(t, name+" "+what+" (bit-exact)", got, w, 0, 0)
			case bf:
				Compare(t, name+" "+what, got, w, 1e-30, 1.0/128)
			default:
				Compare(t, name+" "+what, got, w, 1e-30, 5e-7)
			}
		}
		gotParam := dev.Param.Float32
		if c.paramBF16 {
			gotParam = dev.Param.BF16
		}
		check("param", gotParam(), param, c.paramBF16)
		check("m", dev.M.Float32(), mT, false)
		check("v", dev.V.Float32(), vT, false)
		if c.master {
			check("master", dev.Master.Float32(), master, false)
		}
		if t.Failed() {
			return
		}
	}

	// A skipped step: NaN gradients and norm, the flag set. Every output
	// keeps its bits, on both faces.
	gotParam := dev.Param.Float32
	if c.paramBF16 {
		gotParam = dev.Param.BF16
	}
	outs := func() [][]float32 {
		o := [][]float32{gotParam(), dev.M.Float32(), dev.V.Float32()}
		if c.master {
			o = append(o, dev.Master.Float32())
		}
		return o
	}
	before := outs()
	g := Rand(seed*11+9, c.n, 1)
	g[c.n/2] = float32(math.NaN())
	dev.Grad, dev.Skip = device(c.gradBF16, g), FromFloat32(t, []float32{1})
	dev.SumSq.Float32()[0] = float32(math.NaN())
	dev.Step, dev.MaxNorm = 1001, 1
	if err := dev.launch(); err != nil {
		t.Fatal(err)
	}
	for i, got := range outs() {
		if !t.Failed() {
			Compare(t, fmt.Sprintf("seed %d skipped step, output %d", seed, i), got, before[i], 0, 0)
		}
	}
	grad := tensor("grad", dtype[c.gradBF16], g)
	if err := backend.Upload(be, s, skip, []float32{1}); err != nil {
		t.Fatal(err)
	}
	p := backend.AdamParams{LR: dev.LR, Beta1: dev.Beta1, Beta2: dev.Beta2, Eps: dev.Eps, WeightDecay: dev.WD, Step: 1001}
	if err := be.AdamW(s, param, master, grad, mT, vT, sumSq, skip, p); err != nil {
		t.Fatal(err)
	}
	cpuOuts := []backend.Tensor{param, mT, vT, master}
	for i, got := range before {
		w, err := backend.Download(be, s, cpuOuts[i])
		if err != nil {
			t.Fatal(err)
		}
		if !t.Failed() {
			Compare(t, fmt.Sprintf("seed %d skipped step, CPU output %d", seed, i), w, got, 0, 0)
		}
	}
}

// TestAdamNonFiniteFlag compares lsp_non_finite_flag with the CPU
// backend's NonFiniteFlag on lengths around the block of 1024 threads,
// with one non-finite value at the first, a middle or the last position
// (so every thread's part of the reduction is exercised as the culprit
// over the lengths), or none among large, tiny and signed-zero values. The
// flag starts at a stale value: it is written, not accumulated.
func TestAdamNonFiniteFlag(t *testing.T) {
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	cFlag, err := be.Alloc("flag", 1, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	cX, err := be.Alloc("x", 3000, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 2, 1023, 1024, 1025, 3000} {
		for _, bad := range []float32{0, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			positions := []int{-1}
			if bad != 0 && n > 0 {
				positions = []int{0, n / 2, n - 1}
			}
			for _, at := range positions {
				x := Rand(uint64(n)+7, n, 1)
				for i := range x {
					switch i % 5 {
					case 1:
						x[i] = math.MaxFloat32
					case 2:
						x[i] = -1e-45
					case 3:
						x[i] = float32(math.Copysign(0, -1))
					}
				}
				if at >= 0 {
					x[at] = bad
				}
				name := fmt.Sprintf("n %d, %v at %d", n, bad, at)
				flag := FromFloat32(t, []float32{7})
				xd := Alloc(t, 4*max(n, 1))
				copy(xd.Float32(), x)
				if err := kernels.NonFiniteFlag(flag.Dev(), xd.Dev(), int64(n), 0); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				xc := cX.Slice(0, n)
				if n > 0 {
					if err := backend.Upload(be, s, xc, x); err != nil {
						t.Fatal(err)
					}
				}
				if err := be.NonFiniteFlag(s, cFlag, xc); err != nil {
					t.Fatal(err)
				}
				want, err := backend.Download(be, s, cFlag)
				if err != nil {
					t.Fatal(err)
				}
				if got := flag.Float32()[0]; got != want[0] || (want[0] != 0) != (at >= 0) {
					t.Errorf("%s: flag %v, CPU %v", name, got, want[0])
				}
			}
		}
	}
	for _, tc := range []struct {
		name    string
		flag, x *Buffer
		n       int
	}{
		{"nil flag", nil, Alloc(t, 4), 1},
		{"negative n", Alloc(t, 4), Alloc(t, 4), -1},
		{"nil x", Alloc(t, 4), nil, 1},
	} {
		if err := kernels.NonFiniteFlag(tc.flag.Dev(), tc.x.Dev(), int64(tc.n), 0); !containsInvalidValue(err) {
			t.Errorf("%s: %v, want cudaErrorInvalidValue", tc.name, err)
		}
	}
}

// lsp_adamw rejects a bad step, a negative n and clipping without sumSq.
func TestAdamArgs(t *testing.T) {
	f := Alloc(t, 64)
	base := adamArgs{Param: f, Grad: f, M: f, V: f, N: 4, LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Step: 1}
	tests := []struct {
		name string
		mod  func(*adamArgs)
	}{
		{"step 0", func(a *adamArgs) { a.Step = 0 }},
		{"negative n", func(a *adamArgs) { a.N = -1 }},
		{"clip without sumSq", func(a *adamArgs) { a.MaxNorm = 1 }},
		{"nil moments", func(a *adamArgs) { a.V = nil }},
	}
	for _, tc := range tests {
		a := base
		tc.mod(&a)
		if err := a.launch(); !containsInvalidValue(err) {
			t.Errorf("%s: %v, want cudaErrorInvalidValue", tc.name, err)
		}
	}
	// A dtype flag that names no dtype is refused, not read as bf16.
	for _, flags := range [][2]kernels.DType{{2, kernels.F32}, {kernels.F32, 2}} {
		err := kernels.AdamW(f.Dev(), flags[0], 0, f.Dev(), flags[1], f.Dev(), f.Dev(), 0, 0, 4, 1e-3, 0.9, 0.999, 1e-8, 0, 1, 0, 0)
		if !containsInvalidValue(err) {
			t.Errorf("dtype flags (param %d, grad %d): %v, want cudaErrorInvalidValue", flags[0], flags[1], err)
		}
	}
	a := base
	a.N = 0
	if err := a.launch(); err != nil {
		t.Errorf("n = 0: %v, want nothing launched and no error", err)
	}
}
