// scratch.go: pools of 64-byte aligned float32 scratch buffers for the C
// cores (Sgemm's packed panels, the sparse gather's tiles), so that packed
// data starts on cache lines and large buffers are reused across calls.
//
// Limits: a buffer only grows; one taken from a pool holds whatever its last
// user left in it (callers overwrite before they read).

package host

import (
	"sync"
	"unsafe"
)

// scratchBuf is a scratch buffer: f is a 64-byte aligned window of raw.
type scratchBuf struct{ raw, f []float32 }

// scratchPool is a pool of scratch buffers. The zero value is ready to use.
type scratchPool struct{ p sync.Pool }

// get returns a buffer whose f holds exactly n floats, 64-byte aligned.
func (p *scratchPool) get(n int) *scratchBuf {
	const align = 16 // floats per 64 bytes
	b, ok := p.p.Get().(*scratchBuf)
	if !ok || len(b.raw) < n+align {
		b = &scratchBuf{raw: make([]float32, n+align)}
	}
	off := int(uintptr(unsafe.Pointer(&b.raw[0]))%64) / 4
	if off != 0 {
		off = align - off
	}
	b.f = b.raw[off : off+n : off+n]
	return b
}

// put returns b to the pool for a later get.
func (p *scratchPool) put(b *scratchBuf) { p.p.Put(b) }
