//go:build lsp_sim

// sim_runtime.cc: compiles the simulator's runtime (kernels/sim/sim.cpp)
// into this cgo package; cgo builds only the C++ files of the package
// directory.
#include "../sim/sim.cpp"
