package hazard_test

import (
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// TestWrapFindsMissingWait wraps the CPU backend (its own check off) and
// runs a producer on one stream and a consumer on another, with and
// without the event between them: without it the wrapper reports the pair
// by name at the enqueue, and Synchronize returns it; with it nothing. No
// delays are involved: the finding does not depend on timing.
func TestWrapFindsMissingWait(t *testing.T) {
	for _, withWait := range []bool{true, false} {
		be := cpu.New(cpu.Config{Threads: 1})
		w := hazard.Wrap(be)
		s2, err := w.NewStream("consumer")
		if err != nil {
			t.Fatal(err)
		}
		x, _ := w.Alloc("x", 64, backend.F32)
		y, _ := w.Alloc("y", 64, backend.F32)
		ev, _ := w.NewEvent("x ready")
		s1 := w.DefaultStream()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(w.Fill(s1, x, 2))
		must(w.Record(ev, s1))
		if withWait {
			must(w.Wait(s2, ev))
		} else {
			// The wait goes to the wrapped backend only: the streams run
			// in order (no real data race for -race to flag), but the
			// wrapper, which sees only what goes through it, must report
			// the pair.
			must(be.Wait(s2, ev))
		}
		must(w.Add(s2, y, x, x))
		err = w.Synchronize(s2)
		h := w.Hazards()
		if withWait {
			if err != nil || len(h) != 0 {
				t.Errorf("with the wait: error %v, hazards %v", err, h)
			}
		} else {
			// add reads x twice (as x and y): one hazard per read.
			if len(h) != 2 || h[0].Op != "add" || h[0].Prev != "fill" {
				t.Errorf("without the wait: hazards %v, want add after fill twice", h)
			}
			if err == nil || !strings.Contains(err.Error(), "hazard") {
				t.Errorf("without the wait: Synchronize returned %v, want the hazard", err)
			}
		}
		// Upload goes through the wrapper's staging: the host's write of
		// the staging buffer and the copy up are checked too, and ordered.
		if withWait {
			must(backend.Upload(w, s1, x, make([]float32, 64)))
		}
		if n := len(w.Hazards()); n != len(h) {
			t.Errorf("upload added %d hazards", n-len(h))
		}
		w.Close()
	}
}
