//go:build lsp_sim

// gemm.cc: compiles kernels/gemm.cu under the simulator into this cgo package.
#include "../gemm.cu"
