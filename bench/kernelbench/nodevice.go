//go:build !cuda && !cudasim

// Package kernelbench times the kernels; see kernels.go. This build has
// no CUDA backend.
package kernelbench

import "fmt"

// Run says that this build has nothing to measure.
func Run([]string) error {
	fmt.Println("bench-kernels: no CUDA backend in this build (build with -tags cuda on a GPU machine, or -tags cudasim for the simulated runtime): nothing measured")
	return nil
}
