//go:build lsp_sim

// quant.cc: compiles kernels/quant.cu under the simulator into this cgo package.
#include "../quant.cu"
