//go:build cudasim

package cuda

import (
	"fmt"
	"os"
	"testing"
)

// TestMain refuses a stale build of the C++ code compiled into this
// package (checkFresh) before running the tests on the simulated device.
func TestMain(m *testing.M) {
	if err := checkFresh(); err != nil {
		fmt.Fprintf(os.Stderr, "cuda: %v\n", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
