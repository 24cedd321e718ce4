//go:build lsp_sim || cudasim

package kernels

// Simulator builds: the launchers' declarations are read with -DLSP_SIM,
// which makes kernels.h declare the simulator's C API (sim/sim_api.h) that
// the generated shims use for its messages. The kernels themselves and
// the simulator's runtime are compiled by the importer (see the package
// documentation).

// #cgo CFLAGS: -DLSP_SIM
import "C"

// Library says that the kernels are the simulator's.
func Library() string { return "simulator" }
