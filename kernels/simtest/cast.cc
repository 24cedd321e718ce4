//go:build lsp_sim

// cast.cc: compiles kernels/cast.cu under the simulator into this cgo package.
#include "../cast.cu"
