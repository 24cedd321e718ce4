//go:build cuda

package cuda

import "github.com/lsp-offload/lsp-offload/kernels"

// faultLaunch enqueues on s a fill of 1 MiB at a device address that is no
// allocation: the kernel faults (cudaErrorIllegalAddress), which poisons
// the process's context for good, so the test runs in a child process.
func faultLaunch(s kernels.Stream) error {
	return kernels.Fill(kernels.Ptr(1<<12), 1, 1<<18, kernels.F32, s)
}
