// mmap_other.go: without mmap support here, OpenMapped reads the file.

//go:build !linux

package safetensors

// OpenMapped is Open on systems where this package does not map files.
func OpenMapped(path string) (*File, error) { return Open(path) }

func (f *File) release(lo, hi int) {}

func (f *File) unmap() error {
	f.data = nil
	return nil
}
