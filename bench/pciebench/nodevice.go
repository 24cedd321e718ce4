//go:build !cuda && !cudasim

// Package pciebench measures the host-device link; see pcie.go. This
// build has no CUDA backend.
package pciebench

import "fmt"

// Run says that this build has nothing to measure.
func Run([]string) error {
	fmt.Println("bench-pcie: no CUDA backend in this build (build with -tags cuda on a GPU machine, or -tags cudasim for the simulated runtime): nothing measured")
	return nil
}
