//go:build lsp_sim

// rope.cc: compiles kernels/rope.cu under the simulator into this cgo package.
#include "../rope.cu"
