//go:build cudasim

package cuda

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// TestCopiesArePinned: every copy the backend makes, the staging
// transfers' included, has its host side in pinned memory, as the
// simulated runtime counts (a pageable copy would be staged or waited for
// by CUDA, serialising the pipelined schedule).
func TestCopiesArePinned(t *testing.T) {
	before := simPageableCopies()
	be := newBE(t, Config{})
	s := be.DefaultStream()
	x := alloc(t, be, "x", 3000, backend.BF16)
	put(t, be, x, randVals(newRand(9), 3000, 1))
	h, err := be.AllocHost("h", 6000)
	ok(t, err)
	ok(t, be.CopyD2H(s, h, 0, x))
	ok(t, be.CopyH2D(s, x, h, 0))
	_ = get(t, be, x)
	if n := simPageableCopies() - before; n != 0 {
		t.Errorf("%d copies from or to pageable host memory", n)
	}
}
