//go:build lsp_sim

package simtest

import (
	"fmt"
	"os"
	"testing"
)

// TestMain refuses a stale simulator build (checkFresh) and, in a
// barrier-removal child, reports how often the switched-off barriers were
// reached.
func TestMain(m *testing.M) {
	if !InChild() {
		if err := checkFresh(); err != nil {
			fmt.Fprintf(os.Stderr, "simtest: %v\n", err)
			os.Exit(2)
		}
	}
	code := m.Run()
	if os.Getenv(skipEnv) != "" {
		// Read by TestBarrierRemoval in the parent.
		fmt.Printf("lsp_sim: skipped barrier hits: %d\n", skippedBarrierHits())
	}
	os.Exit(code)
}
