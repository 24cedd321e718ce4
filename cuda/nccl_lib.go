//go:build cuda

package cuda

// NCCLLibrary is the shared library NewNCCL loads.
const NCCLLibrary = "libnccl.so.2"

// ncclDetail is "": NCCL's own details go to its log (NCCL_DEBUG=WARN),
// not to the caller.
func ncclDetail() string { return "" }
