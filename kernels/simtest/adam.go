//go:build lsp_sim || cuda

// Go face of kernels/adam.cu for the simulator tests: AdamW calls the
// launcher lsp_adamw on simulator buffers. It checks nothing itself; the
// launcher's own argument checks are part of what the tests exercise.

package simtest

/*
#include "kernels.h"

static int lsp_adamw_call(void* param, int param_bf16, void* master, void* grad, int grad_bf16, void* m, void* v,
		void* sum_sq, long long n, float lr, float beta1, float beta2, float eps, float wd, int step,
		float max_norm) {
	return (int)lsp_adamw(param, param_bf16, (float*)master, grad, grad_bf16, (float*)m, (float*)v,
		(const float*)sum_sq, n, lr, beta1, beta2, eps, wd, step, max_norm, (cudaStream_t)0);
}
*/
import "C"

// AdamWArgs are the arguments of lsp_adamw (see kernels/adam.cu): Param
// (bf16 with ParamBF16, else fp32), optional fp32 Master (nil for none),
// Grad (bf16 with GradBF16), fp32 moments M and V, and SumSq (fp32 [1],
// read when MaxNorm > 0), all of N elements.
type AdamWArgs struct {
	Param, Master, Grad, M, V, SumSq *Buffer
	ParamBF16, GradBF16              bool
	N                                int
	LR, Beta1, Beta2, Eps, WD        float32
	Step                             int
	MaxNorm                          float32
}

// AdamW runs lsp_adamw with a.
func AdamW(a AdamWArgs) error {
	code := C.lsp_adamw_call(ptrOf(a.Param), cbool(a.ParamBF16), ptrOf(a.Master), ptrOf(a.Grad), cbool(a.GradBF16),
		ptrOf(a.M), ptrOf(a.V), ptrOf(a.SumSq), C.longlong(a.N), C.float(a.LR), C.float(a.Beta1),
		C.float(a.Beta2), C.float(a.Eps), C.float(a.WD), C.int(a.Step), C.float(a.MaxNorm))
	return Check("lsp_adamw", int(code))
}
