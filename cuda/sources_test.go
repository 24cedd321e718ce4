// TestEveryKernelCompiled: the cudasim build compiles each kernels/*.cu
// through a kernels_sim_<family>.cc of this package (cgo compiles only the
// package's own directory), so a new kernel file needs one; this test,
// which needs no CUDA, says which is missing.

package cuda

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEveryKernelCompiled(t *testing.T) {
	cus, err := filepath.Glob("../kernels/*.cu")
	if err != nil || len(cus) == 0 {
		t.Fatalf("no kernels found (%v)", err)
	}
	have := map[string]bool{}
	for _, cu := range cus {
		name := strings.TrimSuffix(filepath.Base(cu), ".cu")
		cc := "kernels_sim_" + name + ".cc"
		src, err := os.ReadFile(cc)
		if err != nil {
			t.Errorf("kernels/%s.cu has no %s: the cudasim build would lack its launchers", name, cc)
			continue
		}
		if !strings.Contains(string(src), `#include "../kernels/`+name+`.cu"`) || !strings.HasPrefix(string(src), "//go:build cudasim\n") {
			t.Errorf("%s does not include ../kernels/%s.cu under the cudasim tag", cc, name)
		}
		have[cc] = true
	}
	ccs, _ := filepath.Glob("kernels_sim_*.cc")
	for _, cc := range ccs {
		if !have[cc] {
			t.Errorf("%s compiles no kernels/*.cu", cc)
		}
	}
}
