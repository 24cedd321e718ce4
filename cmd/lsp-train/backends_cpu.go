//go:build !cuda && !cudasim

package main

// cudaRuntime is unused where the build has no cuda backend.
const cudaRuntime = ""

// cudaSimulated says --device cuda is the simulated runtime.
const cudaSimulated = false
