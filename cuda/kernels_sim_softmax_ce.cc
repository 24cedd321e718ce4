//go:build cudasim

// kernels_sim_softmax_ce.cc: compiles kernels/softmax_ce.cu under the simulator into this
// package (cudasim builds; cgo compiles only the C++ files of the package
// directory). TestEveryKernelCompiled keeps this list complete.
#include "../kernels/softmax_ce.cu"
