//go:build cuda || cudasim || lsp_sim

package kernels

/*
#cgo CFLAGS: -I${SRCDIR}
#include <cuda_runtime_api.h>
*/
import "C"

// NewError returns nil for cudaSuccess (code 0), else the *Error of
// launcher (or any CUDA call named op) with CUDA's name and description of
// code and, from a simulator, its message (detail). Faces generated for
// other packages (kernels/simtest) and the CUDA backend's own cgo calls
// make their errors with it.
func NewError(op string, code int, detail string) error {
	if code == 0 {
		return nil
	}
	e := C.cudaError_t(code)
	return &Error{Launcher: op, Code: code, Name: C.GoString(C.cudaGetErrorName(e)),
		Text: C.GoString(C.cudaGetErrorString(e)), Detail: detail}
}
