//go:build lsp_sim || cuda

package simtest

// Where a buffer lies in its managed allocation in the GPU mode
// (mem_cuda.go): the simulator's placement (sim.cpp, lsp_sim_alloc) with
// canary bytes where the simulator has its guard page. Plain arithmetic,
// tested in both modes (TestGPUPlacement).

// gpuPage is the granule buffers are placed in: the simulator's page size
// on x86-64 Linux.
const gpuPage = 4096

// canaryByte fills the bytes around a buffer inside its allocation.
const canaryByte = 0xA5

// gpuAllocSize is the size of the allocation holding a buffer of bytes:
// up to a page to reach a page boundary, the pages the simulator would map
// for the buffer (plus a page of canaries before it, with before), and a
// page of canaries after them.
func gpuAllocSize(bytes, align int, before bool) int {
	if align < 1 {
		align = 1
	}
	region := (bytes + align - 1 + gpuPage - 1) / gpuPage * gpuPage
	if before {
		region = gpuPage + (bytes+gpuPage-1)/gpuPage*gpuPage
	}
	return gpuPage + region + gpuPage
}

// gpuDataOffset is the offset of the buffer in an allocation of
// gpuAllocSize bytes at base: with before, at the page boundary after a
// page of canaries; else ending at a page boundary, its start rounded down
// to align (as the simulator does, so the start is aligned only as far as
// the size allows when align is 1).
func gpuDataOffset(base uintptr, bytes, align int, before bool) int {
	if align < 1 {
		align = 1
	}
	first := int((gpuPage - base%gpuPage) % gpuPage) // the first page boundary
	if before {
		return first + gpuPage
	}
	region := (bytes + align - 1 + gpuPage - 1) / gpuPage * gpuPage
	end := base + uintptr(first+region)
	return int((end-uintptr(bytes))&^uintptr(align-1) - base)
}
