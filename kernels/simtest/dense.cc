//go:build lsp_sim

// dense.cc: compiles kernels/dense.cu under the simulator into this cgo package.
#include "../dense.cu"
