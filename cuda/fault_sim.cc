//go:build cudasim

// fault_sim.cc: a kernel that fails on purpose, for the sticky-error test
// of the simulated build (testhooks.go): thread 0 returns while the others
// wait at a barrier, which the simulator reports as an error of the run
// (a GPU would hang), made sticky by the simulated runtime.
#include "../kernels/common.cuh"

__global__ void lspcu_fault_kernel(int unused) {
	(void)unused;
	if (threadIdx.x == 0) return;
	__syncthreads();
}

extern "C" cudaError_t lspcu_fault(cudaStream_t stream) {
	LSP_LAUNCH(lspcu_fault_kernel, 1, 64, 0, stream, 0);
	return cudaGetLastError();
}
