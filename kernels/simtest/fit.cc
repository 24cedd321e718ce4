//go:build lsp_sim

// fit.cc: compiles kernels/fit.cu under the simulator into this cgo package.
#include "../fit.cu"
