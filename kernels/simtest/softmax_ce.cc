//go:build lsp_sim

// softmax_ce.cc: compiles kernels/softmax_ce.cu under the simulator into this cgo package.
#include "../softmax_ce.cu"
