// Package kernels is the Go face of the CUDA kernels of lsp-offload: one Go
// function per extern "C" launcher of kernels.h, generated from that header
// by kernelgen (kernels/cmd/kernelgen, `go generate ./kernels`), as
// mumax/3's cuda2go does. The CUDA backend, the simulated CUDA runtime and
// the simulator tests (kernels/simtest) all call the launchers through it,
// so there is one face to keep in step with the header, and a test that
// fails when it is not (TestGeneratedUpToDate).
//
// It lives here, next to kernels.h and the .cu files, because it is the
// header's other half: a launcher added to kernels.h appears here after
// `go generate`, and nothing above this package sees cgo.
//
// What each build gets:
//
//   - no tag: the types (Ptr, Stream, DType, Error), the constants of
//     kernels.h and Launchers, the table of every launcher, without cgo, so
//     plain `go test ./...` checks that the face is up to date and that
//     every backend op has a launcher (TestOpsHaveLaunchers).
//   - -tags cuda: the launchers, linked against build/libkernels.a (`make
//     kernels`, nvcc) and CUDA's static runtime; the binary needs only the
//     driver's libcuda.so at run time.
//   - -tags lsp_sim or -tags cudasim: the launchers compiled for the CPU
//     simulator (-DLSP_SIM). This package does not compile the kernels in
//     those builds: the importer that picks the simulated runtime does
//     (kernels/simtest with lsp_sim compiles the .cu files and
//     kernels/sim/sim.cpp into itself), and errors carry the simulator's
//     message (which kernel, block, thread, why).
//
// A launcher's Go function takes the C arguments in the C order with Go
// types: device pointers as Ptr, cudaStream_t as Stream, int as int
// (refused, before any launch, when it does not fit in 32 bits), an int
// named *_bf16 as DType, the on/off ints of kernelgen.FlagParams (transA,
// gelu, accumulate, ...) as bool, long long as int64, unsigned as uint32,
// unsigned long long as uint64, float as float32. A C parameter named C
// (channels, or gemm's output) is C_ in Go, as C names cgo's
// pseudo-package. It returns the launcher's error as an *Error. Helpers
// that return a value (lsp_*_scratch_bytes) return it with an error for
// arguments out of range.
//
// Errors are the launcher's own: the generated C shim clears the calling
// thread's last CUDA error (and the simulator's message) before it calls
// the launcher and reads the result, the message included, in the same
// cgo call, on the same OS thread. (A second cgo call may run on another
// thread, whose last error and message belong to some other launch.)
//
// Limits: launches are asynchronous on a GPU, so a fault while a kernel
// runs is reported by a later synchronising call, unless SetSynchronous
// makes every launch wait for the device (tests and debugging, like
// CUDA_LAUNCH_BLOCKING). The face checks only the range of its integer
// arguments; the launchers check the rest (sizes, dtype flags, null
// pointers) and return cudaErrorInvalidValue.
package kernels

//go:generate go run ./cmd/kernelgen

import (
	"fmt"
	"sync/atomic"
)

// Ptr is a device address (cudaMalloc, cudaMallocManaged, or a simulator
// buffer), passed to a launcher as its pointer argument. Go never
// dereferences it; 0 is the null pointer. It is an integer, like cu's
// DevicePtr, so device memory never poses as Go memory.
type Ptr uintptr

// Add returns p advanced by bytes (a view into a buffer).
func (p Ptr) Add(bytes int) Ptr { return p + Ptr(bytes) }

// Stream is a cudaStream_t; 0 is the default (legacy) stream.
type Stream uintptr

// DType is a launcher's dtype flag for a tensor (its *_bf16 arguments),
// numbered as backend.DType numbers storage types. The launchers accept F32
// and BF16 and refuse any other value.
type DType int32

// The dtype flags.
const (
	F32  DType = 0
	BF16 DType = 1
)

// Error is a launcher's failure.
type Error struct {
	Launcher string // the C name, e.g. lsp_gemm_bf16
	Code     int    // the cudaError_t
	Name     string // e.g. cudaErrorInvalidValue
	Text     string // CUDA's description, e.g. "invalid argument"
	// Detail is the simulator's message in simulator builds (which
	// kernel, block and thread, and why), "" on a GPU or when the launcher
	// refused its arguments itself.
	Detail string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%s)", e.Launcher, e.Name, e.Text)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

var synchronous atomic.Bool

// SetSynchronous makes every later launch wait for the device
// (cudaDeviceSynchronize) and report an error of the kernel's run as its
// own (on = true), or return as soon as the kernel is enqueued (false, the
// default). For tests and debugging: it serialises the GPU with the host.
// Under the simulator, which runs each launch to completion, it changes
// nothing.
func SetSynchronous(on bool) { synchronous.Store(on) }

// Synchronous reports whether launches wait for the device (see
// SetSynchronous).
func Synchronous() bool { return synchronous.Load() }

// Launcher describes one function of kernels.h: the table Launchers lists
// them all, in the header's order, for tests and tools that need no cgo.
type Launcher struct {
	Name    string  // the Go function, e.g. GemmBF16
	C       string  // the C function, e.g. lsp_gemm_bf16
	Family  string  // the header section (// BEGIN family), e.g. gemm
	Returns string  // the C return type: cudaError_t for a launcher
	Params  []Param // in the C order, the stream last
}

// Param is one parameter of a Launcher.
type Param struct {
	Name   string // the C name
	CType  string // e.g. "const __nv_bfloat16*"
	GoName string // the Go parameter name
	GoType string // e.g. "Ptr"
}

// IsLaunch reports whether l enqueues kernels (returns a cudaError_t),
// as opposed to a helper such as lsp_layernorm_backward_scratch_bytes.
func (l Launcher) IsLaunch() bool { return l.Returns == "cudaError_t" }

// Lookup returns the launcher with the given C or Go name.
func Lookup(name string) (Launcher, bool) {
	for _, l := range Launchers {
		if l.C == name || l.Name == name {
			return l, true
		}
	}
	return Launcher{}, false
}
