//go:build lsp_sim || cuda

package simtest

import "testing"

// TestGPUPlacement: in the GPU mode every buffer lies inside its
// allocation with its canary pages, placed as the simulator places it.
func TestGPUPlacement(t *testing.T) {
	for _, base := range []uintptr{0x7f0000000000, 0x7f0000000100, 0x7f0000000f00, 0x7f0000200000 + 512} {
		for _, bytes := range []int{0, 1, 2, 12, 255, 256, 4095, 4096, 4097, 10000, 1 << 20} {
			for _, align := range []int{1, 2, 16, 256, 4096} {
				for _, before := range []bool{false, true} {
					size := gpuAllocSize(bytes, align, before)
					data := gpuDataOffset(base, bytes, align, before)
					start, end := base+uintptr(data), base+uintptr(data+bytes)
					switch {
					case data < 0 || data+bytes > size:
						t.Fatalf("base %#x bytes %d align %d before %v: buffer [%d, %d) outside the %d-byte allocation",
							base, bytes, align, before, data, data+bytes, size)
					case before && (start%gpuPage != 0 || data < gpuPage):
						t.Errorf("before: bytes %d at offset %d (address %#x): not a page start after a page of canaries", bytes, data, start)
					case !before && start%uintptr(align) != 0:
						t.Errorf("bytes %d align %d: start %#x not aligned", bytes, align, start)
					case !before && align == 1 && end%gpuPage != 0:
						t.Errorf("bytes %d: end %#x not at a page boundary", bytes, end)
					case !before && int(uintptr(gpuPage)-end%gpuPage)%gpuPage >= align:
						t.Errorf("bytes %d align %d: %d bytes between the end and the page boundary", bytes, align, int(gpuPage-end%gpuPage))
					case !before && size-(data+bytes) < gpuPage:
						t.Errorf("bytes %d align %d: only %d bytes after the buffer for canaries", bytes, align, size-(data+bytes))
					}
				}
			}
		}
	}
}
