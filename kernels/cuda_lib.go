//go:build cuda && !gpubundle

package kernels

// The kernels of `make kernels` (every architecture of NVCC_ARCH), linked
// with CUDA's static runtime.

// #cgo LDFLAGS: ${SRCDIR}/../build/libkernels.a -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm
import "C"
