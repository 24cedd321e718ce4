//go:build lsp_sim

// elementwise.cc: compiles kernels/elementwise.cu under the simulator into this cgo package.
#include "../elementwise.cu"
