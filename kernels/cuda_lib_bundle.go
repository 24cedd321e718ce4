//go:build cuda && gpubundle

package kernels

// The GPU bundle's kernels (`make gpu-bundle`: build/bundle/libkernels.a,
// only the architectures of GPU_BUNDLE_ARCH, so the bundle stays small),
// with CUDA's runtime and the C++ library both linked statically: the
// bundle runs on a machine with only the NVIDIA driver, whose libstdc++
// may be older than this one's or absent.

// #cgo LDFLAGS: ${SRCDIR}/../build/bundle/libkernels.a -lcudart_static -Wl,-Bstatic -lstdc++ -Wl,-Bdynamic -ldl -lrt -lpthread -lm
import "C"
