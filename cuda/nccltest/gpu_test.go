//go:build cuda

package nccltest

// simulated: this test binary runs on real GPUs and libnccl.so.2.
const simulated = false
