// buffer.go: off-heap host buffers: anonymous mmap, 2 MiB aligned, advised
// for transparent huge pages, optionally locked in RAM, viewed as []float32
// or []uint16. A later step registers them with CUDA as pinned memory; the C
// kernels may read and write them because they are not Go heap.
//
// Limits: Linux (mmap, madvise, mlock). The memory is not garbage collected:
// Free it explicitly, and do not use any view after Free (the pages are
// gone: a use is a fault, not a Go error). Huge pages are a hint; the
// kernel may ignore it.

package host

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HostBufferAlign is the alignment of every HostBuffer (one x86 huge page).
const HostBufferAlign = 2 << 20

// HostBufferOptions configures NewHostBuffer.
type HostBufferOptions struct {
	// Lock keeps the pages resident (mlock); it fails when RLIMIT_MEMLOCK
	// is too small and the process lacks CAP_IPC_LOCK.
	Lock bool
	// NoHugePages skips the MADV_HUGEPAGE hint.
	NoHugePages bool
}

// HostBuffer is an off-heap allocation. The zero value is an empty, freed
// buffer.
type HostBuffer struct {
	base   unsafe.Pointer // start of the mapping (before alignment)
	mapLen uintptr        // length of the mapping
	mem    []byte         // the aligned, usable part
	locked bool
}

// NewHostBuffer maps size bytes (rounded up to whole huge pages), zeroed,
// aligned to HostBufferAlign.
func NewHostBuffer(size int, opt HostBufferOptions) (*HostBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("host: buffer size %d, want > 0", size)
	}
	const align = HostBufferAlign
	usable := (uintptr(size) + align - 1) &^ (align - 1)
	// Map one extra huge page so an aligned start exists inside, then give
	// back the ends; the mapping we keep is exactly the aligned range.
	total := usable + align
	p, err := unix.MmapPtr(-1, 0, nil, total, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("host: mmap of %d bytes: %w", total, err)
	}
	head := (align - uintptr(p)%align) % align
	if head > 0 {
		if err := unix.MunmapPtr(p, head); err != nil {
			_ = unix.MunmapPtr(p, total)
			return nil, fmt.Errorf("host: trimming buffer head: %w", err)
		}
	}
	start := unsafe.Add(p, head)
	if tail := total - head - usable; tail > 0 {
		if err := unix.MunmapPtr(unsafe.Add(start, usable), tail); err != nil {
			_ = unix.MunmapPtr(start, usable)
			return nil, fmt.Errorf("host: trimming buffer tail: %w", err)
		}
	}
	b := &HostBuffer{base: start, mapLen: usable, mem: unsafe.Slice((*byte)(start), usable)[:size:size]}
	if !opt.NoHugePages {
		// EINVAL means THP is compiled out: the buffer still works.
		if err := unix.Madvise(unsafe.Slice((*byte)(start), usable), unix.MADV_HUGEPAGE); err != nil && err != unix.EINVAL {
			b.Free()
			return nil, fmt.Errorf("host: madvise(MADV_HUGEPAGE) on %d bytes: %w", usable, err)
		}
	}
	if opt.Lock {
		if err := unix.Mlock(unsafe.Slice((*byte)(start), usable)); err != nil {
			b.Free()
			return nil, fmt.Errorf("host: mlock of %d bytes (see ulimit -l): %w", usable, err)
		}
		b.locked = true
	}
	return b, nil
}

// Len returns the size asked for, in bytes.
func (b *HostBuffer) Len() int { return len(b.mem) }

// Locked reports whether the pages are locked in RAM.
func (b *HostBuffer) Locked() bool { return b.locked }

// Ptr returns the start of the buffer, for registration with a device
// driver; nil after Free.
func (b *HostBuffer) Ptr() unsafe.Pointer { return b.base }

// Bytes returns the whole buffer as bytes.
func (b *HostBuffer) Bytes() []byte { return b.mem }

// check validates a view of n elements of size elem at byte offset off.
func (b *HostBuffer) check(what string, off, n, elem int) error {
	if b.mem == nil {
		return fmt.Errorf("host: %s view of a freed buffer", what)
	}
	if off < 0 || n < 0 || off%elem != 0 {
		return fmt.Errorf("host: %s view at offset %d, length %d: offset must be a non-negative multiple of %d", what, off, n, elem)
	}
	if off > len(b.mem) || n > (len(b.mem)-off)/elem {
		return fmt.Errorf("host: %s view [%d, %d+%d*%d) outside a buffer of %d bytes", what, off, off, n, elem, len(b.mem))
	}
	return nil
}

// Float32s returns n float32 starting at byte offset off.
func (b *HostBuffer) Float32s(off, n int) ([]float32, error) {
	return hostView[float32](b, "float32", off, n)
}

// Uint16s returns n uint16 (bf16 or fp16 bits) starting at byte offset off.
func (b *HostBuffer) Uint16s(off, n int) ([]uint16, error) {
	return hostView[uint16](b, "uint16", off, n)
}

// hostView returns n elements of T (named what in errors) starting at byte
// offset off of b.
func hostView[T float32 | uint16](b *HostBuffer, what string, off, n int) ([]T, error) {
	var zero T
	if err := b.check(what, off, n, int(unsafe.Sizeof(zero))); err != nil {
		return nil, err
	}
	if n == 0 {
		return []T{}, nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b.mem[off:][:1][0])), n)[:n:n], nil
}

// Free unmaps the buffer. Views taken from it must not be used afterwards.
// Freeing twice is a no-op.
func (b *HostBuffer) Free() error {
	if b.base == nil {
		return nil
	}
	p, n := b.base, b.mapLen
	b.base, b.mapLen, b.mem, b.locked = nil, 0, nil, false
	if err := unix.MunmapPtr(p, n); err != nil {
		return fmt.Errorf("host: munmap of %d bytes: %w", n, err)
	}
	return nil
}
