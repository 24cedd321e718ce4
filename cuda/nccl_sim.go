//go:build cudasim

package cuda

/*
#include "sim_api.h"
*/
import "C"

// NCCLLibrary names the NCCL of this build: the simulated one, linked in
// (kernels/sim/nccl.cpp), which LoadNCCL binds without loading a library.
const NCCLLibrary = "simulated NCCL (kernels/sim/nccl.cpp, linked in; no libnccl.so.2)"

// ncclDetail is the simulated NCCL's message of its last failure in this
// process (which rank, peer and bytes, and why), for the error of a call
// that returned its code.
func ncclDetail() string { return C.GoString(C.lsp_sim_nccl_last_message()) }
