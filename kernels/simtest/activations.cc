//go:build lsp_sim

// activations.cc: compiles kernels/activations.cu under the simulator into this cgo package.
#include "../activations.cu"
