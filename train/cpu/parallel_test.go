// Tests of parallel: every index runs exactly once, in the number of
// chunks that the grain and the thread count promise.

package cpu

import (
	"sync"
	"testing"
)

func TestParallelSplit(t *testing.T) {
	for _, tc := range []struct{ n, grain, threads, chunks int }{
		{0, 1, 3, 0}, {1, 1, 3, 1}, {10, 16, 3, 1}, {33, 16, 3, 3}, {32, 16, 3, 2}, {100, 1, 3, 3}, {7, 1, 8, 7},
	} {
		be := &Backend{threads: tc.threads}
		var mu sync.Mutex
		seen := make([]int, tc.n)
		chunks := 0
		be.parallel(tc.n, tc.grain, func(lo, hi int) {
			mu.Lock()
			defer mu.Unlock()
			chunks++
			for i := lo; i < hi; i++ {
				seen[i]++
			}
		})
		if chunks != tc.chunks {
			t.Errorf("n=%d grain=%d threads=%d: %d chunks, want %d", tc.n, tc.grain, tc.threads, chunks, tc.chunks)
		}
		for i, c := range seen {
			if c != 1 {
				t.Fatalf("n=%d grain=%d threads=%d: index %d run %d times", tc.n, tc.grain, tc.threads, i, c)
			}
		}
	}
}
