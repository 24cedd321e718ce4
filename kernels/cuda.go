//go:build cuda

package kernels

// The real build: the kernels come from build/libkernels.a (`make
// kernels`, nvcc; build/bundle/libkernels.a for `make gpu-bundle`) and CUDA's runtime is linked statically, so a binary
// needs only the driver's libcuda.so where it runs. CGO_LDFLAGS may add
// -L<dir of libcudart_static.a> where CUDA is not installed system-wide
// (the Makefile does).

/*
// The link flags are in cuda_lib.go (build/libkernels.a) and
// cuda_lib_bundle.go (-tags gpubundle: build/bundle/libkernels.a).

// The Makefile passes a hash of build/libkernels.a (-DLSP_KERNELS_LIB=...):
// Go's build cache does not see the library's contents, only CGO_CFLAGS,
// so a new library relinks the binary, which can report which one it has.
#ifndef LSP_KERNELS_LIB
#define LSP_KERNELS_LIB unknown
#endif
#define LSP_STR2(x) #x
#define LSP_STR(x) LSP_STR2(x)
static const char* lsp_kernels_lib(void) { return LSP_STR(LSP_KERNELS_LIB); }
*/
import "C"

// Library is the hash of build/libkernels.a this binary was linked with,
// as the Makefile passed it ("unknown" when built without it).
func Library() string { return C.GoString(C.lsp_kernels_lib()) }
