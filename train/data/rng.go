// rng.go: the seeded random numbers of this package. Every draw comes from a
// math/rand/v2 PCG with explicit seeds (never the global generator), and the
// bounded draws and shuffles are written here rather than taken from
// rand.Rand, whose derived algorithms (IntN, Perm, Shuffle) the Go project
// may change between releases: a checkpoint's data position must replay the
// same order under any Go version, and PCG's raw output is fixed by its spec.

package data

import (
	"hash/fnv"
	"math/bits"
	"math/rand/v2"
)

// rng is a PCG stream with version-stable bounded draws.
type rng struct{ src *rand.PCG }

func newRNG(seed, stream uint64) *rng { return &rng{src: rand.NewPCG(seed, stream)} }

// intn returns a uniform integer in [0, n), n > 0, by Lemire's
// multiply-and-reject method (no modulo bias).
func (r *rng) intn(n int) int {
	bound := uint64(n)
	hi, lo := bits.Mul64(r.src.Uint64(), bound)
	if lo < bound {
		thresh := -bound % bound
		for lo < thresh {
			hi, lo = bits.Mul64(r.src.Uint64(), bound)
		}
	}
	return int(hi)
}

// perm returns a uniform permutation of 0..n-1 (Fisher–Yates).
func (r *rng) perm(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := n - 1; i > 0; i-- {
		j := r.intn(i + 1)
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// streamOf turns a name into a PCG stream selector, so that different uses
// of one user seed (a task's generator, the split, the loader) draw
// independent sequences.
func streamOf(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}
