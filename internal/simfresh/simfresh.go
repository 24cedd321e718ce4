// Package simfresh tells a test binary built with the CPU simulator whether
// it was compiled from the kernel sources now on disk. Go's build cache
// keys a cgo package on the files in its own directory and on its cgo
// flags, not on the C++ it includes from elsewhere (kernels/*.cu,
// kernels/sim), so after editing a kernel a plain `go test` may link
// objects compiled from the old source. The Makefile passes a hash of the
// sources (-DLSP_SIM_SOURCES=..., its SIM_SRCS) in the cgo flags, which
// both forces a rebuild and lets Check compare the exact hash; without it
// Check compares modification times with the compile time.
package simfresh

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Globs are the Makefile's SIM_SRCS, relative to the repository root: the
// same list in the same (sorted) order gives the same hash.
var Globs = []string{"kernels/*.cu", "kernels/*.cuh", "kernels/*.h", "kernels/sim/*.h", "kernels/sim/*.cpp",
	"kernels/simtest/*.cu", "kernels/simtest/*.h"}

// Check compares the sources of Globs under root (the repository root as
// seen from the test's package directory, e.g. "../..") with buildInfo,
// the binary's "stamp|hash" (the C compiler's __DATE__ " " __TIME__ and
// the Makefile's hash, empty without it). A stale build is an error that
// ends with fix, the command that rebuilds it.
func Check(buildInfo, root, fix string) error {
	var files []string
	for _, g := range Globs {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			return err
		}
		files = append(files, m...)
	}
	sort.Slice(files, func(i, j int) bool { return filepath.ToSlash(files[i]) < filepath.ToSlash(files[j]) })
	stamp, want, _ := strings.Cut(buildInfo, "|")
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
		return fmt.Errorf("bad build stamp %q: %w", stamp, err)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		if st.ModTime().After(built.Add(2 * time.Second)) {
			rel, _ := filepath.Rel(root, f)
			return fmt.Errorf("stale build: %s changed at %s, after this binary's C++ code was compiled (%s); %s",
				filepath.ToSlash(rel), st.ModTime().Format(time.TimeOnly), built.Format(time.TimeOnly), fix)
		}
	}
	return nil
}
