//go:build cudasim

// cudart_sim.cc: compiles the simulated CUDA runtime (kernels/sim/cudart.cpp,
// which includes the simulator, kernels/sim/sim.cpp) and the simulated NCCL
// on top of it (kernels/sim/nccl.cpp, which uses the runtime's streams)
// into this package, as one translation unit.
#include "../kernels/sim/cudart.cpp"
#include "../kernels/sim/nccl.cpp"
