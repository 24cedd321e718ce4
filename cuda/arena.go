// The allocator of the device arena: byte offsets into one reservation,
// first fit over a sorted, coalesced free list. Pure Go (no CUDA), so it is
// tested in every build.
//
// A run allocates a few large buffers (parameters, gradients, activations,
// optimizer state) once and frees them at the end, so first fit with
// coalescing is enough; blocks are 256-byte aligned, as cudaMalloc's are,
// which every kernel's vector loads and wmma tiles are content with.

package cuda

import "sort"

// arenaAlign is the alignment of every block (cudaMalloc's).
const arenaAlign = 256

// span is a free range [off, off+n) of the arena.
type span struct{ off, n int64 }

type arena struct {
	size int64
	free []span // sorted by off, never adjacent (coalesced), never empty
}

func newArena(size int64) *arena {
	a := &arena{size: size}
	if size > 0 {
		a.free = []span{{0, size}}
	}
	return a
}

// roundUp is n rounded up to arenaAlign (0 stays 0).
func roundUp(n int64) int64 { return (n + arenaAlign - 1) &^ (arenaAlign - 1) }

// alloc returns the offset of a free block of n bytes (rounded up to
// arenaAlign), or false when no free span is large enough. A block of 0
// bytes takes no space and gets offset 0.
func (a *arena) alloc(n int64) (int64, bool) {
	n = roundUp(n)
	if n == 0 {
		return 0, true
	}
	for i, s := range a.free {
		if s.n < n {
			continue
		}
		if s.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + n, s.n - n}
		}
		return s.off, true
	}
	return 0, false
}

// release returns the block [off, off+n) (n as given to alloc) to the free
// list, merging it with its free neighbours.
func (a *arena) release(off, n int64) {
	n = roundUp(n)
	if n == 0 {
		return
	}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	s := span{off, n}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == off { // merge with the one before
		i--
		s = span{a.free[i].off, a.free[i].n + n}
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	if i < len(a.free) && s.off+s.n == a.free[i].off { // and with the one after
		s.n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = s
}

// freeBytes is the total free, largest the largest block alloc can give.
func (a *arena) freeBytes() (total, largest int64) {
	for _, s := range a.free {
		total += s.n
		largest = max(largest, s.n)
	}
	return total, largest
}
