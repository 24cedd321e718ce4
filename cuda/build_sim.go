//go:build cudasim

// The simulated build: cgo flags that compile the kernels and the
// simulated CUDA runtime (kernels/sim/cudart.cpp) into this package, the
// runtime's message of a failed call, and the runtime's controls the tests
// use (hazard delays, the build's source hash).

package cuda

/*
#cgo CFLAGS: -DLSP_SIM -DLSP_CUDASIM -I${SRCDIR}/../kernels -I${SRCDIR}/../kernels/sim
#cgo CXXFLAGS: -std=c++17 -DLSP_SIM -DLSP_CUDASIM -O1 -g -Wall -Wno-unknown-pragmas -fno-strict-aliasing
#cgo CXXFLAGS: -I${SRCDIR}/../kernels -I${SRCDIR}/../kernels/sim -I${SRCDIR}/../third_party/nccl
#cgo LDFLAGS: -lpthread -lm
#include <stdlib.h>
#include "sim_api.h"
*/
import "C"

import "time"

// simulated says which runtime this build has.
const simulated = true

// maxDefaultArena caps the arena of a backend without a budget: the
// simulated runtime fills the device memory it hands out (0xFF, NaN), so
// its device memory is real memory, and a run without --device-mem should
// not take all of it (8 GiB by default). Pass --device-mem for more.
const maxDefaultArena = 512 << 20

// lastMessage is the simulated runtime's message of the last failed call
// on this OS thread (which kernel, block and thread, and why, for a fault
// of queued work): the caller must be locked to the thread of that call.
func lastMessage() string { return C.GoString(C.lsp_sim_last_message()) }

// simBuildInfo is "compile time|source hash" of the C++ code in this
// binary (the Makefile passes the hash, see checkFresh).
func simBuildInfo() string { return C.GoString(C.lsp_sim_build_info()) }

// simSetDelays switches the runtime's hazard mode on (maxMicros > 0): a
// seeded delay before every queued operation, so that work not ordered by
// an event changes results.
func simSetDelays(seed uint64, maxMicros uint) {
	C.lsp_sim_set_delays(C.uint64_t(seed), C.unsigned(maxMicros))
}

// simPageableCopies counts the cudaMemcpyAsync calls so far whose host side
// was not pinned memory (which CUDA stages or waits for).
func simPageableCopies() int64 { return int64(C.lsp_sim_pageable_copies()) }

// SetHazardDelays switches the simulated runtime's hazard mode on (max >
// 0) or off (max 0) for the whole process: a delay drawn from seed, the
// stream's number and the op's place on it before every queued op, so that
// work no event orders runs in another order than it was enqueued. Stream
// numbers restart, so a backend opened after the call sees the same delays
// in every run. It reports whether the build has the mode (a GPU has not).
func SetHazardDelays(seed uint64, max time.Duration) bool {
	simSetDelays(seed, uint(max/time.Microsecond))
	return true
}
