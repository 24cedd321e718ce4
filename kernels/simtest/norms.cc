//go:build lsp_sim

// norms.cc: compiles kernels/norms.cu under the simulator into this cgo package.
#include "../norms.cu"
