//go:build cudasim

// cudart_sim.cc: compiles the simulated CUDA runtime (kernels/sim/cudart.cpp,
// which includes the simulator, kernels/sim/sim.cpp) into this package.
#include "../kernels/sim/cudart.cpp"
