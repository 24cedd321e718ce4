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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unsafe"
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

// sourceGlobs are the C++ sources compiled into this package from outside
// its directory (plus its own .cu and .h), relative to the repository root;
// the Makefile hashes the same list in the same (sorted) order.
var sourceGlobs = []string{"kernels/*.cu", "kernels/*.cuh", "kernels/*.h", "kernels/sim/*.h", "kernels/sim/*.cpp",
	"kernels/simtest/*.cu", "kernels/simtest/*.h"}

// sourceFiles lists sourceGlobs from the package directory (sorted by their
// repository-relative paths).
func sourceFiles() ([]string, error) {
	var files []string
	for _, g := range sourceGlobs {
		m, err := filepath.Glob(filepath.Join("..", "..", g))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	sort.Slice(files, func(i, j int) bool {
		return filepath.ToSlash(files[i]) < filepath.ToSlash(files[j])
	})
	return files, nil
}

// checkFresh reports a stale build. Go's build cache keys this package on
// the files in its directory and on CGO_CXXFLAGS, not on the kernels it
// includes from ../, so after editing kernels/gemm.cu a plain `go test`
// may link C++ objects compiled from the old source. `make simtest` passes
// -DLSP_SIM_SOURCES=<hash of the sources> in CGO_CXXFLAGS, which both
// forces a rebuild and lets this check compare the exact hash; without it
// the check compares modification times with the compile time.
func checkFresh() error {
	info := C.GoString(C.lsp_sim_build_info())
	stamp, want, _ := strings.Cut(info, "|")
	files, err := sourceFiles()
	if err != nil {
		return err
	}
	const fix = "Go's build cache does not see kernel sources outside kernels/simtest; run `make simtest` (RUN=TestName to select tests), which rebuilds with a hash of the sources"
	if want != "" {
		h := sha256.New()
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		if got := hex.EncodeToString(h.Sum(nil))[:16]; got != want {
			return fmt.Errorf("stale build: the kernel sources hash to %s but this binary was built from %s; %s", got, want, fix)
		}
		return nil
	}
	built, err := time.ParseInLocation("Jan _2 2006 15:04:05", stamp, time.Local)
	if err != nil {
		return fmt.Errorf("simtest: bad build stamp %q: %w", stamp, err)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		if st.ModTime().After(built.Add(2 * time.Second)) {
			return fmt.Errorf("stale build: %s changed at %s, after this binary's C++ code was compiled (%s); %s",
				strings.TrimPrefix(filepath.ToSlash(f), "../../"), st.ModTime().Format(time.TimeOnly), built.Format(time.TimeOnly), fix)
		}
	}
	return nil
}
