//go:build cuda && !cudasim

package main

// cudaRuntime says where --device cuda runs in this build: on a GPU.
const cudaRuntime = "on an NVIDIA GPU, sm_80 or newer"

// cudaSimulated says --device cuda is the simulated runtime.
const cudaSimulated = false
