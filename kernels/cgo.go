//go:build cuda || cudasim || lsp_sim

package kernels

/*
#cgo CFLAGS: -I${SRCDIR}
#include <stdlib.h>
#include <cuda_runtime_api.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

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

// The Go half of every face kernelgen writes (lspgo.h is the C half),
// exported so that faces generated for other packages (kernels/simtest)
// share it: a C type is its own cgo package's, so a face passes the
// fields of its lspgo_ret rather than the struct.

// ShimResult is the launcher's error from a generated shim's result: the
// CUDA error code and msg, the shim's malloc'd copy of the simulator's
// message (nil when there is none), which it frees.
func ShimResult(launcher string, code int, msg unsafe.Pointer) error {
	if code == 0 {
		return nil
	}
	detail := ""
	if msg != nil {
		detail = C.GoString((*C.char)(msg))
		C.free(msg)
	}
	return NewError(launcher, code, detail)
}

// ArgError is the error of an integer argument a launcher cannot take.
func ArgError(launcher, param string, v any, want string) error {
	return fmt.Errorf("%s: argument %s = %v %s", launcher, param, v, want)
}
