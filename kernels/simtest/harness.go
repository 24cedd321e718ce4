//go:build lsp_sim || cuda

// Package simtest runs the project's CUDA kernels (kernels/*.cu) and
// compares their results with the CPU references (train/cpu). It builds in
// one of two ways:
//
//   - -tags lsp_sim (`make simtest`): on the CPU simulator in kernels/sim.
//     cgo compiles every .cc file of this directory with g++ and -DLSP_SIM
//     (each <family>.cc includes ../<family>.cu). Device buffers have
//     guard pages, so an out-of-bounds access crashes; the simulator varies
//     thread orders per seed; its own self tests (sim_test.go) run too. It
//     needs CUDA's headers (cuda_bf16.h, cuda_fp16.h, cuda_runtime_api.h)
//     but no GPU.
//   - -tags cuda (`make gpu-test-bin`, then run bin/gpu/kernels.test on a
//     GPU box): the same kernel tests against build/libkernels.a (nvcc) and
//     the static CUDA runtime, on a real GPU (sm_80 or newer). Buffers are
//     managed memory (cudaMallocManaged) placed as the simulator places
//     them, with canary bytes instead of guard pages; every launch is
//     synchronous. Without a usable GPU the binary says so and exits 0.
//     The simulator's self tests are not built in this mode.
//
// harness.go holds what both modes share: device buffers, comparison with
// tolerances, bf16 helpers, and running a test in a child process so that
// a crash (an out-of-bounds access hitting a guard page) becomes a test
// failure instead of killing `go test`. mem_sim.go and mem_cuda.go hold
// each mode's memory and seeds.
//
// Go's build cache does not notice edits to the kernels this package
// includes from ../, so the Makefile puts a hash of them in CGO_CXXFLAGS,
// and TestMain refuses to run a stale simulator binary (RUN=TestGemm
// selects tests).
//
// Limits: the simulator runs one launch at a time and the seed is
// process-wide, so tests in this package must not call t.Parallel; do not
// run it under -race (fibers switch stacks under the race detector's feet).
package simtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// ChildEnv is set (to "1") in the environment of a child started by
// RunInChild; a test checks it with InChild to do the part that may crash.
const ChildEnv = "LSP_SIMTEST_CHILD"

// skipEnv is the simulator's switch for barrier sites (see sim.h).
const skipEnv = "LSP_SIM_SKIP_BARRIER"

// Seeds are the seeds kernel tests loop over (SetSeed before each run).
var Seeds = []uint64{1, 2, 3}

// Buffer is a device buffer: memory outside the Go heap, placed so that a
// kernel reading or writing just past it is caught. Under the simulator an
// inaccessible guard page lies right after its last byte (Alloc,
// AllocAligned) or right before its first byte (AllocBefore) and the access
// crashes the process; on a GPU canary bytes fill the rest of the page and
// a write there fails the test when the buffer is freed. New buffers hold
// 0xFF bytes (NaN as float32 and as bf16), so outputs a kernel forgets to
// write show up as NaN. A Buffer is freed when the test that allocated it
// ends (or by Free).
type Buffer struct {
	t     testing.TB
	ptr   unsafe.Pointer
	bytes int
	mem   devMem // the mode's record of the allocation
	freed bool
}

func alloc(t testing.TB, bytes, align int, before bool) *Buffer {
	t.Helper()
	if bytes < 0 {
		t.Fatalf("simtest: negative buffer size %d", bytes)
	}
	p, mem, err := devAlloc(bytes, align, before)
	if err != nil {
		t.Fatalf("simtest: cannot allocate a buffer of %d bytes (align %d): %v", bytes, align, err)
	}
	b := &Buffer{t: t, ptr: p, bytes: bytes, mem: mem}
	t.Cleanup(b.Free)
	return b
}

// Alloc returns a buffer of the given size whose end touches a guard page:
// reading element n of an n-element buffer crashes. Its start is therefore
// aligned only to the largest power of two dividing bytes (at most a page);
// use AllocAligned when a kernel needs a more aligned base.
func Alloc(t testing.TB, bytes int) *Buffer { t.Helper(); return alloc(t, bytes, 1, false) }

// AllocBefore returns a page-aligned buffer with the guard page directly
// before its first byte, so index -1 crashes.
func AllocBefore(t testing.TB, bytes int) *Buffer { t.Helper(); return alloc(t, bytes, 1, true) }

// AllocAligned returns a buffer whose start is aligned to align (a power of
// two up to the page size; cudaMalloc gives 256). The < align bytes between
// its end and the guard page hold a canary: a write there is reported when
// the buffer is freed, a read goes unnoticed.
func AllocAligned(t testing.TB, bytes, align int) *Buffer {
	t.Helper()
	if align <= 0 || align&(align-1) != 0 || align > os.Getpagesize() {
		t.Fatalf("simtest: alignment %d is not a power of two up to the page size", align)
	}
	return alloc(t, bytes, align, false)
}

// Free releases the buffer (idempotent) and reports a write past its end
// (into AllocAligned's alignment gap under the simulator, into the canary
// bytes on a GPU).
func (b *Buffer) Free() {
	if b.freed {
		return
	}
	b.freed = true
	if err := devFree(b.ptr, b.mem); err != nil {
		b.t.Errorf("simtest: a %d-byte buffer %v", b.bytes, err)
	}
}

// Ptr is the buffer's address, for tests that look at it (alignment,
// guard pages); launchers take Dev.
func (b *Buffer) Ptr() unsafe.Pointer { b.live(); return b.ptr }

// Dev is the device address to pass to a launcher; a nil Buffer gives the
// null pointer.
func (b *Buffer) Dev() kernels.Ptr {
	if b == nil {
		return 0
	}
	b.live()
	return kernels.Ptr(uintptr(b.ptr))
}

// Len is the size in bytes.
func (b *Buffer) Len() int { return b.bytes }

func (b *Buffer) live() {
	if b.freed {
		b.t.Fatalf("simtest: use of a freed buffer")
	}
}

func (b *Buffer) view(elem int) unsafe.Pointer {
	b.t.Helper()
	b.live()
	if uintptr(b.ptr)%uintptr(elem) != 0 {
		b.t.Fatalf("simtest: a %d-byte buffer at %p is not aligned for %d-byte elements", b.bytes, b.ptr, elem)
	}
	return b.ptr
}

// Bytes views the buffer's memory (valid until Free).
func (b *Buffer) Bytes() []byte { return unsafe.Slice((*byte)(b.view(1)), b.bytes) }

// Float32 views the buffer as float32s (len = Len()/4; valid until Free).
func (b *Buffer) Float32() []float32 { return unsafe.Slice((*float32)(b.view(4)), b.bytes/4) }

// Uint16 views the buffer as uint16s, e.g. bf16 bits (valid until Free).
func (b *Buffer) Uint16() []uint16 { return unsafe.Slice((*uint16)(b.view(2)), b.bytes/2) }

// Int32 views the buffer as int32s (valid until Free).
func (b *Buffer) Int32() []int32 { return unsafe.Slice((*int32)(b.view(4)), b.bytes/4) }

// BF16 returns a copy of the buffer's bf16 contents widened to float32.
func (b *Buffer) BF16() []float32 { return BF16Values(b.Uint16()) }

// SetBF16 stores xs rounded to bf16 (nearest even) at the buffer's start.
func (b *Buffer) SetBF16(xs []float32) {
	b.t.Helper()
	if 2*len(xs) > b.bytes {
		b.t.Fatalf("simtest: %d bf16 values do not fit in %d bytes", len(xs), b.bytes)
	}
	bf16.FromFloat32Slice(b.Uint16(), xs)
}

// FromFloat32 allocates a buffer (Alloc) holding a copy of xs.
func FromFloat32(t testing.TB, xs []float32) *Buffer {
	t.Helper()
	b := Alloc(t, 4*len(xs))
	copy(b.Float32(), xs)
	return b
}

// FromBF16 allocates a buffer (Alloc) holding xs rounded to bf16.
func FromBF16(t testing.TB, xs []float32) *Buffer {
	t.Helper()
	b := Alloc(t, 2*len(xs))
	b.SetBF16(xs)
	return b
}

// FromUint16 allocates a buffer (Alloc) holding a copy of xs.
func FromUint16(t testing.TB, xs []uint16) *Buffer {
	t.Helper()
	b := Alloc(t, 2*len(xs))
	copy(b.Uint16(), xs)
	return b
}

// FromInt32 allocates a buffer (Alloc) holding a copy of xs.
func FromInt32(t testing.TB, xs []int32) *Buffer {
	t.Helper()
	b := Alloc(t, 4*len(xs))
	copy(b.Int32(), xs)
	return b
}

// FloatBuf is a buffer of float values stored as bf16 (BF16) or fp32, for
// the launchers that take a dtype flag per tensor. The zero FloatBuf
// passes a null pointer.
type FloatBuf struct {
	Buf  *Buffer
	BF16 bool
}

// NewFloatBuf allocates a buffer holding vals (rounded to nearest even for
// bf16), with its guard page right after the end or, with guardBefore,
// right before the start.
func NewFloatBuf(t testing.TB, vals []float32, bf16, guardBefore bool) FloatBuf {
	t.Helper()
	size := 4
	if bf16 {
		size = 2
	}
	var b *Buffer
	if guardBefore {
		b = AllocBefore(t, size*len(vals))
	} else {
		b = Alloc(t, size*len(vals))
	}
	f := FloatBuf{Buf: b, BF16: bf16}
	f.Set(vals)
	return f
}

// Set stores vals at the start of the buffer (rounded for bf16).
func (f FloatBuf) Set(vals []float32) {
	if f.BF16 {
		f.Buf.SetBF16(vals)
	} else {
		copy(f.Buf.Float32(), vals)
	}
}

// Values returns a copy of the buffer's values widened to float32.
func (f FloatBuf) Values() []float32 {
	if f.BF16 {
		return f.Buf.BF16()
	}
	return append([]float32(nil), f.Buf.Float32()...)
}

// Dev is the device address (null for the zero FloatBuf).
func (f FloatBuf) Dev() kernels.Ptr { return f.Buf.Dev() }

// DT is the launchers' dtype flag of the buffer.
func (f FloatBuf) DT() kernels.DType { return dtype(f.BF16) }

// dtype is the launchers' dtype flag: BF16 when bf16, else F32.
func dtype(bf16 bool) kernels.DType {
	if bf16 {
		return kernels.BF16
	}
	return kernels.F32
}

// RoundBF16 returns xs rounded to the nearest bf16 (ties to even), as
// float32: the values a kernel sees after a bf16 store.
func RoundBF16(xs []float32) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = bf16.ToFloat32(bf16.FromFloat32(x))
	}
	return out
}

// BF16Bits rounds xs to bf16 bit patterns.
func BF16Bits(xs []float32) []uint16 {
	out := make([]uint16, len(xs))
	bf16.FromFloat32Slice(out, xs)
	return out
}

// BF16Values widens bf16 bit patterns to float32.
func BF16Values(hs []uint16) []float32 {
	out := make([]float32, len(hs))
	bf16.ToFloat32Slice(out, hs)
	return out
}

// Rand returns n deterministic pseudo-random values uniform in
// [-scale, scale).
func Rand(seed uint64, n int, scale float32) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x51ED5EED))
	out := make([]float32, n)
	for i := range out {
		out[i] = (2*r.Float32() - 1) * scale
	}
	return out
}

// Compare checks |got[i] - want[i]| <= atol + rtol*|want[i]| for every i
// (NaN matches only NaN, an infinity only the same infinity) and reports a
// failure with the count of bad values and the worst one: its index, both
// values, the difference and the tolerance. It returns whether all matched.
// In a barrier-removal child (LSP_SIM_SKIP_BARRIER set) a failure ends the
// test at once, to save time.
func Compare(t testing.TB, name string, got, want []float32, atol, rtol float64) bool {
	t.Helper()
	if !sameLen(t, name, len(got), len(want)) {
		return false
	}
	bad, worst := 0, -1
	worstExcess := 0.0
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		tol := atol + rtol*math.Abs(w)
		excess := 0.0
		switch {
		case math.IsNaN(g) || math.IsNaN(w):
			if !(math.IsNaN(g) && math.IsNaN(w)) {
				excess = math.Inf(1)
			}
		case math.IsInf(g, 0) || math.IsInf(w, 0):
			if g != w {
				excess = math.Inf(1)
			}
		default:
			if d := math.Abs(g - w); d > tol {
				excess = d - tol
			}
		}
		if excess > 0 {
			bad++
			if worst < 0 || excess > worstExcess {
				worst, worstExcess = i, excess
			}
		}
	}
	if bad == 0 {
		return true
	}
	g, w := float64(got[worst]), float64(want[worst])
	t.Errorf("%s: %d of %d values out of tolerance; worst at index %d: got %.8g, want %.8g, |diff| %.3g > tol %.3g (atol %g + rtol %g * |want|)",
		name, bad, len(got), worst, g, w, math.Abs(g-w), atol+rtol*math.Abs(w), atol, rtol)
	failFast(t)
	return false
}

// CompareBits checks two slices of bit patterns (e.g. bf16) for equality
// and reports the count of differences and the first one.
func CompareBits(t testing.TB, name string, got, want []uint16) bool {
	t.Helper()
	if !sameLen(t, name, len(got), len(want)) {
		return false
	}
	bad, first := countDiffs(len(got), func(i int) bool { return got[i] != want[i] })
	if bad == 0 {
		return true
	}
	t.Errorf("%s: %d of %d values differ; first at index %d: got 0x%04x (%g), want 0x%04x (%g)", name, bad,
		len(got), first, got[first], bf16.ToFloat32(got[first]), want[first], bf16.ToFloat32(want[first]))
	failFast(t)
	return false
}

// sameLen fails unless a result's length (got) is its reference's (want),
// and reports whether it is.
func sameLen(t testing.TB, name string, got, want int) bool {
	t.Helper()
	if got == want {
		return true
	}
	t.Errorf("%s: got %d values, want %d", name, got, want)
	failFast(t)
	return false
}

// countDiffs counts the indices i < n where differ(i) holds and returns
// the first of them (-1 when there is none), for the reports of the exact
// comparisons.
func countDiffs(n int, differ func(i int) bool) (bad, first int) {
	first = -1
	for i := range n {
		if differ(i) {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	return bad, first
}

func failFast(t testing.TB) {
	if os.Getenv(skipEnv) != "" {
		t.FailNow()
	}
}

// InChild reports whether this process is a child started by RunInChild.
func InChild() bool { return os.Getenv(ChildEnv) != "" }

// RunInChild runs the top-level test testName (matched exactly) in a child
// process of this test binary, with ChildEnv=1 and env ("KEY=value") added
// to the environment, and returns the child's combined output and whether
// it failed (a test failure, a crash, or a timeout of 5 minutes). A test
// whose body may crash the process runs that body only when InChild().
func RunInChild(t testing.TB, testName string, env ...string) (output string, failed bool) {
	t.Helper()
	return runChild(t, "^"+regexp.QuoteMeta(testName)+"$", 5*time.Minute, env...)
}

// runChild runs the tests matching pattern in a child process.
func runChild(t testing.TB, pattern string, timeout time.Duration, env ...string) (string, bool) {
	t.Helper()
	if InChild() {
		t.Fatalf("simtest: a child test may not start children")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("simtest: cannot find the test binary: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run="+pattern, "-test.count=1", "-test.v", "-test.failfast",
		fmt.Sprintf("-test.timeout=%s", timeout))
	cmd.Env = append(append(os.Environ(), ChildEnv+"=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if ctx.Err() != nil {
			return string(out) + "\nsimtest: child timed out after " + timeout.String(), true
		}
		if errors.As(err, &ee) {
			return string(out) + "\nsimtest: child " + ee.String(), true
		}
		t.Fatalf("simtest: cannot run child %s: %v", exe, err)
	}
	return string(out), false
}
