//go:build cudasim

package cudasimrt

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestMain refuses a stale build: Go's build cache keys this package on its
// own files and on the cgo flags, not on the runtime and kernels it
// includes from ../, so `make cudasim-rt-test` passes their hash
// (-DLSP_SIM_SOURCES, the Makefile's SIM_SRCS, as for simtest).
func TestMain(m *testing.M) {
	if err := checkFresh(); err != nil {
		fmt.Fprintf(os.Stderr, "cudasimrt: %v\n", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// sourceGlobs is the Makefile's SIM_SRCS (same list; it is sorted below).
var sourceGlobs = []string{"kernels/*.cu", "kernels/*.cuh", "kernels/*.h", "kernels/sim/*.h", "kernels/sim/*.cpp",
	"kernels/simtest/*.cu", "kernels/simtest/*.h"}

func checkFresh() error {
	var files []string
	for _, g := range sourceGlobs {
		m, err := filepath.Glob(filepath.Join("..", "..", g))
		if err != nil {
			return err
		}
		files = append(files, m...)
	}
	sort.Slice(files, func(i, j int) bool { return filepath.ToSlash(files[i]) < filepath.ToSlash(files[j]) })
	stamp, want, _ := strings.Cut(buildInfo(), "|")
	const fix = "Go's build cache does not see the sources this package includes from ../; run `make cudasim-rt-test` (RUN=TestName selects tests), which rebuilds with a hash of them"
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
			return fmt.Errorf("stale build: the sources hash to %s but this binary was built from %s; %s", got, want, fix)
		}
		return nil
	}
	built, err := time.ParseInLocation("Jan _2 2006 15:04:05", stamp, time.Local)
	if err != nil {
		return fmt.Errorf("bad build stamp %q: %w", stamp, err)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		if st.ModTime().After(built.Add(2 * time.Second)) {
			return fmt.Errorf("stale build: %s changed after this binary's C++ code was compiled; %s",
				strings.TrimPrefix(filepath.ToSlash(f), "../../"), fix)
		}
	}
	return nil
}
