//go:build !cuda && !cudasim

// Command kernels times the kernels; see main.go. This build
// has no CUDA backend.
package main

import "fmt"

func main() {
	fmt.Println("bench-kernels: no CUDA backend in this build (build with -tags cuda on a GPU machine, or -tags cudasim for the simulated runtime): nothing measured")
}
