// workers_test.go: the pinned worker pool: every chunk runs exactly once,
// workers sit on one core each, panics become errors, submissions complete,
// and a closed pool refuses work.

package host

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestWorkersParallelForCoversEveryChunk(t *testing.T) {
	for _, workers := range []int{1, 2, 5} {
		w := adamTestWorkers(t, workers)
		if w.N() != workers {
			t.Fatalf("N() = %d, want %d", w.N(), workers)
		}
		for _, chunks := range []int{0, 1, 3, 1000} {
			counts := make([]atomic.Int32, chunks)
			if err := w.ParallelFor(chunks, func(c int) { counts[c].Add(1) }); err != nil {
				t.Fatal(err)
			}
			for c := range counts {
				if got := counts[c].Load(); got != 1 {
					t.Fatalf("%d workers, %d chunks: chunk %d ran %d times", workers, chunks, c, got)
				}
			}
		}
	}
}

// TestWorkersArePinned: inside a chunk, the thread's affinity is exactly the
// one core the pool lists for some worker.
func TestWorkersArePinned(t *testing.T) {
	w := adamTestWorkers(t, 0)
	cpus := map[int]bool{}
	for _, c := range w.CPUs() {
		cpus[c] = true
	}
	if len(w.CPUs()) != w.N() || w.N() < 1 {
		t.Fatalf("CPUs() = %v for %d workers", w.CPUs(), w.N())
	}
	var bad atomic.Int32
	err := w.ParallelFor(64, func(int) {
		var set unix.CPUSet
		if unix.SchedGetaffinity(0, &set) != nil || set.Count() != 1 {
			bad.Add(1)
			return
		}
		for c := range cpus {
			if set.IsSet(c) {
				return
			}
		}
		bad.Add(1)
	})
	if err != nil {
		t.Fatal(err)
	}
	if bad.Load() != 0 {
		t.Errorf("%d chunks ran on a thread not pinned to one of %v", bad.Load(), w.CPUs())
	}
	// Unpinned pools keep the process's mask.
	u, err := NewWorkers(WorkersOptions{N: 2, NoPin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if u.CPUs() != nil {
		t.Errorf("unpinned pool lists CPUs %v", u.CPUs())
	}
}

func TestWorkersPanicIsError(t *testing.T) {
	w := adamTestWorkers(t, 2)
	var ran atomic.Int32
	err := w.ParallelFor(10, func(c int) {
		ran.Add(1)
		if c == 3 {
			panic("boom")
		}
	})
	if err == nil || !strings.Contains(err.Error(), "chunk 3 panicked: boom") {
		t.Fatalf("error %v, want the panic of chunk 3", err)
	}
	if ran.Load() != 10 {
		t.Errorf("%d chunks ran, want all 10", ran.Load())
	}
	// The pool still works afterwards.
	if err := w.ParallelFor(4, func(int) {}); err != nil {
		t.Fatal(err)
	}
}

func TestWorkersSubmit(t *testing.T) {
	w := adamTestWorkers(t, 2)
	release := make(chan struct{})
	var sum atomic.Int64
	c := w.Submit(func() error {
		<-release
		return w.ParallelFor(100, func(i int) { sum.Add(int64(i)) })
	})
	select {
	case <-c.Done():
		t.Fatal("completion done before its work could run")
	case <-time.After(10 * time.Millisecond):
	}
	close(release)
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if sum.Load() != 4950 {
		t.Errorf("sum %d, want 4950", sum.Load())
	}
	sentinel := errors.New("sentinel")
	if err := w.Submit(func() error { return sentinel }).Wait(); !errors.Is(err, sentinel) {
		t.Errorf("error %v, want the sentinel", err)
	}
	if err := w.Submit(func() error { panic("late") }).Wait(); err == nil || !strings.Contains(err.Error(), "late") {
		t.Errorf("error %v, want the panic", err)
	}
}

func TestWorkersClose(t *testing.T) {
	w, err := NewWorkers(WorkersOptions{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	w.Close() // no-op
	if err := w.ParallelFor(3, func(int) {}); !errors.Is(err, ErrWorkersClosed) {
		t.Errorf("ParallelFor on a closed pool: %v, want ErrWorkersClosed", err)
	}
	if _, err := w.AdamStep([]AdamTensor{{W: []float32{1}, Grad: AdamGrad{F32: []float32{1}}, State: NewAdamState(1), Params: AdamDefaults()}}); !errors.Is(err, ErrWorkersClosed) {
		t.Errorf("AdamStep on a closed pool: %v, want ErrWorkersClosed", err)
	}
}

func TestWorkersOptionErrors(t *testing.T) {
	if _, err := NewWorkers(WorkersOptions{N: -1}); err == nil {
		t.Error("N = -1 accepted")
	}
	if _, err := NewWorkers(WorkersOptions{N: 1, CPUs: []int{1 << 20}}); err == nil {
		t.Error("pinning to CPU 1<<20 succeeded")
	}
}
