//go:build cudasim

// kernels_sim_dense.cc: compiles kernels/dense.cu under the simulator into this
// package (cudasim builds; cgo compiles only the C++ files of the package
// directory). TestEveryKernelCompiled keeps this list complete.
#include "../kernels/dense.cu"
