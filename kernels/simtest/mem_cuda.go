//go:build cuda

// The GPU mode of the harness: buffers in CUDA managed memory, so the
// tests' host views (Float32, Uint16, ...) read and write them directly
// once the device is idle, which every launch ensures (launches are
// synchronous in this mode).
//
// Placement copies the simulator's, so the kernels' alignment-dependent
// paths run as they do there: Alloc ends the buffer at a page boundary
// (its start is aligned only as far as its size allows), AllocAligned
// rounds the start down to the alignment, AllocBefore starts at a page.
// Where the simulator has a guard page, the rest of that page holds canary
// bytes, checked when the buffer is freed: a kernel writing past either
// end fails the test (a read past it goes unnoticed on a GPU).

package simtest

/*
#include <cuda_runtime_api.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// SetSeed does nothing on a GPU: the hardware picks its own thread orders.
// Tests still loop over Seeds, which reruns each launch (a kernel whose
// result depends on the schedule shows up as a difference between runs
// where a test compares them).
func SetSeed(uint64) {}

// devMem is one managed allocation holding a buffer and its canaries.
type devMem struct {
	base  unsafe.Pointer // from cudaMallocManaged
	size  int            // bytes at base
	data  int            // offset of the buffer in the allocation
	bytes int            // the buffer's size
}

// canaries returns the byte ranges checked around the buffer: up to a
// page on each side.
func (m devMem) canaries() [2][2]int {
	return [2][2]int{{max(0, m.data-gpuPage), m.data}, {m.data + m.bytes, min(m.size, m.data+m.bytes+gpuPage)}}
}

func cudaErr(op string, code C.cudaError_t) error {
	return fmt.Errorf("%s: %s (%s)", op, C.GoString(C.cudaGetErrorName(code)), C.GoString(C.cudaGetErrorString(code)))
}

func devAlloc(bytes, align int, before bool) (unsafe.Pointer, devMem, error) {
	size := gpuAllocSize(bytes, align, before)
	var base unsafe.Pointer
	if code := C.cudaMallocManaged(&base, C.size_t(size), C.cudaMemAttachGlobal); code != C.cudaSuccess {
		return nil, devMem{}, cudaErr("cudaMallocManaged", code)
	}
	m := devMem{base: base, size: size, bytes: bytes, data: gpuDataOffset(uintptr(base), bytes, align, before)}
	all := unsafe.Slice((*byte)(base), size)
	for _, r := range m.canaries() {
		for i := r[0]; i < r[1]; i++ {
			all[i] = canaryByte
		}
	}
	for i := m.data; i < m.data+bytes; i++ {
		all[i] = 0xFF
	}
	return unsafe.Add(base, m.data), m, nil
}

func devFree(_ unsafe.Pointer, m devMem) error {
	var err error
	if code := C.cudaDeviceSynchronize(); code != C.cudaSuccess {
		err = cudaErr("cudaDeviceSynchronize before cudaFree", code)
	} else {
		all := unsafe.Slice((*byte)(m.base), m.size)
		for _, r := range m.canaries() {
			for i := r[0]; i < r[1] && err == nil; i++ {
				if all[i] != canaryByte {
					err = fmt.Errorf("was written outside its bytes (canary byte at offset %d from its start overwritten)", i-m.data)
				}
			}
		}
	}
	if code := C.cudaFree(m.base); code != C.cudaSuccess && err == nil {
		err = cudaErr("cudaFree", code)
	}
	return err
}

// DeviceInfo describes the GPU the tests run on, or why none can be used
// (no device, no driver, or one older than sm_80, which the kernels need).
func DeviceInfo() (string, error) {
	var n C.int
	if code := C.cudaGetDeviceCount(&n); code != C.cudaSuccess {
		return "", cudaErr("cudaGetDeviceCount", code)
	}
	if n == 0 {
		return "", fmt.Errorf("cudaGetDeviceCount found no device")
	}
	var prop C.struct_cudaDeviceProp
	if code := C.cudaGetDeviceProperties(&prop, 0); code != C.cudaSuccess {
		return "", cudaErr("cudaGetDeviceProperties", code)
	}
	var drv, rt C.int
	C.cudaDriverGetVersion(&drv)
	C.cudaRuntimeGetVersion(&rt)
	desc := fmt.Sprintf("device 0 of %d: %s, sm_%d%d, %d MiB, driver %d, runtime %d", int(n),
		C.GoString(&prop.name[0]), int(prop.major), int(prop.minor), int(prop.totalGlobalMem>>20), int(drv), int(rt))
	if prop.major < 8 {
		return desc, fmt.Errorf("%s: the kernels need sm_80 or newer", desc)
	}
	return desc, nil
}
