// Package cudasimrt tests the simulated CUDA runtime (kernels/sim/cudart.cpp)
// directly through cgo: stream order and concurrency, CUDA's event rules,
// sticky asynchronous errors, out-of-memory, pinned host memory, the
// hazard delays and the timestamps of queued operations. Its files build
// only with -tags cudasim; `make cudasim-rt-test` runs them with the hash
// of the simulator's sources in the cgo flags, as `make simtest` does.
package cudasimrt
