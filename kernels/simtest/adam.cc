//go:build lsp_sim

// adam.cc: compiles kernels/adam.cu under the simulator into this cgo package.
#include "../adam.cu"
