//go:build lsp_sim

// Go face of kernels/adam.cu for the simulator tests: AdamW and
// NonFiniteFlag call the launchers lsp_adamw and lsp_non_finite_flag on
// simulator buffers. They check nothing themselves; the launchers' own
// argument checks are part of what the tests exercise.

package simtest

/*
#include "kernels.h"

static int lsp_adamw_call(void* param, int param_bf16, void* master, void* grad, int grad_bf16, void* m, void* v,
		void* sum_sq, void* skip, long long n, float lr, float beta1, float beta2, float eps, float wd, int step,
		float max_norm) {
	return (int)lsp_adamw(param, param_bf16, (float*)master, grad, grad_bf16, (float*)m, (float*)v,
		(const float*)sum_sq, (const float*)skip, n, lr, beta1, beta2, eps, wd, step, max_norm, (cudaStream_t)0);
}

static int lsp_non_finite_flag_call(void* flag, void* x, long long n) {
	return (int)lsp_non_finite_flag((float*)flag, (const float*)x, n, (cudaStream_t)0);
}
*/
import "C"

// AdamWArgs are the arguments of lsp_adamw (see kernels/adam.cu): Param
// (bf16 with ParamBF16, else fp32), optional fp32 Master (nil for none),
// Grad (bf16 with GradBF16), fp32 moments M and V, SumSq (fp32 [1], read
// when MaxNorm > 0), all of N elements, and the optional skip flag Skip
// (fp32 [1], nil for none).
type AdamWArgs struct {
	Param, Master, Grad, M, V, SumSq, Skip *Buffer
	ParamBF16, GradBF16                    bool
	N                                      int
	LR, Beta1, Beta2, Eps, WD              float32
	Step                                   int
	MaxNorm                                float32
}

// AdamW runs lsp_adamw with a.
func AdamW(a AdamWArgs) error {
	code := C.lsp_adamw_call(ptrOf(a.Param), cbool(a.ParamBF16), ptrOf(a.Master), ptrOf(a.Grad), cbool(a.GradBF16),
		ptrOf(a.M), ptrOf(a.V), ptrOf(a.SumSq), ptrOf(a.Skip), C.longlong(a.N), C.float(a.LR), C.float(a.Beta1),
		C.float(a.Beta2), C.float(a.Eps), C.float(a.WD), C.int(a.Step), C.float(a.MaxNorm))
	return Check("lsp_adamw", int(code))
}

// NonFiniteFlag runs lsp_non_finite_flag: Flag[0] (fp32) = 1 when some of
// the N fp32 values of X is NaN or infinite, else 0.
func NonFiniteFlag(flag, x *Buffer, n int) error {
	return Check("lsp_non_finite_flag", int(C.lsp_non_finite_flag_call(ptrOf(flag), ptrOf(x), C.longlong(n))))
}
