// mmap_linux.go: OpenMapped maps a file read-only instead of reading it, so
// that a shard of several gigabytes never enters the Go heap; the kernel
// pages it in as tensors are read, and Release hands pages back once a
// tensor has been consumed.
//
// Limits: Linux only (other systems read the file, see mmap_other.go). The
// mapping is shared and read-only: writing the bytes Raw returns faults.
// A file truncated by another process while mapped makes reads beyond
// the new end fault (SIGBUS), as with any mmap reader.

//go:build linux

package safetensors

import (
	"fmt"
	"os"
	"syscall"
)

// OpenMapped opens path like Open, but maps the file instead of reading
// it. The header is parsed from the mapping, so its validation is bounded
// by the file's real size exactly as Open's. Close unmaps it; the bytes Raw
// returned must not be used afterwards.
func OpenMapped(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	size := st.Size()
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("safetensors: %s: not a regular file", path)
	}
	if size == 0 || int64(int(size)) != size {
		// Nothing to map (mmap of 0 bytes is EINVAL); parse reports the
		// short file with its usual message.
		return Open(path)
	}
	buf, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: mmap: %w", path, err)
	}
	f, err := parse(path, buf)
	if err != nil {
		_ = syscall.Munmap(buf)
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f.mapped = buf
	return f, nil
}

// release drops the resident pages of the mapping's bytes [lo, hi) from
// this process; the page cache keeps them, so a later read faults them
// back in.
func (f *File) release(lo, hi int) {
	if f.mapped == nil || hi <= lo {
		return
	}
	// Widen to whole pages: dropping a neighbour's clean page costs at
	// most a re-read, never data.
	page := os.Getpagesize()
	lo -= lo % page
	hi = min(hi+(page-hi%page)%page, len(f.mapped))
	_ = syscall.Madvise(f.mapped[lo:hi], syscall.MADV_DONTNEED)
}

func (f *File) unmap() error {
	if f.mapped == nil {
		return nil
	}
	err := syscall.Munmap(f.mapped)
	f.mapped, f.data = nil, nil
	if err != nil {
		return fmt.Errorf("safetensors: %s: munmap: %w", f.Path, err)
	}
	return nil
}
