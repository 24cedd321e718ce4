//go:build lsp_sim

// selftest.cc: compiles the simulator's self-test kernels into this cgo
// package (cgo builds only the C++ files of the package directory).
#include "selftest.cu"
