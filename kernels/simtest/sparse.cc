//go:build lsp_sim

// sparse.cc: compiles kernels/sparse.cu under the simulator into this cgo package.
#include "../sparse.cu"
