//go:build lsp_sim

// attention.cc: compiles kernels/attention.cu under the simulator into this cgo package.
#include "../attention.cu"
