//go:build cudasim

package nccltest

// simulated: this test binary runs on the simulated CUDA runtime and NCCL
// (kernels/sim), where every rank's process has its own device 0.
const simulated = true
