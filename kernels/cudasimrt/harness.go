//go:build cudasim

// The Go side of the runtime tests: thin wrappers over the CUDA runtime
// entry points of kernels/sim/cudart.cpp, the test kernels of
// rt_kernels.cc, kernels/cast.cu's launchers and the lsp_sim_ controls.
// Each wrapper reads the calling thread's message in the same locked OS
// thread as the call, since CUDA's last error is per thread.

package cudasimrt

/*
#cgo CFLAGS: -DLSP_SIM -I${SRCDIR}/.. -I${SRCDIR}/../sim
#cgo CXXFLAGS: -std=c++17 -DLSP_SIM -DLSP_CUDASIM -O1 -g -Wall -Wno-unknown-pragmas -fno-strict-aliasing
#cgo CXXFLAGS: -I${SRCDIR}/.. -I${SRCDIR}/../sim
#cgo LDFLAGS: -lpthread -lm
#include <stdint.h>
#include <stdlib.h>
#include "kernels.h"

cudaError_t rt_fill(float* out, int n, float v, cudaStream_t stream);
cudaError_t rt_axpb(float* x, int n, float a, float b, cudaStream_t stream);
cudaError_t rt_spin(const int* flag, int* seen, int timeout_ms, cudaStream_t stream);
cudaError_t rt_diverge(float* out, cudaStream_t stream);
cudaError_t rt_bad_block(float* out, cudaStream_t stream);
const void* rt_fill_kernel_ptr(void);

// Device and host addresses cross as uintptr_t, so Go never holds them as
// Go pointers.
static cudaError_t rt_malloc(uintptr_t* p, size_t n) {
	void* q = NULL;
	cudaError_t e = cudaMalloc(&q, n);
	*p = (uintptr_t)q;
	return e;
}
static cudaError_t rt_free(uintptr_t p) { return cudaFree((void*)p); }
static cudaError_t rt_host_alloc(uintptr_t* p, size_t n, unsigned flags) {
	void* q = NULL;
	cudaError_t e = cudaHostAlloc(&q, n, flags);
	*p = (uintptr_t)q;
	return e;
}
static cudaError_t rt_free_host(uintptr_t p) { return cudaFreeHost((void*)p); }
static cudaError_t rt_host_register(uintptr_t p, size_t n, unsigned flags) { return cudaHostRegister((void*)p, n, flags); }
static cudaError_t rt_host_unregister(uintptr_t p) { return cudaHostUnregister((void*)p); }
static cudaError_t rt_memcpy_async(uintptr_t dst, uintptr_t src, size_t n, int kind, cudaStream_t s) {
	return cudaMemcpyAsync((void*)dst, (const void*)src, n, (enum cudaMemcpyKind)kind, s);
}
static cudaError_t rt_memcpy(uintptr_t dst, uintptr_t src, size_t n, int kind) {
	return cudaMemcpy((void*)dst, (const void*)src, n, (enum cudaMemcpyKind)kind);
}
static cudaError_t rt_memset_async(uintptr_t p, int v, size_t n, cudaStream_t s) {
	return cudaMemsetAsync((void*)p, v, n, s);
}
static cudaError_t rt_memset_per_thread(uintptr_t p, size_t n) {
	return cudaMemsetAsync((void*)p, 0, n, cudaStreamPerThread);
}
static cudaError_t rt_malloc_managed(void) {
	void* q = NULL;
	return cudaMallocManaged(&q, 256, cudaMemAttachGlobal);
}
static cudaError_t rt_func_set_carveout(void) {
	return cudaFuncSetAttribute(rt_fill_kernel_ptr(), cudaFuncAttributePreferredSharedMemoryCarveout, 50);
}
static cudaError_t rt_func_set_max_dyn(int bytes) {
	return cudaFuncSetAttribute(rt_fill_kernel_ptr(), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
static cudaError_t rt_func_attrs(struct cudaFuncAttributes* a) { return cudaFuncGetAttributes(a, rt_fill_kernel_ptr()); }
static cudaError_t rt_launch_kernel(void) {
	dim3 g = {1, 1, 1};
	return cudaLaunchKernel(rt_fill_kernel_ptr(), g, g, NULL, 0, 0);
}

// A host function (cudaLaunchHostFunc) that counts its calls.
static void rt_count(void* p) { __atomic_add_fetch((int*)p, 1, __ATOMIC_SEQ_CST); }
static cudaError_t rt_host_func(cudaStream_t s, uintptr_t counter) {
	return cudaLaunchHostFunc(s, rt_count, (void*)counter);
}
static int rt_load_int(uintptr_t p) { return __atomic_load_n((int*)p, __ATOMIC_SEQ_CST); }
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// cudaErr is a CUDA error returned by a runtime call, with the runtime's
// message (lsp_sim_last_message) when it set one.
type cudaErr struct {
	Op   string
	Code int
	Name string
	Msg  string
}

func (e *cudaErr) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Op, e.Name, e.Code, e.Msg)
}

// codeOf returns the CUDA error code of err (0 for nil).
func codeOf(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := err.(*cudaErr); ok {
		return e.Code
	}
	return -1
}

// The error codes the tests name (driver_types.h).
const (
	errInvalidValue          = int(C.cudaErrorInvalidValue)
	errMemoryAllocation      = int(C.cudaErrorMemoryAllocation)
	errInvalidConfiguration  = int(C.cudaErrorInvalidConfiguration)
	errInvalidDevice         = int(C.cudaErrorInvalidDevice)
	errInvalidResourceHandle = int(C.cudaErrorInvalidResourceHandle)
	errNotReady              = int(C.cudaErrorNotReady)
	errLaunchFailure         = int(C.cudaErrorLaunchFailure)
	errIllegalAddress        = int(C.cudaErrorIllegalAddress)
	errNotSupported          = int(C.cudaErrorNotSupported)
	errMemcpyDirection       = int(C.cudaErrorInvalidMemcpyDirection)
	errAlreadyRegistered     = int(C.cudaErrorHostMemoryAlreadyRegistered)
	errNotRegistered         = int(C.cudaErrorHostMemoryNotRegistered)
)

// Copy kinds (cudaMemcpyKind).
const (
	h2h  = int(C.cudaMemcpyHostToHost)
	h2d  = int(C.cudaMemcpyHostToDevice)
	d2h  = int(C.cudaMemcpyDeviceToHost)
	d2d  = int(C.cudaMemcpyDeviceToDevice)
	dflt = int(C.cudaMemcpyDefault)
)

// Flags.
const (
	streamNonBlocking = uint(C.cudaStreamNonBlocking)
	eventDisableTim   = uint(C.cudaEventDisableTiming)
	eventInterprocess = uint(C.cudaEventInterprocess)
	hostAllocMapped   = uint(C.cudaHostAllocMapped)
	hostRegMapped     = uint(C.cudaHostRegisterMapped)
)

// Operation kinds of the trace (sim_api.h).
const (
	opKernel  = int(C.LSP_SIM_OP_KERNEL)
	opH2D     = int(C.LSP_SIM_OP_MEMCPY_H2D)
	opD2H     = int(C.LSP_SIM_OP_MEMCPY_D2H)
	opD2D     = int(C.LSP_SIM_OP_MEMCPY_D2D)
	opMemset  = int(C.LSP_SIM_OP_MEMSET)
	opRecord  = int(C.LSP_SIM_OP_EVENT_RECORD)
	opWait    = int(C.LSP_SIM_OP_WAIT)
	opHostFun = int(C.LSP_SIM_OP_HOST_FUNC)
)

type stream = C.cudaStream_t
type event = C.cudaEvent_t

// legacy is the legacy default stream (0).
var legacy stream

// call runs f on a locked OS thread and turns its code into an error with
// that thread's message.
func call(op string, f func() C.cudaError_t) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// As the generated launch shims do: an earlier call on this thread
	// may have left a last error, which a launcher would return as its own.
	C.cudaGetLastError()
	C.lsp_sim_clear_message()
	code := f()
	if code == C.cudaSuccess {
		return nil
	}
	return &cudaErr{Op: op, Code: int(code), Name: C.GoString(C.cudaGetErrorName(code)),
		Msg: C.GoString(C.lsp_sim_last_message())}
}

// codeOnly is call for codes that are no error (cudaErrorNotReady), which
// leave no message.
func codeOnly(op string, code C.cudaError_t) error {
	if code == C.cudaSuccess {
		return nil
	}
	return &cudaErr{Op: op, Code: int(code), Name: C.GoString(C.cudaGetErrorName(code))}
}

// lastError is cudaGetLastError (which clears a non-sticky error).
func lastError() int { return int(C.cudaGetLastError()) }

// peekError is cudaPeekAtLastError.
func peekError() int { return int(C.cudaPeekAtLastError()) }

func malloc(n int) (uintptr, error) {
	var p C.uintptr_t
	err := call("cudaMalloc", func() C.cudaError_t { return C.rt_malloc(&p, C.size_t(n)) })
	return uintptr(p), err
}

func free(p uintptr) error {
	return call("cudaFree", func() C.cudaError_t { return C.rt_free(C.uintptr_t(p)) })
}

func hostAlloc(n int, flags uint) (uintptr, error) {
	var p C.uintptr_t
	err := call("cudaHostAlloc", func() C.cudaError_t { return C.rt_host_alloc(&p, C.size_t(n), C.uint(flags)) })
	return uintptr(p), err
}

func freeHost(p uintptr) error {
	return call("cudaFreeHost", func() C.cudaError_t { return C.rt_free_host(C.uintptr_t(p)) })
}

func hostRegister(p uintptr, n int, flags uint) error {
	return call("cudaHostRegister", func() C.cudaError_t {
		return C.rt_host_register(C.uintptr_t(p), C.size_t(n), C.uint(flags))
	})
}

func hostUnregister(p uintptr) error {
	return call("cudaHostUnregister", func() C.cudaError_t { return C.rt_host_unregister(C.uintptr_t(p)) })
}

func memcpyAsync(dst, src uintptr, n, kind int, s stream) error {
	return call("cudaMemcpyAsync", func() C.cudaError_t {
		return C.rt_memcpy_async(C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.int(kind), s)
	})
}

func memcpySync(dst, src uintptr, n, kind int) error {
	return call("cudaMemcpy", func() C.cudaError_t {
		return C.rt_memcpy(C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.int(kind))
	})
}

func memsetAsync(p uintptr, v, n int, s stream) error {
	return call("cudaMemsetAsync", func() C.cudaError_t {
		return C.rt_memset_async(C.uintptr_t(p), C.int(v), C.size_t(n), s)
	})
}

func streamCreate(flags uint) (stream, error) {
	var s stream
	err := call("cudaStreamCreateWithFlags", func() C.cudaError_t { return C.cudaStreamCreateWithFlags(&s, C.uint(flags)) })
	return s, err
}

func streamDestroy(s stream) error {
	return call("cudaStreamDestroy", func() C.cudaError_t { return C.cudaStreamDestroy(s) })
}

func streamSync(s stream) error {
	return call("cudaStreamSynchronize", func() C.cudaError_t { return C.cudaStreamSynchronize(s) })
}

func streamQuery(s stream) error { return codeOnly("cudaStreamQuery", C.cudaStreamQuery(s)) }

func streamWaitEvent(s stream, e event, flags uint) error {
	return call("cudaStreamWaitEvent", func() C.cudaError_t { return C.cudaStreamWaitEvent(s, e, C.uint(flags)) })
}

func eventCreate(flags uint) (event, error) {
	var e event
	err := call("cudaEventCreateWithFlags", func() C.cudaError_t { return C.cudaEventCreateWithFlags(&e, C.uint(flags)) })
	return e, err
}

func eventDestroy(e event) error {
	return call("cudaEventDestroy", func() C.cudaError_t { return C.cudaEventDestroy(e) })
}

func eventRecord(e event, s stream) error {
	return call("cudaEventRecord", func() C.cudaError_t { return C.cudaEventRecord(e, s) })
}

func eventQuery(e event) error { return codeOnly("cudaEventQuery", C.cudaEventQuery(e)) }

func eventSync(e event) error {
	return call("cudaEventSynchronize", func() C.cudaError_t { return C.cudaEventSynchronize(e) })
}

func elapsed(a, b event) (float32, error) {
	var ms C.float
	err := call("cudaEventElapsedTime", func() C.cudaError_t { return C.cudaEventElapsedTime(&ms, a, b) })
	return float32(ms), err
}

func deviceSync() error {
	return call("cudaDeviceSynchronize", func() C.cudaError_t { return C.cudaDeviceSynchronize() })
}

func hostFunc(s stream, counter uintptr) error {
	return call("cudaLaunchHostFunc", func() C.cudaError_t { return C.rt_host_func(s, C.uintptr_t(counter)) })
}

// loadInt reads an int at a host address atomically (a counter a host
// function bumps on a stream's thread).
func loadInt(p uintptr) int { return int(C.rt_load_int(C.uintptr_t(p))) }

func memGetInfo() (free, total int, err error) {
	var f, t C.size_t
	err = call("cudaMemGetInfo", func() C.cudaError_t { return C.cudaMemGetInfo(&f, &t) })
	return int(f), int(t), err
}

// props is the part of cudaDeviceProp the tests check.
type props struct {
	Name                   string
	Major, Minor           int
	TotalGlobalMem         int
	SMs                    int
	SharedPerBlockOptin    int
	PCIBus, PCIDev, PCIDom int
	MaxThreadsPerBlock     int
	WarpSize               int
	ConcurrentKernels      int
}

func deviceProps(dev int) (props, error) {
	var p C.struct_cudaDeviceProp
	err := call("cudaGetDeviceProperties", func() C.cudaError_t { return C.cudaGetDeviceProperties(&p, C.int(dev)) })
	return props{
		Name: C.GoString(&p.name[0]), Major: int(p.major), Minor: int(p.minor),
		TotalGlobalMem: int(p.totalGlobalMem), SMs: int(p.multiProcessorCount),
		SharedPerBlockOptin: int(p.sharedMemPerBlockOptin),
		PCIBus:              int(p.pciBusID), PCIDev: int(p.pciDeviceID), PCIDom: int(p.pciDomainID),
		MaxThreadsPerBlock: int(p.maxThreadsPerBlock), WarpSize: int(p.warpSize),
		ConcurrentKernels: int(p.concurrentKernels),
	}, err
}

// The device attributes the tests read.
const (
	attrMajor      = int(C.cudaDevAttrComputeCapabilityMajor)
	attrMinor      = int(C.cudaDevAttrComputeCapabilityMinor)
	attrSMs        = int(C.cudaDevAttrMultiProcessorCount)
	attrSmemOptin  = int(C.cudaDevAttrMaxSharedMemoryPerBlockOptin)
	attrPCIBus     = int(C.cudaDevAttrPciBusId)
	attrTexPitch   = int(C.cudaDevAttrTexturePitchAlignment) // not simulated
	attrWarpSize   = int(C.cudaDevAttrWarpSize)
	attrMaxThreads = int(C.cudaDevAttrMaxThreadsPerBlock)
)

func deviceAttr(attr, dev int) (int, error) {
	var v C.int
	err := call("cudaDeviceGetAttribute", func() C.cudaError_t {
		return C.cudaDeviceGetAttribute(&v, C.enum_cudaDeviceAttr(attr), C.int(dev))
	})
	return int(v), err
}

func deviceCount() (int, error) {
	var n C.int
	err := call("cudaGetDeviceCount", func() C.cudaError_t { return C.cudaGetDeviceCount(&n) })
	return int(n), err
}

func setDevice(d int) error {
	return call("cudaSetDevice", func() C.cudaError_t { return C.cudaSetDevice(C.int(d)) })
}

func getDevice() (int, error) {
	var d C.int
	err := call("cudaGetDevice", func() C.cudaError_t { return C.cudaGetDevice(&d) })
	return int(d), err
}

// funcAttrs returns rt_fill_kernel's maxThreadsPerBlock and
// maxDynamicSharedSizeBytes.
func funcAttrs() (maxThreads, maxDyn int, err error) {
	var a C.struct_cudaFuncAttributes
	err = call("cudaFuncGetAttributes", func() C.cudaError_t { return C.rt_func_attrs(&a) })
	return int(a.maxThreadsPerBlock), int(a.maxDynamicSharedSizeBytes), err
}

func funcSetMaxDyn(bytes int) error {
	return call("cudaFuncSetAttribute", func() C.cudaError_t { return C.rt_func_set_max_dyn(C.int(bytes)) })
}

// unsupportedCalls are entry points and flags the runtime must refuse,
// each returning its code.
var unsupportedCalls = map[string]func() error{
	"cudaMallocManaged": func() error { return call("cudaMallocManaged", func() C.cudaError_t { return C.rt_malloc_managed() }) },
	"cudaDeviceReset":   func() error { return call("cudaDeviceReset", func() C.cudaError_t { return C.cudaDeviceReset() }) },
	"cudaLaunchKernel":  func() error { return call("cudaLaunchKernel", func() C.cudaError_t { return C.rt_launch_kernel() }) },
	"cudaFuncSetAttribute(carveout)": func() error {
		return call("cudaFuncSetAttribute", func() C.cudaError_t { return C.rt_func_set_carveout() })
	},
	"cudaHostAlloc(Mapped)": func() error {
		p, err := hostAlloc(4096, hostAllocMapped)
		if err == nil {
			_ = freeHost(p)
		}
		return err
	},
	"cudaHostRegister(Mapped)": func() error {
		q := C.malloc(8192)
		defer C.free(q)
		return hostRegister(uintptr(q), 8192, hostRegMapped)
	},
	"cudaEventCreateWithFlags(Interprocess)": func() error {
		e, err := eventCreate(eventInterprocess | eventDisableTim)
		if err == nil {
			_ = eventDestroy(e)
		}
		return err
	},
	"cudaStreamWaitEvent(External)": func() error {
		e, err := eventCreate(0)
		if err != nil {
			return err
		}
		defer func() { _ = eventDestroy(e) }()
		return streamWaitEvent(legacy, e, uint(C.cudaEventWaitExternal))
	},
	"cudaMemcpy(HostToHost)": func() error {
		a := C.malloc(16)
		b := C.malloc(16)
		defer C.free(a)
		defer C.free(b)
		return memcpySync(uintptr(a), uintptr(b), 16, h2h)
	},
	"cudaMemsetAsync(cudaStreamPerThread)": func() error {
		p, err := malloc(64)
		if err != nil {
			return err
		}
		defer func() { _ = free(p) }()
		return call("cudaMemsetAsync", func() C.cudaError_t { return C.rt_memset_per_thread(C.uintptr_t(p), 64) })
	},
}

// Test kernels (rt_kernels.cc) and kernels/cast.cu launchers.

func fill(out uintptr, n int, v float32, s stream) error {
	return call("rt_fill", func() C.cudaError_t { return C.rt_fill((*C.float)(ptr(out)), C.int(n), C.float(v), s) })
}

func axpb(x uintptr, n int, a, b float32, s stream) error {
	return call("rt_axpb", func() C.cudaError_t {
		return C.rt_axpb((*C.float)(ptr(x)), C.int(n), C.float(a), C.float(b), s)
	})
}

func spin(flag, seen uintptr, timeoutMS int, s stream) error {
	return call("rt_spin", func() C.cudaError_t {
		return C.rt_spin((*C.int)(ptr(flag)), (*C.int)(ptr(seen)), C.int(timeoutMS), s)
	})
}

func diverge(out uintptr, s stream) error {
	return call("rt_diverge", func() C.cudaError_t { return C.rt_diverge((*C.float)(ptr(out)), s) })
}

func badBlock(out uintptr, s stream) error {
	return call("rt_bad_block", func() C.cudaError_t { return C.rt_bad_block((*C.float)(ptr(out)), s) })
}

func castF32ToBF16(out, in uintptr, n int, s stream) error {
	return call("lsp_cast_f32_to_bf16", func() C.cudaError_t {
		return C.lsp_cast_f32_to_bf16((*C.__nv_bfloat16)(ptr(out)), (*C.float)(ptr(in)), C.longlong(n), s)
	})
}

func castBF16ToF32(out, in uintptr, n int, s stream) error {
	return call("lsp_cast_bf16_to_f32", func() C.cudaError_t {
		return C.lsp_cast_bf16_to_f32((*C.float)(ptr(out)), (*C.__nv_bfloat16)(ptr(in)), C.longlong(n), s)
	})
}

func sumSquares(out, x uintptr, n int, work uintptr, s stream) error {
	return call("lsp_sum_squares", func() C.cudaError_t {
		return C.lsp_sum_squares((*C.float)(ptr(out)), ptr(x), 0, C.longlong(n), (*C.double)(ptr(work)), s)
	})
}

// sumSquaresWork is the size of lsp_sum_squares's work buffer in doubles.
const sumSquaresWork = int(C.LSP_SUM_SQUARES_WORK)

// ptr turns a C address (device or pinned memory, never Go memory) into
// the pointer a C function takes.
func ptr(p uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}

// Simulator controls (sim_api.h).

func setDeviceMemory(bytes int) bool { return C.lsp_sim_set_device_memory(C.size_t(bytes)) == 0 }

func setDelays(seed uint64, maxUS uint) { C.lsp_sim_set_delays(C.uint64_t(seed), C.uint(maxUS)) }

func traceOn(on bool) {
	v := C.int(0)
	if on {
		v = 1
	}
	C.lsp_sim_trace(v)
}

// opTime is one executed operation (lsp_sim_op_time).
type opTime struct {
	Stream     uintptr
	Seq        uint64
	Kind       int
	Status     int
	DelayUS    uint
	Start, End int64
	Name       string
}

func traceRead() []opTime {
	n := C.lsp_sim_trace_read(nil, 0)
	if n == 0 {
		return nil
	}
	buf := make([]C.lsp_sim_op_time, int(n))
	got := C.lsp_sim_trace_read(&buf[0], C.longlong(n))
	if got < n {
		n = got
	}
	out := make([]opTime, 0, int(n))
	for _, t := range buf[:int(n)] {
		out = append(out, opTime{Stream: uintptr(t.stream), Seq: uint64(t.seq), Kind: int(t.kind), Status: int(t.status),
			DelayUS: uint(t.delay_us), Start: int64(t.start_ns), End: int64(t.end_ns), Name: C.GoString(&t.name[0])})
	}
	return out
}

func pageableCopies() int64 { return int64(C.lsp_sim_pageable_copies()) }

func clearSticky() int { return int(C.lsp_sim_clear_sticky_error()) }

// handle is a stream's value as the trace records it.
func handle(s stream) uintptr { return uintptr(unsafe.Pointer(s)) }

// buildInfo is lsp_sim_build_info (for the stale-build check).
func buildInfo() string { return C.GoString(C.lsp_sim_build_info()) }
