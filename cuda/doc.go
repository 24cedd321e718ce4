// Package cuda is the CUDA implementation of the Backend contract
// (train/backend): device memory, pinned host memory, streams and events of
// the CUDA runtime, and every op through the launchers of kernels/kernels.h
// (package kernels, their generated Go face). The engine and the models see
// only backend.Backend; nothing above this package sees cgo.
//
// What each build gets:
//
//   - -tags cuda: a GPU. The kernels come from build/libkernels.a (`make
//     kernels`, nvcc) and CUDA's runtime is linked statically (package
//     kernels' flags); devices are found through the driver API of
//     github.com/barnex/cuda5/cu (count, name, compute capability, memory,
//     PCI ids), whose panics are recovered here and returned as errors.
//   - -tags cudasim: the same Go code on the simulated CUDA runtime of
//     kernels/sim: this package compiles the kernels (kernels/*.cu, through
//     the kernels_sim_*.cc files) and the runtime into itself, as
//     kernels/simtest does under lsp_sim, and finds its device with
//     cudaGetDeviceProperties. Such a binary never loads NVIDIA's libraries.
//     `make cudasim-test` runs the tests this way.
//   - no tag: only what needs no CUDA: DeviceInfo, the sm_80 check, the
//     out-of-memory error and the arena's allocator, so that train/device
//     and plain `go test ./...` build everywhere.
//
// # The device goroutine
//
// The CUDA runtime keeps the current device and the last error per OS
// thread. A Backend therefore owns one goroutine locked to its OS thread
// (runtime.LockOSThread), made current on the device (cudaSetDevice) when
// the backend starts; every CUDA call that enqueues work or changes a
// resource (allocations, streams, events, records, waits, copies, every
// launch, Synchronize, Close) is forwarded to it and waited for, so the
// caller gets the launch's own error at once. The contract's device
// goroutine (the one that created the backend) is the only caller the
// contract allows for those; Config.CheckGoroutine checks it. Host
// goroutines only wait on events (EventSynchronize), read event times
// (ElapsedTime) and touch pinned memory: those two make their device
// current on their own thread in the same cgo call as the wait.
//
// # Memory
//
// One device arena per backend: a single cudaMalloc of the --device-mem
// budget (plus a little slack for alignment), or, with no budget, of the
// free memory less a headroom for CUDA's own use (at most 512 MiB on the
// simulated runtime, whose device memory is real, filled memory). It is
// reserved when the backend starts, so that a real out-of-memory is an
// error at start naming the bytes asked and free, and no cudaMalloc or
// cudaFree (which synchronise the device) happens during a run. Alloc carves buffers out of it (first
// fit, 256-byte aligned) and accounts them against the budget exactly as
// the CPU backend does (bytes asked, in use, high-water mark), so the
// memory plan that --device-mem is checked against holds unchanged. Alloc
// zeroes the buffer before it returns. Host buffers are CUDA's pinned
// memory (cudaHostAlloc, portable), zeroed.
//
// # Streams, events and errors
//
// Streams are non-blocking CUDA streams (the backend's DefaultStream is
// one of them, never the legacy stream 0). Events keep CUDA's rules (a wait
// binds to the latest record when it is enqueued), plus a record count, so
// that a wait on an event never recorded is the contract's error rather
// than CUDA's silent no-op. Argument errors (shapes, dtypes checked with
// backend.CheckDTypes, launch configuration) are returned when the op is
// enqueued; errors of running work are sticky, as in CUDA: the first one
// is kept and returned by Synchronize (and EventSynchronize) from then on.
//
// Limits: one device per backend; no peer access; the host waits spin or
// yield as the CUDA runtime's default scheduling decides (no blocking-sync
// events). Traffic counts copies when they are enqueued. Buffers carved
// from the arena have no guard zones between them (the simulator's guard
// pages surround the arena, not each buffer).
package cuda

//go:generate go run ./internal/opsgen/cmd
