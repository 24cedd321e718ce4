//go:build cudasim

// kernels_sim_quant.cc: compiles kernels/quant.cu under the simulator into this
// package (cudasim builds; cgo compiles only the C++ files of the package
// directory). TestEveryKernelCompiled keeps this list complete.
#include "../kernels/quant.cu"
