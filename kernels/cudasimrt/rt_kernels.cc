//go:build cudasim

/*
 * rt_kernels.cc: small kernels for the tests of the simulated CUDA runtime,
 * written as the kernels of kernels/ are (common.cuh, LSP_LAUNCH) and compiled under
 * the simulator only: they are not part of libkernels.a.
 *
 *   rt_fill    out[i] = v + i                      n elements
 *   rt_axpb    x[i] = x[i] * a + b                 n elements
 *   rt_spin    one thread polls *flag until it is nonzero (written by a
 *              copy on another stream) or timeout_ms pass; *seen = the
 *              flag's value then. It holds the runtime's execution lock
 *              while it polls: only copies, memsets and host functions
 *              can run meanwhile.
 *   rt_diverge odd threads of the block return before a __syncthreads:
 *              the simulator reports a launch failure while it runs.
 *   rt_bad_block launches rt_fill with 2048 threads a block: refused by
 *              the launch check before anything is queued.
 */
#include "common.cuh"

#include <chrono>
#include <thread>

namespace {

constexpr int kThreads = 128;

__global__ void rt_fill_kernel(float* out, int n, float v) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) out[i] = v + float(i);
}

__global__ void rt_axpb_kernel(float* x, int n, float a, float b) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] = x[i] * a + b;
}

__global__ void rt_spin_kernel(const int* flag, int* seen, int timeout_ms) {
	auto t0 = std::chrono::steady_clock::now();
	int v = 0;
	while ((v = __atomic_load_n(flag, __ATOMIC_ACQUIRE)) == 0 &&
	       std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(timeout_ms))
		std::this_thread::sleep_for(std::chrono::microseconds(200));
	*seen = v;
}

__global__ void rt_diverge_kernel(float* out) {
	if (threadIdx.x % 2) return;
	__syncthreads();
	out[threadIdx.x] = 1.0f;
}

}  // namespace

extern "C" {

cudaError_t rt_fill(float* out, int n, float v, cudaStream_t stream) {
	if (n <= 0 || out == nullptr) return cudaErrorInvalidValue;
	LSP_LAUNCH(rt_fill_kernel, dim3((n + kThreads - 1) / kThreads), dim3(kThreads), 0, stream, out, n, v);
	return cudaGetLastError();
}

cudaError_t rt_axpb(float* x, int n, float a, float b, cudaStream_t stream) {
	if (n <= 0 || x == nullptr) return cudaErrorInvalidValue;
	LSP_LAUNCH(rt_axpb_kernel, dim3((n + kThreads - 1) / kThreads), dim3(kThreads), 0, stream, x, n, a, b);
	return cudaGetLastError();
}

cudaError_t rt_spin(const int* flag, int* seen, int timeout_ms, cudaStream_t stream) {
	LSP_LAUNCH(rt_spin_kernel, dim3(1), dim3(1), 0, stream, flag, seen, timeout_ms);
	return cudaGetLastError();
}

cudaError_t rt_diverge(float* out, cudaStream_t stream) {
	LSP_LAUNCH(rt_diverge_kernel, dim3(1), dim3(64), 0, stream, out);
	return cudaGetLastError();
}

cudaError_t rt_bad_block(float* out, cudaStream_t stream) {
	LSP_LAUNCH(rt_fill_kernel, dim3(1), dim3(2048), 0, stream, out, 1, 0.0f);
	return cudaGetLastError();
}

const void* rt_fill_kernel_ptr(void) { return reinterpret_cast<const void*>(&rt_fill_kernel); }

}  // extern "C"
