//go:build cudasim

package cuda

/*
#include <stdint.h>
#include <cuda_runtime_api.h>

cudaError_t lspcu_fault(cudaStream_t stream);

static int lspcu_fault_on(uintptr_t s) { return (int)lspcu_fault((cudaStream_t)s); }
*/
import "C"

import "github.com/lsp-offload/lsp-offload/kernels"

// faultLaunch enqueues the failing kernel of fault_sim.cc on s.
func faultLaunch(s kernels.Stream) error {
	return rtErr("lspcu_fault", C.lspcu_fault_on(C.uintptr_t(s)))
}
