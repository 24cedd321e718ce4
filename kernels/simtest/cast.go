//go:build lsp_sim || cuda

// Go face of kernels/cast.cu for the simulator tests: wrappers of the cast,
// stochastic rounding and sum-of-squares launchers on simulator buffers.
// They check nothing themselves; the launchers' own argument checks are
// part of what the tests exercise.

package simtest

/*
#include "kernels.h"

static int lsp_cast_f32_to_bf16_call(void* out, void* in, long long n) {
	return (int)lsp_cast_f32_to_bf16((__nv_bfloat16*)out, (const float*)in, n, (cudaStream_t)0);
}
static int lsp_cast_bf16_to_f32_call(void* out, void* in, long long n) {
	return (int)lsp_cast_bf16_to_f32((float*)out, (const __nv_bfloat16*)in, n, (cudaStream_t)0);
}
static int lsp_stochastic_round_bf16_call(void* out, void* in, long long n, unsigned long long seed,
		unsigned long long step, unsigned int matrix) {
	return (int)lsp_stochastic_round_bf16((__nv_bfloat16*)out, (const float*)in, n, seed, step, matrix,
		(cudaStream_t)0);
}
static int lsp_sum_squares_call(void* out, void* x, int x_bf16, long long n, void* work) {
	return (int)lsp_sum_squares((float*)out, x, x_bf16, n, (double*)work, (cudaStream_t)0);
}
*/
import "C"

// SumSquaresWork is the size in doubles of lsp_sum_squares's scratch.
const SumSquaresWork = C.LSP_SUM_SQUARES_WORK

// CastF32ToBF16 runs lsp_cast_f32_to_bf16 on n elements.
func CastF32ToBF16(out, in *Buffer, n int) error {
	return Check("lsp_cast_f32_to_bf16", int(C.lsp_cast_f32_to_bf16_call(ptrOf(out), ptrOf(in), C.longlong(n))))
}

// CastBF16ToF32 runs lsp_cast_bf16_to_f32 on n elements.
func CastBF16ToF32(out, in *Buffer, n int) error {
	return Check("lsp_cast_bf16_to_f32", int(C.lsp_cast_bf16_to_f32_call(ptrOf(out), ptrOf(in), C.longlong(n))))
}

// StochasticRoundBF16 runs lsp_stochastic_round_bf16 on n elements.
func StochasticRoundBF16(out, in *Buffer, n int, seed, step uint64, matrix uint32) error {
	code := C.lsp_stochastic_round_bf16_call(ptrOf(out), ptrOf(in), C.longlong(n), C.ulonglong(seed),
		C.ulonglong(step), C.uint(matrix))
	return Check("lsp_stochastic_round_bf16", int(code))
}

// SumSquares runs lsp_sum_squares: out[0] = sum of x^2 over n elements
// (x bf16 when xBF16); work holds SumSquaresWork doubles.
func SumSquares(out, x *Buffer, xBF16 bool, n int, work *Buffer) error {
	code := C.lsp_sum_squares_call(ptrOf(out), ptrOf(x), cbool(xBF16), C.longlong(n), ptrOf(work))
	return Check("lsp_sum_squares", int(code))
}
