//go:build lsp_sim

// The simulator mode of the harness: cgo flags that compile the kernels
// and the simulator into this package, guarded buffers from lsp_sim_alloc,
// seeds, barrier switches, and the stale-build check.

package simtest

/*
#cgo CFLAGS: -DLSP_SIM -I${SRCDIR}/.. -I${SRCDIR}/../sim
#cgo CXXFLAGS: -std=c++17 -DLSP_SIM -O1 -g -Wall -Wno-unknown-pragmas -fno-strict-aliasing
#cgo CXXFLAGS: -I${SRCDIR}/.. -I${SRCDIR}/../sim
#cgo LDFLAGS: -lpthread -lm
#include <stdlib.h>
#include "sim_api.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"path/filepath"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/internal/simfresh"
)

// SetSeed picks the thread orders of every later launch and the opaque
// wmma fragment layout, and restarts the launch counter, so a test that
// sets a seed and launches the same kernels sees the same schedule.
func SetSeed(seed uint64) { C.lsp_sim_set_seed(C.uint64_t(seed)) }

// devMem is empty under the simulator: lsp_sim_free finds a buffer by its
// address.
type devMem struct{}

func devAlloc(bytes, align int, before bool) (unsafe.Pointer, devMem, error) {
	g := C.int(0)
	if before {
		g = 1
	}
	p := C.lsp_sim_alloc(C.size_t(bytes), C.size_t(align), g)
	if p == nil {
		return nil, devMem{}, errors.New("lsp_sim_alloc failed")
	}
	return p, devMem{}, nil
}

func devFree(p unsafe.Pointer, _ devMem) error {
	switch C.lsp_sim_free(p) {
	case 1:
		return errors.New("was written past its end (canary overwritten)")
	case -1:
		return errors.New("is not a live buffer")
	}
	return nil
}

// setSkipBarriers switches barrier sites off in this process, as
// LSP_SIM_SKIP_BARRIER does ("file.cu:line,..."; "" for none).
func setSkipBarriers(sites string) error {
	cs := C.CString(sites)
	defer C.free(unsafe.Pointer(cs))
	if C.lsp_sim_set_skip_barriers(cs) != 0 {
		return fmt.Errorf("simtest: bad barrier site list %q (want file.cu:line,...)", sites)
	}
	return nil
}

// skippedBarrierHits counts how often switched-off barrier sites were
// reached in this process.
func skippedBarrierHits() int64 { return int64(C.lsp_sim_skipped_barrier_hits()) }

// checkFresh reports a stale build (see internal/simfresh).
func checkFresh() error {
	return simfresh.Check(C.GoString(C.lsp_sim_build_info()), filepath.Join("..", ".."),
		"Go's build cache does not see kernel sources outside kernels/simtest; run `make simtest` (RUN=TestName to select tests), which rebuilds with a hash of the sources")
}
