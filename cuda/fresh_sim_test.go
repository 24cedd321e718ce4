//go:build cudasim

// The stale-build check of the simulated build, as kernels/simtest has
// it: Go's build cache keys this package on its own files and on
// CGO_CXXFLAGS, not on the kernels and the runtime it includes from
// ../kernels, so after editing kernels/gemm.cu a plain `go test` may link
// objects compiled from the old source. `make cudasim-test` passes a hash
// of the sources (-DLSP_SIM_SOURCES, the Makefile's SIM_HASH), which both
// forces a rebuild and lets checkFresh compare the exact hash; without it
// the check compares modification times with the compile time.

package cuda

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

// sourceGlobs are the Makefile's SIM_SRCS, relative to the repository
// root, in its (sorted) order: the same list gives the same hash.
var sourceGlobs = []string{"kernels/*.cu", "kernels/*.cuh", "kernels/*.h", "kernels/sim/*.h", "kernels/sim/*.cpp",
	"kernels/simtest/*.cu", "kernels/simtest/*.h"}

func sourceFiles() ([]string, error) {
	var files []string
	for _, g := range sourceGlobs {
		m, err := filepath.Glob(filepath.Join("..", g))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	sort.Slice(files, func(i, j int) bool { return filepath.ToSlash(files[i]) < filepath.ToSlash(files[j]) })
	return files, nil
}

func checkFresh() error {
	stamp, want, _ := strings.Cut(simBuildInfo(), "|")
	files, err := sourceFiles()
	if err != nil {
		return err
	}
	const fix = "Go's build cache does not see the kernel and runtime sources outside cuda/; run `make cudasim-test` (RUN=TestName to select tests), which rebuilds with a hash of the sources"
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
		return fmt.Errorf("cuda: bad build stamp %q: %w", stamp, err)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		if st.ModTime().After(built.Add(2 * time.Second)) {
			return fmt.Errorf("stale build: %s changed at %s, after this binary's C++ code was compiled (%s); %s",
				strings.TrimPrefix(filepath.ToSlash(f), "../"), st.ModTime().Format(time.TimeOnly), built.Format(time.TimeOnly), fix)
		}
	}
	return nil
}
