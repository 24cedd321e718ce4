//go:build cudasim

package main

// cudaRuntime says where --device cuda runs in this build (make sim): on
// the simulated CUDA runtime, which is for tests.
const cudaRuntime = "on the SIMULATED CUDA runtime: the kernels run on the CPU, slowly, for tests"

// cudaSimulated says --device cuda is the simulated runtime.
const cudaSimulated = true
