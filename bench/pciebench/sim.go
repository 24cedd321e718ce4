//go:build cudasim

package pciebench

// simulated: this build's CUDA runtime is the simulated one, whose
// copies are memcpy on the CPU.
const simulated = true
