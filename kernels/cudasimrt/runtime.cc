//go:build cudasim

// runtime.cc: compiles the simulated CUDA runtime (kernels/sim/cudart.cpp,
// which includes the simulator, sim.cpp) into this cgo package; cgo builds
// only the C++ files of the package directory.
#include "../sim/cudart.cpp"
