//go:build lsp_sim

// embedding.cc: compiles kernels/embedding.cu under the simulator into this cgo package.
#include "../embedding.cu"
