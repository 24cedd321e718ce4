//go:build lsp_sim || cuda

// Tests of kernels/dense.cu (the dense projectors' fp32 products) against
// the CPU references train/cpu.DenseGemm and cpu.DenseApply (a bf16 W)
// and the CPU backend's DenseApply op (an fp32 W), BIT FOR BIT: both sum
// each output over k ascending from +0 with every product rounded before
// its add, the kernel with __fmul_rn/__fadd_rn (never contracted, on a GPU
// too), Go with float32(a*b) (never fused); a bf16 W takes the same
// stochastic-rounding bits on both sides.
//
// Shapes: every (M, N, K) of {1, 7, 65, 130} x {1, 33, 129} x {1, 3, 64,
// 100}: M and N past one and two 64-wide tiles by 1-2 (ragged tiles), K
// past 16-wide slices (3: one partial slice; 100: six whole and a partial
// one). Each shape runs every transpose of A and B; the dtype mixes of A
// and B (gemm) and of W (apply) and beta 0 or not rotate over the shapes'
// cases, so that each meets every transpose and shape size; the smaller
// shapes (M*N*K <= 70000) also run every mix. beta 0 runs on a C full of
// NaN (which must not leak in); inputs are drawn unrounded for fp32 (a
// kernel that narrowed them to bf16 would differ). Buffers alternate
// between a guard page after their end and one before their start, so any
// out-of-bounds load or store crashes. The skip flag: clear, the result
// is the one without a flag; set, W keeps every bit. About a second under
// the simulator.

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

type denseCase struct {
	M, N, K        int
	transA, transB bool
}

func (c denseCase) String() string {
	return fmt.Sprintf("M%d_N%d_K%d_%s%s", c.M, c.N, c.K, trName(c.transA), trName(c.transB))
}

func trName(trans bool) string {
	if trans {
		return "T"
	}
	return "N"
}

// denseCases is every shape of the file comment in every transpose.
func denseCases() []denseCase {
	var cs []denseCase
	for _, M := range []int{1, 7, 65, 130} {
		for _, N := range []int{1, 33, 129} {
			for _, K := range []int{1, 3, 64, 100} {
				for tr := range 4 {
					cs = append(cs, denseCase{M, N, K, tr&1 != 0, tr&2 != 0})
				}
			}
		}
	}
	return cs
}

// denseMixes picks the mixes case i runs, out of n: all of them on a
// small shape, else one, rotating with i.
func denseMixes(c denseCase, i, n int) []int {
	if c.M*c.N*c.K <= 70000 {
		out := make([]int, n)
		for k := range out {
			out[k] = k
		}
		return out
	}
	return []int{i % n}
}

// denseIn allocates vals as a device buffer of the dtype with its guard
// page placed by mode.
func denseIn(t *testing.T, mode int, vals []float32, bf16 bool) FloatBuf {
	t.Helper()
	return NewFloatBuf(t, vals, bf16, mode%2 == 1)
}

func TestDenseGemm(t *testing.T) {
	const alpha = 0.625
	for i, c := range denseCases() {
		t.Run(c.String(), func(t *testing.T) {
			for _, mix := range denseMixes(c, i, 2*len(dtypeMixes)) {
				ab, bb := dtypeMixes[mix%len(dtypeMixes)][0], dtypeMixes[mix%len(dtypeMixes)][1]
				beta := float32(0)
				if mix >= len(dtypeMixes) {
					beta = -1.5
				}
				name := fmt.Sprintf("A %s B %s beta %v", dtName(ab), dtName(bb), beta)
				seed := Seeds[(i+mix)%len(Seeds)]
				SetSeed(seed)
				rng := rand.New(rand.NewPCG(seed, uint64(i)))
				a, b := randVals(rng, c.M*c.K, 1, ab), randVals(rng, c.K*c.N, 1, bb)
				var C FloatBuf
				want := make([]float32, c.M*c.N)
				if beta == 0 {
					C = outBuf(t, c.M*c.N, false, (i+mix)%2 == 1) // NaN: must not be read
					for k := range want {
						want[k] = float32(math.NaN())
					}
				} else {
					want = randVals(rng, c.M*c.N, 1, false)
					C = denseIn(t, i+mix, want, false)
				}
				A, B := denseIn(t, i+mix, a, ab), denseIn(t, i+mix+1, b, bb)
				mustLaunch(t, kernels.DenseGemm(c.transA, c.transB, c.M, c.N, c.K, alpha, A.Dev(), A.DT(), B.Dev(), B.DT(),
					beta, C.Dev(), 0))
				if err := cpu.DenseGemm(c.transA, c.transB, c.M, c.N, c.K, alpha, a, b, beta, want); err != nil {
					t.Fatal(err)
				}
				checkF32Bits(t, name, C.Values(), want)
			}
		})
	}
}

// denseApplyArgs are lsp_dense_apply's: W [M, N] <- Decay W + Alpha
// op(A) op(B), A and B fp32.
type denseApplyArgs struct {
	c                   denseCase
	W                   FloatBuf
	A, B, Skip          *Buffer // Skip: the skip flag (fp32 [1]); nil: none
	Alpha, Decay        float32
	Seed, Step          uint64
	Matrix              uint32
	aVals, bVals, wVals []float32
}

func (a denseApplyArgs) launch() error {
	return kernels.DenseApply(a.c.transA, a.c.transB, a.c.M, a.c.N, a.c.K, a.Alpha, a.A.Dev(), a.B.Dev(), a.Decay,
		a.W.Dev(), a.W.DT(), a.Skip.Dev(), a.Seed, a.Step, a.Matrix, 0)
}

// want is the CPU's W after the apply: cpu.DenseApply for a bf16 W, the
// CPU backend's op for an fp32 one.
func (a denseApplyArgs) want(cr *cpuRig) []float32 {
	c := a.c
	if a.W.BF16 {
		w := BF16Bits(a.wVals)
		if err := cpu.DenseApply(c.transA, c.transB, c.M, c.N, c.K, a.Alpha, a.aVals, a.bVals, a.Decay, w, a.Seed,
			a.Step, a.Matrix); err != nil {
			cr.t.Fatal(err)
		}
		return BF16Values(w)
	}
	W := cr.tensor("W", a.wVals, false)
	cr.run("DenseApply", cr.be.DenseApply(cr.s, c.transA, c.transB, c.M, c.N, c.K, a.Alpha, cr.tensor("A", a.aVals, false),
		cr.tensor("B", a.bVals, false), a.Decay, W, backend.Tensor{}, a.Seed, a.Step, a.Matrix))
	return cr.get(W)
}

func TestDenseApply(t *testing.T) {
	cr := newCPURig(t)
	for i, c := range denseCases() {
		t.Run(c.String(), func(t *testing.T) {
			for _, mix := range denseMixes(c, i, 2) {
				wb := mix == 0
				seed := Seeds[(i+mix)%len(Seeds)]
				SetSeed(seed)
				rng := rand.New(rand.NewPCG(seed, uint64(i)))
				args := denseApplyArgs{c: c, Alpha: -1e-2, Decay: 1 - 1e-3, Seed: seed, Step: 77, Matrix: 4,
					aVals: randVals(rng, c.M*c.K, 1, false), bVals: randVals(rng, c.K*c.N, 1, false),
					wVals: randVals(rng, c.M*c.N, 0.05, wb)}
				args.A, args.B = denseIn(t, i+mix, args.aVals, false).Buf, denseIn(t, i+mix+1, args.bVals, false).Buf
				args.W = denseIn(t, i+mix, args.wVals, wb)
				mustLaunch(t, args.launch())
				name := "W " + dtName(wb)
				want := args.want(cr)
				checkF32Bits(t, name, args.W.Values(), want)
				if c.K == 3 { // the skip flag, on a sample of the shapes
					checkDenseSkip(t, args, want)
				}
			}
		})
	}
}

// checkDenseSkip runs the apply of args again from its W with a clear
// skip flag (the result must be want) and with a set one (W must keep its
// bits).
func checkDenseSkip(t *testing.T, args denseApplyArgs, want []float32) {
	t.Helper()
	for _, flag := range []float32{0, 1} {
		args.W.Set(args.wVals)
		args.Skip = FromFloat32(t, []float32{flag})
		mustLaunch(t, args.launch())
		if flag == 0 {
			checkF32Bits(t, "clear flag: W", args.W.Values(), want)
		} else {
			checkF32Bits(t, "set flag: W", args.W.Values(), roundIf(args.wVals, args.W.BF16))
		}
	}
}

// The launchers reject sizes below 1, too many row tiles, null buffers
// and dtype flags other than 0 and 1 with cudaErrorInvalidValue.
func TestDenseArgs(t *testing.T) {
	p := Alloc(t, 64).Dev()
	gemm := func(M, N, K int, A, C kernels.Ptr, ab, bb kernels.DType) error {
		return kernels.DenseGemm(false, true, M, N, K, 1, A, ab, p, bb, 0, C, 0)
	}
	apply := func(M, N, K int, W kernels.Ptr, wb kernels.DType) error {
		return kernels.DenseApply(true, false, M, N, K, 1, p, p, 1, W, wb, 0, 1, 1, 0, 0)
	}
	tests := []struct {
		name string
		err  error
	}{
		{"gemm M 0", gemm(0, 2, 2, p, p, 0, 0)},
		{"gemm N 0", gemm(2, 0, 2, p, p, 0, 0)},
		{"gemm K 0", gemm(2, 2, 0, p, p, 0, 0)},
		{"gemm M too big", gemm(65535*64+1, 1, 1, p, p, 0, 0)},
		{"gemm nil A", gemm(2, 2, 2, 0, p, 0, 0)},
		{"gemm nil C", gemm(2, 2, 2, p, 0, 0, 0)},
		{"gemm a_bf16 2", gemm(2, 2, 2, p, p, 2, 0)},
		{"gemm b_bf16 -1", gemm(2, 2, 2, p, p, 0, -1)},
		{"apply K -1", apply(2, 2, -1, p, 0)},
		{"apply nil W", apply(2, 2, 2, 0, 1)},
		{"apply w_bf16 2", apply(2, 2, 2, p, 2)},
		{"apply M too big", apply(65535*64+1, 1, 1, p, 0)},
	}
	for _, tc := range tests {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if !containsInvalidValue(tc.err) {
			t.Errorf("%s: %v, want cudaErrorInvalidValue", tc.name, tc.err)
		}
	}
}
