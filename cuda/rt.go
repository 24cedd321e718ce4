//go:build cuda || cudasim

// rt.go: the CUDA runtime calls of the backend, each a small C wrapper
// called through cgo, returning CUDA's error as a Go error (kernels.Error:
// the call, CUDA's name and description). These are the only runtime
// entry points the backend uses besides the launchers (package kernels)
// and the device discovery (discover_*.go):
//
//	cudaSetDevice, cudaMemGetInfo, cudaMalloc, cudaFree, cudaHostAlloc
//	(portable), cudaFreeHost, cudaMemcpyAsync (H2D, D2H, D2D),
//	cudaMemsetAsync, cudaStreamCreateWithFlags (non-blocking),
//	cudaStreamDestroy, cudaStreamSynchronize, cudaStreamWaitEvent,
//	cudaEventCreateWithFlags (default: timing on), cudaEventDestroy,
//	cudaEventRecord, cudaEventSynchronize, cudaEventQuery,
//	cudaEventElapsedTime, cudaGetLastError (to clear a failed
//	allocation), and through kernels.NewError cudaGetErrorName and
//	cudaGetErrorString.
//
// Elsewhere: cudaGetDeviceCount and cudaGetDeviceProperties find the
// devices of the simulated build (discover_sim.go; the GPU build asks the
// driver through cu), and the tests' gates use cudaLaunchHostFunc
// (testhooks.go). The launchers themselves call cudaFuncSetAttribute and
// cudaGetLastError, and the generated face cudaDeviceSynchronize when
// kernels.SetSynchronous is on.
//
// Every wrapper but the host waits (lspcu_event_*) counts a call made off a
// backend's device thread (a thread that did not call lspcu_mark_worker):
// the device-goroutine rule as a number tests can read (offWorkerCalls).
// The host waits make the device current on the calling thread first, in
// the same C call, since a host goroutine may run on any OS thread.

package cuda

/*
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

static __thread int lspcu_worker;
static long long lspcu_off_worker;

static void lspcu_mark_worker(void) { lspcu_worker = 1; }
static long long lspcu_off_worker_calls(void) { return __atomic_load_n(&lspcu_off_worker, __ATOMIC_RELAXED); }

#define LSPCU_ON_WORKER() \
	do { if (!lspcu_worker) __atomic_fetch_add(&lspcu_off_worker, 1, __ATOMIC_RELAXED); } while (0)

static int lspcu_set_device(int dev) {
	LSPCU_ON_WORKER();
	return (int)cudaSetDevice(dev);
}

static int lspcu_mem_get_info(size_t* free_bytes, size_t* total_bytes) {
	LSPCU_ON_WORKER();
	return (int)cudaMemGetInfo(free_bytes, total_bytes);
}

static int lspcu_malloc(uintptr_t* p, size_t n) {
	void* q = NULL;
	LSPCU_ON_WORKER();
	int e = (int)cudaMalloc(&q, n);
	*p = (uintptr_t)q;
	if (e != 0) (void)cudaGetLastError(); // an out-of-memory is not sticky
	return e;
}

static int lspcu_free(uintptr_t p) {
	LSPCU_ON_WORKER();
	return (int)cudaFree((void*)p);
}

static int lspcu_host_alloc(void** p, size_t n) {
	LSPCU_ON_WORKER();
	*p = NULL;
	int e = (int)cudaHostAlloc(p, n, cudaHostAllocPortable);
	if (e != 0) (void)cudaGetLastError();
	return e;
}

static int lspcu_free_host(void* p) {
	LSPCU_ON_WORKER();
	return (int)cudaFreeHost(p);
}

// kind: 1 host to device, 2 device to host, 3 device to device.
static int lspcu_memcpy_async(uintptr_t dst, uintptr_t src, size_t n, int kind, uintptr_t stream) {
	LSPCU_ON_WORKER();
	enum cudaMemcpyKind k = kind == 1 ? cudaMemcpyHostToDevice : kind == 2 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
	return (int)cudaMemcpyAsync((void*)dst, (const void*)src, n, k, (cudaStream_t)stream);
}

static int lspcu_memset_async(uintptr_t p, int v, size_t n, uintptr_t stream) {
	LSPCU_ON_WORKER();
	return (int)cudaMemsetAsync((void*)p, v, n, (cudaStream_t)stream);
}

static int lspcu_stream_create(uintptr_t* s) {
	cudaStream_t q = NULL;
	LSPCU_ON_WORKER();
	int e = (int)cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking);
	*s = (uintptr_t)q;
	return e;
}

static int lspcu_stream_destroy(uintptr_t s) {
	LSPCU_ON_WORKER();
	return (int)cudaStreamDestroy((cudaStream_t)s);
}

static int lspcu_stream_synchronize(uintptr_t s) {
	LSPCU_ON_WORKER();
	return (int)cudaStreamSynchronize((cudaStream_t)s);
}

static int lspcu_stream_wait_event(uintptr_t s, uintptr_t ev) {
	LSPCU_ON_WORKER();
	return (int)cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0);
}

static int lspcu_event_create(uintptr_t* ev) {
	cudaEvent_t q = NULL;
	LSPCU_ON_WORKER();
	int e = (int)cudaEventCreateWithFlags(&q, cudaEventDefault);
	*ev = (uintptr_t)q;
	return e;
}

static int lspcu_event_destroy(uintptr_t ev) {
	LSPCU_ON_WORKER();
	return (int)cudaEventDestroy((cudaEvent_t)ev);
}

static int lspcu_event_record(uintptr_t ev, uintptr_t s) {
	LSPCU_ON_WORKER();
	return (int)cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);
}

// The host waits: any thread, the device made current first.
static int lspcu_event_synchronize(int dev, uintptr_t ev) {
	int e = (int)cudaSetDevice(dev);
	if (e != 0) return e;
	return (int)cudaEventSynchronize((cudaEvent_t)ev);
}

// lspcu_event_elapsed queries both events (cudaErrorNotReady in *which = 1
// or 2 when one has not completed) and then reads the time between them.
static int lspcu_event_elapsed(int dev, uintptr_t a, uintptr_t b, float* ms, int* which) {
	*which = 0;
	int e = (int)cudaSetDevice(dev);
	if (e != 0) return e;
	e = (int)cudaEventQuery((cudaEvent_t)a);
	if (e != 0) {
		*which = 1;
		return e;
	}
	e = (int)cudaEventQuery((cudaEvent_t)b);
	if (e != 0) {
		*which = 2;
		return e;
	}
	return (int)cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b);
}

static int lspcu_not_ready(void) { return (int)cudaErrorNotReady; }
static int lspcu_oom(void) { return (int)cudaErrorMemoryAllocation; }
*/
import "C"

import (
	"runtime"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/kernels"
)

// Handles of the runtime, as integers (Go never dereferences them).
type (
	devPtr    uintptr // device memory
	rtStream  uintptr // cudaStream_t
	rtEvent   uintptr // cudaEvent_t
	copyKind  int     // direction of a cudaMemcpyAsync
	errorCode int     // cudaError_t
)

const (
	h2d copyKind = 1
	d2h copyKind = 2
	d2d copyKind = 3
)

var (
	codeNotReady = errorCode(C.lspcu_not_ready())
	codeOOM      = errorCode(C.lspcu_oom())
)

// rtErr is nil for cudaSuccess, else the *kernels.Error of the call op,
// with the simulated runtime's message when there is one (the caller is on
// the thread of the call: the device thread, or locked, see
// rtEventSynchronize).
func rtErr(op string, code C.int) error {
	if code == 0 {
		return nil
	}
	return kernels.NewError(op, int(code), lastMessage())
}

// codeOf is the cudaError_t of an error from rtErr (0 for anything else).
func codeOf(err error) errorCode {
	if e, ok := err.(*kernels.Error); ok {
		return errorCode(e.Code)
	}
	return 0
}

func markWorker()           { C.lspcu_mark_worker() }
func offWorkerCalls() int64 { return int64(C.lspcu_off_worker_calls()) }

func rtSetDevice(dev int) error { return rtErr("cudaSetDevice", C.lspcu_set_device(C.int(dev))) }

func rtMemGetInfo() (free, total int64, err error) {
	var f, t C.size_t
	err = rtErr("cudaMemGetInfo", C.lspcu_mem_get_info(&f, &t))
	return int64(f), int64(t), err
}

func rtMalloc(n int64) (devPtr, error) {
	var p C.uintptr_t
	err := rtErr("cudaMalloc", C.lspcu_malloc(&p, C.size_t(n)))
	return devPtr(p), err
}

func rtFree(p devPtr) error { return rtErr("cudaFree", C.lspcu_free(C.uintptr_t(p))) }

func rtHostAlloc(n int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := rtErr("cudaHostAlloc", C.lspcu_host_alloc(&p, C.size_t(n)))
	return p, err
}

func rtFreeHost(p unsafe.Pointer) error { return rtErr("cudaFreeHost", C.lspcu_free_host(p)) }

func rtMemcpyAsync(dst, src uintptr, n int64, kind copyKind, s rtStream) error {
	return rtErr("cudaMemcpyAsync", C.lspcu_memcpy_async(C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), C.int(kind), C.uintptr_t(s)))
}

func rtMemsetAsync(p devPtr, v int, n int64, s rtStream) error {
	return rtErr("cudaMemsetAsync", C.lspcu_memset_async(C.uintptr_t(p), C.int(v), C.size_t(n), C.uintptr_t(s)))
}

func rtStreamCreate() (rtStream, error) {
	var s C.uintptr_t
	err := rtErr("cudaStreamCreateWithFlags", C.lspcu_stream_create(&s))
	return rtStream(s), err
}

func rtStreamDestroy(s rtStream) error {
	return rtErr("cudaStreamDestroy", C.lspcu_stream_destroy(C.uintptr_t(s)))
}

func rtStreamSynchronize(s rtStream) error {
	return rtErr("cudaStreamSynchronize", C.lspcu_stream_synchronize(C.uintptr_t(s)))
}

func rtStreamWaitEvent(s rtStream, e rtEvent) error {
	return rtErr("cudaStreamWaitEvent", C.lspcu_stream_wait_event(C.uintptr_t(s), C.uintptr_t(e)))
}

func rtEventCreate() (rtEvent, error) {
	var e C.uintptr_t
	err := rtErr("cudaEventCreateWithFlags", C.lspcu_event_create(&e))
	return rtEvent(e), err
}

func rtEventDestroy(e rtEvent) error {
	return rtErr("cudaEventDestroy", C.lspcu_event_destroy(C.uintptr_t(e)))
}

func rtEventRecord(e rtEvent, s rtStream) error {
	return rtErr("cudaEventRecord", C.lspcu_event_record(C.uintptr_t(e), C.uintptr_t(s)))
}

// rtEventSynchronize waits on the calling thread (any thread) for the
// latest record of e on device dev.
func rtEventSynchronize(dev int, e rtEvent) error {
	runtime.LockOSThread() // the message of a failure is this thread's
	defer runtime.UnlockOSThread()
	return rtErr("cudaEventSynchronize", C.lspcu_event_synchronize(C.int(dev), C.uintptr_t(e)))
}

// rtEventElapsed is the time in ms from a to b; which is 1 or 2 when that
// event's latest record has not completed (the error is then
// cudaErrorNotReady from cudaEventQuery).
func rtEventElapsed(dev int, a, b rtEvent) (ms float32, which int, err error) {
	var m C.float
	var w C.int
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	code := C.lspcu_event_elapsed(C.int(dev), C.uintptr_t(a), C.uintptr_t(b), &m, &w)
	op := "cudaEventElapsedTime"
	if w != 0 {
		op = "cudaEventQuery"
	}
	return float32(m), int(w), rtErr(op, code)
}
