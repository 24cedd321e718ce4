// Package host is the CPU side of lsp-offload: C kernels behind cgo, each
// with a scalar, an AVX2 and an AVX-512 path picked at run time (simd.go) —
// the CPU backend's matrix multiply (Sgemm) and sparse projection cores, the
// fused AdamW step of the offloaded optimizer, and the STREAM triad that
// measures the memory bandwidth it is judged against — plus off-heap host
// buffers (the pinned memory of the link) and a pool of worker threads
// pinned to cores.
package host
