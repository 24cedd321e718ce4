// The parallel loops of the CPU ops: a range of independent outputs split
// into contiguous chunks, one goroutine each, on the backend's threads.
// The split never changes a result because each output is computed by
// exactly one call of the body, in the body's own fixed order; the
// references of ref_*.go are written so that a row, column or chunk range
// is all a call needs.

package cpu

import (
	"fmt"
	"sync"
)

// parallel runs fn over [0,n) in contiguous chunks of at least grain
// elements on the backend's threads. fn must write disjoint outputs per
// index so that the split never changes results.
func (b *Backend) parallel(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	chunks := min(b.threads, (n+grain-1)/grain)
	if chunks <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	per := (n + chunks - 1) / chunks
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// parallelErr is parallel for bodies that can fail (the host cores check
// their arguments again): it returns the first error seen, wrapped with op.
func (b *Backend) parallelErr(op string, n, grain int, fn func(lo, hi int) error) error {
	var mu sync.Mutex
	var first error
	b.parallel(n, grain, func(lo, hi int) {
		if err := fn(lo, hi); err != nil {
			mu.Lock()
			if first == nil {
				first = fmt.Errorf("cpu: %s: %w", op, err)
			}
			mu.Unlock()
		}
	})
	return first
}

// serial runs fn over [0,n) in one call on the calling goroutine: the
// form of parallel that the references of ref_*.go take, whose results
// the split of parallel does not change.
func serial(n, _ int, fn func(lo, hi int)) {
	if n > 0 {
		fn(0, n)
	}
}
