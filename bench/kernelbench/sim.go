//go:build cudasim

package kernelbench

// simulated: this build's CUDA runtime is the simulated one, which runs
// the kernels on the CPU.
const simulated = true
