//go:build cudasim

package cudasimrt

import (
	"bytes"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantCode fails unless err carries the CUDA error code want.
func wantCode(t *testing.T, what string, err error, want int) {
	t.Helper()
	if got := codeOf(err); got != want {
		t.Fatalf("%s: got %v (code %d), want code %d", what, err, got, want)
	}
}

// lockThread keeps the test on one OS thread, for tests that read
// cudaGetLastError: CUDA's last error belongs to the thread.
func lockThread(t *testing.T) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
}

func newStream(t *testing.T, flags uint) stream {
	t.Helper()
	s, err := streamCreate(flags)
	must(t, err)
	t.Cleanup(func() { _ = streamDestroy(s) })
	return s
}

func devBuf(t *testing.T, n int) uintptr {
	t.Helper()
	p, err := malloc(n)
	must(t, err)
	t.Cleanup(func() { _ = free(p) })
	return p
}

// pinnedBuf returns n bytes of cudaHostAlloc memory.
func pinnedBuf(t *testing.T, n int) (uintptr, []byte) {
	t.Helper()
	p, err := hostAlloc(n, 0)
	must(t, err)
	t.Cleanup(func() { _ = freeHost(p) })
	return p, unsafe.Slice((*byte)(ptr(p)), n)
}

func floats(p uintptr, n int) []float32 { return unsafe.Slice((*float32)(ptr(p)), n) }

// A gate holds a stream back: block queues rt_spin, a kernel that polls a
// device flag, and open writes the flag with a copy on a non-blocking
// stream of its own. While a gate is closed the runtime's execution lock is
// held: only copies, memsets, events and host functions run elsewhere.
type gate struct {
	flag, seen, one uintptr
	rs              stream
	t               *testing.T
}

func newGate(t *testing.T) *gate {
	t.Helper()
	g := &gate{t: t, flag: devBuf(t, 4), seen: devBuf(t, 4)}
	var one []byte
	g.one, one = pinnedBuf(t, 4)
	*(*int32)(unsafe.Pointer(&one[0])) = 1
	g.rs = newStream(t, streamNonBlocking)
	must(t, memsetAsync(g.flag, 0, 4, g.rs))
	must(t, memsetAsync(g.seen, 0, 4, g.rs))
	must(t, streamSync(g.rs))
	// Cleanups run last in, first out: this one, before the buffers go.
	t.Cleanup(func() {
		_ = g.open()
		_ = deviceSync()
	})
	return g
}

func (g *gate) block(s stream) {
	g.t.Helper()
	must(g.t, spin(g.flag, g.seen, 10000, s))
	// Registered after the test's buffers, so it runs before their frees
	// (which wait for every stream) when the test fails early.
	g.t.Cleanup(func() { _ = g.open() })
}

func (g *gate) open() error { return memcpyAsync(g.flag, g.one, 4, h2d, g.rs) }

// seenValue is what the last rt_spin saw (1: opened; 0: it timed out).
func (g *gate) seenValue() int {
	g.t.Helper()
	h, b := pinnedBuf(g.t, 4)
	must(g.t, memcpyAsync(h, g.seen, 4, d2h, g.rs))
	must(g.t, streamSync(g.rs))
	return int(*(*int32)(unsafe.Pointer(&b[0])))
}

// stillPending checks that s has not finished after a while.
func stillPending(t *testing.T, what string, s stream) {
	t.Helper()
	time.Sleep(30 * time.Millisecond)
	wantCode(t, what, streamQuery(s), errNotReady)
}

// heldHostFunc checks a host function that g's blocked kernel holds back:
// queue blocks g and queues, on s, the function counting its runs in
// counter and what holds it back (named by pending and before). The
// function must not have run (s still pending) until g opens, and then
// run once.
func heldHostFunc(t *testing.T, g *gate, s stream, pending, before string, queue func(counter uintptr)) {
	t.Helper()
	counter, _ := pinnedBuf(t, 4)
	*(*int32)(ptr(counter)) = 0
	queue(counter)
	stillPending(t, pending, s)
	if v := loadInt(counter); v != 0 {
		t.Fatalf("the host function ran (%d) before %s", v, before)
	}
	must(t, g.open())
	must(t, streamSync(s))
	if v := loadInt(counter); v != 1 {
		t.Fatalf("host function count %d, want 1", v)
	}
}

func TestDevice(t *testing.T) {
	lockThread(t)
	n, err := deviceCount()
	must(t, err)
	if n != 1 {
		t.Fatalf("device count %d, want 1", n)
	}
	must(t, setDevice(0))
	wantCode(t, "cudaSetDevice(1)", setDevice(1), errInvalidDevice)
	if d, err := getDevice(); err != nil || d != 0 {
		t.Fatalf("cudaGetDevice = %d, %v", d, err)
	}
	p, err := deviceProps(0)
	must(t, err)
	_, total, err := memGetInfo()
	must(t, err)
	if p.Name != "lsp-offload cudasim" || p.Major != 9 || p.Minor != 0 || p.SMs != 132 ||
		p.SharedPerBlockOptin != 227*1024 || p.TotalGlobalMem != total || p.MaxThreadsPerBlock != 1024 ||
		p.WarpSize != 32 || p.ConcurrentKernels != 0 || p.PCIBus != 1 || p.PCIDev != 0 || p.PCIDom != 0 {
		t.Fatalf("properties %+v (total memory %d)", p, total)
	}
	if total != 8<<30 && os.Getenv("LSP_CUDASIM_MEM") == "" {
		t.Fatalf("default device memory %d, want 8 GiB", total)
	}
	for attr, want := range map[int]int{attrMajor: 9, attrMinor: 0, attrSMs: 132, attrSmemOptin: 227 * 1024,
		attrPCIBus: 1, attrWarpSize: 32, attrMaxThreads: 1024} {
		v, err := deviceAttr(attr, 0)
		must(t, err)
		if v != want {
			t.Errorf("attribute %d = %d, want %d", attr, v, want)
		}
	}
	_, err = deviceAttr(attrTexPitch, 0)
	wantCode(t, "an attribute the runtime does not simulate", err, errNotSupported)
	_, err = deviceAttr(attrMajor, 1)
	wantCode(t, "attribute of device 1", err, errInvalidDevice)
	_, err = deviceProps(1)
	wantCode(t, "properties of device 1", err, errInvalidDevice)
	if c := lastError(); c != errInvalidDevice {
		t.Fatalf("cudaGetLastError after a refused call = %d, want %d", c, errInvalidDevice)
	}
	if c := lastError(); c != 0 {
		t.Fatalf("cudaGetLastError twice = %d, want 0 (a refused call is no sticky error)", c)
	}
}

func TestFuncAttributes(t *testing.T) {
	maxThreads, maxDyn, err := funcAttrs()
	must(t, err)
	if maxThreads != 1024 || maxDyn != 48*1024 {
		t.Fatalf("attributes: %d threads, %d dynamic smem", maxThreads, maxDyn)
	}
	must(t, funcSetMaxDyn(100*1024))
	t.Cleanup(func() { _ = funcSetMaxDyn(48 * 1024) })
	if _, maxDyn, _ = funcAttrs(); maxDyn != 100*1024 {
		t.Fatalf("after cudaFuncSetAttribute(100 KiB): %d", maxDyn)
	}
	wantCode(t, "cudaFuncSetAttribute(300 KiB)", funcSetMaxDyn(300*1024), errInvalidValue)
}

// Memset, then copies in every direction on ragged sizes and offsets,
// checked byte for byte; fresh device memory holds 0xFF bytes.
func TestMemcpyMemset(t *testing.T) {
	s := newStream(t, streamNonBlocking)
	for _, n := range []int{1, 3, 255, 256, 257, 4099, 65543} {
		d1, d2 := devBuf(t, n), devBuf(t, n+64)
		h, hb := pinnedBuf(t, n+64)
		h2, hb2 := pinnedBuf(t, n+64)
		must(t, memcpyAsync(h, d1, n, d2h, s))
		must(t, streamSync(s))
		if !bytes.Equal(hb[:n], bytes.Repeat([]byte{0xFF}, n)) {
			t.Fatalf("n=%d: fresh cudaMalloc memory is not 0xFF", n)
		}
		must(t, memsetAsync(d1, 0x1AB, n, s)) // CUDA uses the low byte
		must(t, memcpyAsync(h, d1, n, d2h, s))
		must(t, streamSync(s))
		if !bytes.Equal(hb[:n], bytes.Repeat([]byte{0xAB}, n)) {
			t.Fatalf("n=%d: memset 0xAB gave %x...", n, hb[:min(n, 8)])
		}
		for i := range hb[:n] {
			hb[i] = byte(i*7 + n)
		}
		must(t, memcpyAsync(d1, h, n, h2d, s))
		must(t, memcpyAsync(d2+33, d1, n, d2d, s))
		must(t, memcpyAsync(h2, d2+33, n, dflt, s)) // the kind inferred: D2H
		must(t, streamSync(s))
		if !bytes.Equal(hb2[:n], hb[:n]) {
			t.Fatalf("n=%d: H2D, D2D at offset 33, D2H did not round-trip", n)
		}
		clear(hb2)
		must(t, memcpySync(h2, d1, n, d2h))
		if !bytes.Equal(hb2[:n], hb[:n]) {
			t.Fatalf("n=%d: cudaMemcpy D2H differs", n)
		}
	}
}

// Copy and memset ranges are checked when queued, with an error of the
// call (not a sticky one).
func TestCopyChecks(t *testing.T) {
	lockThread(t)
	s := newStream(t, streamNonBlocking)
	d := devBuf(t, 1000)
	h, _ := pinnedBuf(t, 2000)
	cases := []struct {
		name string
		err  error
		code int
		msg  string
	}{
		{"one byte past the end", memcpyAsync(d, h, 1001, h2d, s), errInvalidValue, "past its end"},
		{"from an offset past the end", memcpyAsync(d+500, h, 600, h2d, s), errInvalidValue, "past its end"},
		{"host pointer as the device side", memcpyAsync(h, d, 100, h2d, s), errInvalidValue, "not in a live cudaMalloc buffer"},
		{"device pointer as the host side", memcpyAsync(d, d+200, 100, h2d, s), errInvalidValue, "overlaps a device buffer"},
		{"overlapping D2D", memcpyAsync(d, d+10, 100, d2d, s), errInvalidValue, "overlap"},
		{"bad kind", memcpyAsync(d, h, 10, 7, s), errMemcpyDirection, "kind 7"},
		{"null dst", memcpyAsync(0, h, 10, h2d, s), errInvalidValue, "null"},
		{"memset past the end", memsetAsync(d+999, 0, 2, s), errInvalidValue, "past its end"},
		{"memset of a host pointer", memsetAsync(h, 0, 2, s), errInvalidValue, "not in a live cudaMalloc buffer"},
	}
	for _, c := range cases {
		wantCode(t, c.name, c.err, c.code)
		if !strings.Contains(c.err.Error(), c.msg) {
			t.Errorf("%s: message %q does not say %q", c.name, c.err, c.msg)
		}
	}
	if c := lastError(); c != errInvalidValue {
		t.Fatalf("cudaGetLastError = %d, want the last refusal (%d)", c, errInvalidValue)
	}
	must(t, memcpyAsync(d, h, 0, h2d, s)) // nothing to copy
	must(t, deviceSync())                 // refusals are not sticky
	gone, err := streamCreate(streamNonBlocking)
	must(t, err)
	must(t, streamDestroy(gone))
	wantCode(t, "copy on a destroyed stream", memcpyAsync(d, h, 4, h2d, gone), errInvalidResourceHandle)
	wantCode(t, "destroying it twice", streamDestroy(gone), errInvalidResourceHandle)
	wantCode(t, "destroying the legacy stream", streamDestroy(legacy), errInvalidResourceHandle)
}

// Launches, copies and memsets of one stream run in the order queued, with
// the hazard delays on so that the stream's thread, not luck, orders them.
func TestStreamOrder(t *testing.T) {
	setDelays(11, 200)
	t.Cleanup(func() { setDelays(0, 0) })
	s := newStream(t, streamNonBlocking)
	const n = 1000
	d := devBuf(t, 4*n)
	h, _ := pinnedBuf(t, 4*n)
	traceOn(true)
	must(t, fill(d, n, 2, s))
	must(t, axpb(d, n, 3, 1, s))
	must(t, axpb(d, n, 0.5, 0, s))
	must(t, memcpyAsync(h, d, 4*n, d2h, s))
	must(t, memsetAsync(d, 0, 4*n, s)) // after the copy: must not show in h
	must(t, streamSync(s))
	traceOn(false)
	out := floats(h, n)
	for i := range n {
		if want := ((2+float32(i))*3 + 1) * 0.5; out[i] != want {
			t.Fatalf("out[%d] = %v, want %v", i, out[i], want)
		}
	}
	var ops []opTime
	for _, o := range traceRead() {
		if o.Stream == handle(s) {
			ops = append(ops, o)
		}
	}
	kinds := []int{opKernel, opKernel, opKernel, opD2H, opMemset}
	if len(ops) != len(kinds) {
		t.Fatalf("trace of the stream: %+v", ops)
	}
	for i, o := range ops {
		if o.Kind != kinds[i] || o.Seq != uint64(i+1) || o.Status != 0 {
			t.Fatalf("op %d: %+v, want kind %d seq %d", i, o, kinds[i], i+1)
		}
		if i > 0 && o.Start < ops[i-1].End {
			t.Fatalf("op %d started at %d before op %d ended at %d", i, o.Start, i-1, ops[i-1].End)
		}
	}
	if ops[0].Name != "rt_fill_kernel" {
		t.Fatalf("kernel name in the trace: %q", ops[0].Name)
	}
}

// Project kernels through the queue: lsp_sum_squares launches two
// dependent grids; the result is read on another stream after an event.
func TestCastKernels(t *testing.T) {
	s := newStream(t, streamNonBlocking)
	s2 := newStream(t, streamNonBlocking)
	e, err := eventCreate(eventDisableTim)
	must(t, err)
	t.Cleanup(func() { _ = eventDestroy(e) })
	const n = 3001
	hin, _ := pinnedBuf(t, 4*n)
	in := floats(hin, n)
	for i := range in {
		in[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i%13) / 7
	}
	f, b, f2 := devBuf(t, 4*n), devBuf(t, 2*n), devBuf(t, 4*n)
	out, work := devBuf(t, 4), devBuf(t, 8*sumSquaresWork)
	hout, _ := pinnedBuf(t, 4*n+4)
	must(t, memcpyAsync(f, hin, 4*n, h2d, s))
	must(t, castF32ToBF16(b, f, n, s))
	must(t, castBF16ToF32(f2, b, n, s))
	must(t, sumSquares(out, f2, n, work, s))
	must(t, eventRecord(e, s))
	must(t, streamWaitEvent(s2, e, 0))
	must(t, memcpyAsync(hout, f2, 4*n, d2h, s2))
	must(t, memcpyAsync(hout+4*n, out, 4, d2h, s2))
	must(t, streamSync(s2))
	got := floats(hout, n+1)
	var sum float64
	for i, x := range in {
		bits := math.Float32bits(x)
		want := math.Float32frombits((bits + 0x7FFF + (bits>>16)&1) &^ 0xFFFF) // round to nearest even
		if got[i] != want {
			t.Fatalf("bf16 round trip of in[%d] = %v: %v, want %v", i, x, got[i], want)
		}
		sum += float64(want) * float64(want)
	}
	if d := math.Abs(float64(got[n])-sum) / sum; d > 1e-6 {
		t.Fatalf("sum of squares %v, want %v", got[n], sum)
	}
}

// The overlap a pipelined step needs: a copy on one stream starts (and ends)
// while a kernel on another runs. The kernel waits for the flag the copy
// writes, so without overlap it would time out and see 0.
func TestCopyOverlapsKernel(t *testing.T) {
	g := newGate(t)
	a := newStream(t, streamNonBlocking)
	traceOn(true)
	g.block(a)
	stillPending(t, "the kernel's stream before the copy", a) // the launch returned before its kernel ended
	must(t, g.open())
	must(t, streamSync(a))
	traceOn(false)
	if v := g.seenValue(); v != 1 {
		t.Fatalf("the kernel saw flag %d: the copy did not run while it ran", v)
	}
	var kern, cp *opTime
	ops := traceRead()
	for i := range ops {
		o := &ops[i]
		if o.Stream == handle(a) && o.Kind == opKernel && o.Name == "rt_spin_kernel" {
			kern = o
		}
		if o.Stream == handle(g.rs) && o.Kind == opH2D {
			cp = o
		}
	}
	if kern == nil || cp == nil {
		t.Fatalf("trace lacks the kernel or the copy: %+v", ops)
	}
	if !(cp.Start > kern.Start && cp.Start < kern.End && cp.End < kern.End) {
		t.Fatalf("no overlap: kernel [%d, %d], copy [%d, %d]", kern.Start, kern.End, cp.Start, cp.End)
	}
}

func TestEvents(t *testing.T) {
	g := newGate(t)
	a := newStream(t, streamNonBlocking)
	b := newStream(t, streamNonBlocking)
	e, err := eventCreate(0)
	must(t, err)
	// Never recorded: query and synchronize succeed, a wait is a no-op.
	must(t, eventQuery(e))
	must(t, eventSync(e))
	must(t, streamWaitEvent(b, e, 0))
	must(t, streamSync(b))
	_, err = elapsed(e, e)
	wantCode(t, "elapsed time of a never-recorded event", err, errInvalidResourceHandle)

	// b reads what a writes, after a's record.
	const n = 777
	d := devBuf(t, 4*n)
	h, _ := pinnedBuf(t, 4*n)
	g.block(a)
	must(t, fill(d, n, 3, a))
	must(t, eventRecord(e, a))
	must(t, streamWaitEvent(b, e, 0))
	must(t, memcpyAsync(h, d, 4*n, d2h, b))
	wantCode(t, "query of a pending record", eventQuery(e), errNotReady)
	stillPending(t, "the waiting stream", b)
	must(t, g.open())
	must(t, streamSync(b))
	must(t, eventQuery(e))
	for i, v := range floats(h, n) {
		if v != 3+float32(i) {
			t.Fatalf("h[%d] = %v: the wait did not order the copy after the kernel", i, v)
		}
	}

	// An event destroyed with a record pending completes all the same.
	g2 := newGate(t)
	e2, err := eventCreate(0)
	must(t, err)
	g2.block(a)
	must(t, eventRecord(e2, a))
	must(t, streamWaitEvent(b, e2, 0))
	must(t, eventDestroy(e2))
	must(t, g2.open())
	must(t, streamSync(b))
	wantCode(t, "query of a destroyed event", eventQuery(e2), errInvalidResourceHandle)
	wantCode(t, "record of a destroyed event", eventRecord(e2, a), errInvalidResourceHandle)
	must(t, eventDestroy(e))
	wantCode(t, "destroying an event twice", eventDestroy(e), errInvalidResourceHandle)
}

// cudaStreamWaitEvent binds to the record that is latest when it is
// called; recording the event again later does not release the wait.
func TestWaitBindsLatestRecord(t *testing.T) {
	g := newGate(t)
	a := newStream(t, streamNonBlocking)
	b := newStream(t, streamNonBlocking)
	c := newStream(t, streamNonBlocking)
	e, err := eventCreate(eventDisableTim)
	must(t, err)
	t.Cleanup(func() { _ = eventDestroy(e) })
	heldHostFunc(t, g, b, "the stream waiting on the earlier record", "the record it waits for", func(counter uintptr) {
		g.block(a)
		must(t, eventRecord(e, a))
		must(t, streamWaitEvent(b, e, 0))
		must(t, hostFunc(b, counter))
		must(t, eventRecord(e, c)) // c is idle: this record completes at once
		must(t, eventSync(e))      // waits for the latest record only
		must(t, eventQuery(e))
	})
}

func TestElapsedTime(t *testing.T) {
	g := newGate(t)
	s := newStream(t, streamNonBlocking)
	e1, err := eventCreate(0)
	must(t, err)
	e2, err := eventCreate(0)
	must(t, err)
	noTiming, err := eventCreate(eventDisableTim)
	must(t, err)
	never, err := eventCreate(0)
	must(t, err)
	for _, e := range []event{e1, e2, noTiming, never} {
		t.Cleanup(func() { _ = eventDestroy(e) })
	}
	must(t, eventRecord(e1, s))
	g.block(s)
	must(t, eventRecord(e2, s))
	must(t, eventRecord(noTiming, s))
	_, err = elapsed(e1, e2)
	wantCode(t, "elapsed time with a pending record", err, errNotReady)
	time.Sleep(40 * time.Millisecond)
	must(t, g.open())
	must(t, eventSync(e2))
	ms, err := elapsed(e1, e2)
	must(t, err)
	if ms < 35 || ms > 10000 {
		t.Fatalf("elapsed %v ms across a kernel held 40 ms", ms)
	}
	_, err = elapsed(e1, noTiming)
	wantCode(t, "elapsed time with cudaEventDisableTiming", err, errInvalidResourceHandle)
	_, err = elapsed(e1, never)
	wantCode(t, "elapsed time to a never-recorded event", err, errInvalidResourceHandle)
}

// The legacy default stream synchronises with blocking streams, not with
// non-blocking ones.
func TestLegacyStream(t *testing.T) {
	g := newGate(t)
	blocking := newStream(t, 0)
	d := devBuf(t, 64)
	h, _ := pinnedBuf(t, 64)

	// cudaMemcpy (legacy stream) waits for the blocking stream's kernel.
	g.block(blocking)
	done := make(chan error, 1)
	go func() { done <- memcpySync(h, d, 64, d2h) }()
	select {
	case err := <-done:
		t.Fatalf("cudaMemcpy returned (%v) before the blocking stream's earlier kernel ended", err)
	case <-time.After(50 * time.Millisecond):
	}
	must(t, g.open())
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("cudaMemcpy did not return after the kernel ended")
	}

	// Work on the legacy stream does not wait for a non-blocking stream.
	g2 := newGate(t)
	nb := newStream(t, streamNonBlocking)
	g2.block(nb)
	must(t, memsetAsync(d, 1, 64, legacy))
	must(t, streamSync(legacy))
	wantCode(t, "the non-blocking stream", streamQuery(nb), errNotReady)
	must(t, g2.open())
	must(t, streamSync(nb))

	// A blocking stream waits for earlier work on the legacy stream; a
	// non-blocking one does not.
	g3 := newGate(t)
	g3.block(legacy)
	must(t, memsetAsync(d, 2, 64, blocking))
	must(t, memsetAsync(d, 3, 64, nb))
	must(t, streamSync(nb))
	stillPending(t, "a blocking stream behind the legacy stream", blocking)
	must(t, g3.open())
	must(t, streamSync(blocking))
	must(t, memcpySync(h, d, 64, d2h))
	if b := *(*byte)(ptr(h)); b != 2 {
		t.Fatalf("byte %d, want 2 (the blocking stream's memset, queued last in effect)", b)
	}
}

// A destroyed stream finishes its queued work, as CUDA's does.
func TestStreamDestroyPending(t *testing.T) {
	g := newGate(t)
	s, err := streamCreate(streamNonBlocking)
	must(t, err)
	const n = 300
	d := devBuf(t, 4*n)
	h, _ := pinnedBuf(t, 4*n)
	g.block(s)
	must(t, fill(d, n, 5, s))
	must(t, streamDestroy(s))
	wantCode(t, "synchronize a destroyed stream", streamSync(s), errInvalidResourceHandle)
	must(t, g.open())
	must(t, deviceSync())
	must(t, memcpySync(h, d, 4*n, d2h))
	for i, v := range floats(h, n) {
		if v != 5+float32(i) {
			t.Fatalf("h[%d] = %v: the destroyed stream's work did not run", i, v)
		}
	}
}

func TestHostMemory(t *testing.T) {
	p, err := hostAlloc(10000, 0)
	must(t, err)
	if b := *(*byte)(ptr(p)); b != 0xFF {
		t.Fatalf("cudaHostAlloc memory starts with %#x, want 0xFF", b)
	}
	wantCode(t, "registering inside cudaHostAlloc memory", hostRegister(p+4096, 100, 0), errAlreadyRegistered)
	wantCode(t, "unregistering cudaHostAlloc memory", hostUnregister(p), errNotRegistered)

	page := os.Getpagesize()
	m, err := syscall.Mmap(-1, 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	must(t, err)
	defer func() { _ = syscall.Munmap(m) }()
	a := uintptr(unsafe.Pointer(&m[0]))
	must(t, hostRegister(a, 3*page, 0))
	wantCode(t, "registering twice", hostRegister(a+100, 10, 0), errAlreadyRegistered)
	wantCode(t, "cudaFreeHost of registered memory", freeHost(a), errInvalidValue)
	d := devBuf(t, 3*page)
	before := pageableCopies()
	must(t, memcpyAsync(d, a+1, 3*page-1, h2d, legacy))
	must(t, streamSync(legacy))
	if pageableCopies() != before {
		t.Fatal("a copy from registered memory counted as pageable")
	}
	wantCode(t, "registering device memory", hostRegister(d, 64, 0), errInvalidValue)
	must(t, hostUnregister(a))
	wantCode(t, "unregistering twice", hostUnregister(a), errNotRegistered)
	wantCode(t, "registering a null range", hostRegister(0, 64, 0), errInvalidValue)

	// A hole in the range: CUDA cannot pin what is not mapped.
	must(t, syscall.Mprotect(m[page:2*page], syscall.PROT_NONE)) // still mapped: registers
	must(t, hostRegister(a, 3*page, 0))
	must(t, hostUnregister(a))
	if _, _, errno := syscall.Syscall(syscall.SYS_MUNMAP, a+uintptr(page), uintptr(page), 0); errno != 0 {
		t.Fatal(errno)
	}
	wantCode(t, "registering a range with an unmapped page", hostRegister(a, 3*page, 0), errInvalidValue)

	must(t, freeHost(p))
	wantCode(t, "cudaFreeHost twice", freeHost(p), errInvalidValue)
}

// Copies with a pageable host side behave as CUDA's: H2D is staged before
// the call returns, D2H returns only when done.
func TestPageableCopies(t *testing.T) {
	g := newGate(t)
	s := newStream(t, streamNonBlocking)
	const n = 4096
	d := devBuf(t, n)
	h, hb := pinnedBuf(t, n)
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 3)
	}
	want := bytes.Clone(src)
	before := pageableCopies()
	g.block(s)
	must(t, memcpyAsync(d, uintptr(unsafe.Pointer(&src[0])), n, h2d, s))
	clear(src) // after the call: must not reach the device
	runtime.KeepAlive(src)
	must(t, g.open())
	must(t, memcpyAsync(h, d, n, d2h, s))
	must(t, streamSync(s))
	if !bytes.Equal(hb, want) {
		t.Fatal("a pageable H2D copy read the host buffer after the call returned")
	}

	g2 := newGate(t)
	dst := make([]byte, n)
	g2.block(s)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = g2.open()
	}()
	t0 := time.Now()
	must(t, memcpyAsync(uintptr(unsafe.Pointer(&dst[0])), d, n, d2h, s))
	took := time.Since(t0)
	runtime.KeepAlive(dst)
	if took < 40*time.Millisecond || !bytes.Equal(dst, want) {
		t.Fatalf("a pageable D2H copy returned after %v with equal=%v: it must return when done", took, bytes.Equal(dst, want))
	}
	if c := pageableCopies() - before; c != 2 {
		t.Fatalf("pageable copies counted %d, want 2", c)
	}
	must(t, streamSync(s))
}

func TestHostFunc(t *testing.T) {
	g := newGate(t)
	s := newStream(t, streamNonBlocking)
	heldHostFunc(t, g, s, "a host function behind a kernel", "the kernel before it ended", func(counter uintptr) {
		g.block(s)
		must(t, hostFunc(s, counter))
	})
}

// Arguments a launcher or the launch check refuses are errors of the call
// itself; nothing is queued and nothing is sticky.
func TestLaunchErrorsAreImmediate(t *testing.T) {
	lockThread(t)
	s := newStream(t, streamNonBlocking)
	d := devBuf(t, 64)
	wantCode(t, "lsp_cast_f32_to_bf16 with n < 0", castF32ToBF16(d, d, -1, s), errInvalidValue)
	err := badBlock(d, s)
	wantCode(t, "a launch of 2048 threads a block", err, errInvalidConfiguration)
	if !strings.Contains(err.Error(), "block (2048,1,1)") {
		t.Fatalf("message %q does not name the block", err)
	}
	if c := peekError(); c != 0 {
		t.Fatalf("cudaPeekAtLastError = %d after the launcher read the error", c)
	}
	must(t, deviceSync())
	gone, err := streamCreate(streamNonBlocking)
	must(t, err)
	must(t, streamDestroy(gone))
	wantCode(t, "a launch on a destroyed stream", fill(d, 16, 0, gone), errInvalidResourceHandle)
	must(t, fill(d, 16, 0, s))
	must(t, streamSync(s))
}

// A fault the simulator catches while a queued kernel runs is sticky:
// later work is skipped and every call reports it until it is cleared.
func TestStickyError(t *testing.T) {
	lockThread(t)
	g := newGate(t)
	s := newStream(t, streamNonBlocking)
	d := devBuf(t, 256)
	d2 := devBuf(t, 64)
	t.Cleanup(func() { clearSticky() })
	traceOn(true)
	g.block(s)
	must(t, diverge(d, s)) // queued: the fault is in the future
	must(t, fill(d2, 16, 1, s))
	must(t, g.open())
	err := streamSync(s)
	traceOn(false)
	wantCode(t, "synchronize after the faulting kernel", err, errLaunchFailure)
	for _, want := range []string{"rt_diverge_kernel", "__syncthreads", "asynchronous"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("sticky message %q lacks %q", err, want)
		}
	}
	for i := 0; i < 2; i++ {
		if c := lastError(); c != errLaunchFailure {
			t.Fatalf("cudaGetLastError #%d = %d: a sticky error stays", i+1, c)
		}
	}
	_, err = malloc(64)
	wantCode(t, "cudaMalloc after the fault", err, errLaunchFailure)
	wantCode(t, "a launch after the fault", fill(d2, 16, 1, s), errLaunchFailure)
	wantCode(t, "cudaStreamQuery after the fault", streamQuery(s), errLaunchFailure)
	wantCode(t, "cudaDeviceSynchronize after the fault", deviceSync(), errLaunchFailure)
	var skipped bool
	for _, o := range traceRead() {
		if o.Stream == handle(s) && o.Name == "rt_fill_kernel" {
			skipped = o.Status == -1
		}
	}
	if !skipped {
		t.Fatal("the kernel queued after the fault was not skipped")
	}
	if c := clearSticky(); c != errLaunchFailure {
		t.Fatalf("lsp_sim_clear_sticky_error = %d", c)
	}
	if c := lastError(); c != 0 {
		t.Fatalf("cudaGetLastError after clearing = %d", c)
	}
	h, hb := pinnedBuf(t, 64)
	must(t, memcpySync(h, d2, 64, d2h))
	if !bytes.Equal(hb, bytes.Repeat([]byte{0xFF}, 64)) {
		t.Fatal("the skipped kernel wrote its buffer")
	}
}

func TestOutOfMemory(t *testing.T) {
	lockThread(t)
	if !setDeviceMemory(1 << 20) {
		t.Fatal("lsp_sim_set_device_memory refused with no live buffers (an earlier test leaked one?)")
	}
	t.Cleanup(func() { setDeviceMemory(8 << 30) })
	free0, total, err := memGetInfo()
	must(t, err)
	if free0 != 1<<20 || total != 1<<20 {
		t.Fatalf("cudaMemGetInfo = %d free of %d", free0, total)
	}
	if p, _ := deviceProps(0); p.TotalGlobalMem != 1<<20 {
		t.Fatalf("totalGlobalMem %d", p.TotalGlobalMem)
	}
	a, err := malloc(600000)
	must(t, err)
	if f, _, _ := memGetInfo(); f != 1<<20-600064 {
		t.Fatalf("free after 600000 bytes: %d, want %d (256-byte granules)", f, 1<<20-600064)
	}
	_, err = malloc(500000)
	wantCode(t, "cudaMalloc past the device memory", err, errMemoryAllocation)
	if !strings.Contains(err.Error(), "500000 bytes") || !strings.Contains(err.Error(), "448512") {
		t.Fatalf("message %q does not give the bytes asked and free", err)
	}
	if setDeviceMemory(2 << 20) {
		t.Fatal("the device memory changed while a buffer was live")
	}
	if c := lastError(); c != errMemoryAllocation {
		t.Fatalf("cudaGetLastError = %d", c)
	}
	must(t, deviceSync()) // not sticky
	must(t, free(a))
	wantCode(t, "double cudaFree", free(a), errInvalidValue)
	all, err := malloc(1 << 20)
	must(t, err)
	must(t, free(all))
	z, err := malloc(0)
	if err != nil || z != 0 {
		t.Fatalf("cudaMalloc(0) = %#x, %v", z, err)
	}
}

func TestUnsupported(t *testing.T) {
	for name, f := range unsupportedCalls {
		err := f()
		wantCode(t, name, err, errNotSupported)
	}
	_ = lastError()
	must(t, deviceSync())
}

// The hazard delays depend on the seed, the stream's number and the op's
// position only, and the stream's thread sleeps at least that long.
func TestHazardDelays(t *testing.T) {
	t.Cleanup(func() { setDelays(0, 0) })
	d := devBuf(t, 64)
	run := func(seed uint64) []uint {
		setDelays(seed, 300)
		a := newStream(t, streamNonBlocking) // stream 1 since setDelays
		traceOn(true)
		for range 30 {
			must(t, memsetAsync(d, 0, 64, a))
		}
		must(t, streamSync(a))
		traceOn(false)
		var delays []uint
		var prev *opTime
		ops := traceRead()
		for i := range ops {
			o := &ops[i]
			if o.Stream != handle(a) {
				continue
			}
			if o.DelayUS > 300 {
				t.Fatalf("delay %d us above the maximum", o.DelayUS)
			}
			if prev != nil && o.Start-prev.End < int64(o.DelayUS)*1000 {
				t.Fatalf("op %d started %d ns after the previous one, less than its delay of %d us", o.Seq,
					o.Start-prev.End, o.DelayUS)
			}
			delays = append(delays, o.DelayUS)
			prev = o
		}
		return delays
	}
	a, b, c := run(7), run(7), run(8)
	if len(a) != 30 {
		t.Fatalf("%d ops traced", len(a))
	}
	var sum uint
	for i := range a {
		sum += a[i]
		if a[i] != b[i] {
			t.Fatalf("seed 7 gave delay %d then %d for op %d", a[i], b[i], i+1)
		}
	}
	if sum == 0 || slicesEqual(a, c) {
		t.Fatalf("delays %v (seed 7) and %v (seed 8)", a, c)
	}
}

func slicesEqual(a, b []uint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A cudasim binary never loads NVIDIA's libraries.
func TestNoNvidiaLibraries(t *testing.T) {
	exe, err := os.Executable()
	must(t, err)
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("ldd not found")
	}
	out, err := exec.Command("ldd", exe).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd %s: %v\n%s", exe, err, out)
	}
	if !strings.Contains(string(out), "libc.so") {
		t.Fatalf("ldd output does not list libc (did it run?):\n%s", out)
	}
	for _, lib := range []string{"libcuda", "libcudart", "libnvidia", "libnvrtc", "libcublas"} {
		if strings.Contains(string(out), lib) {
			t.Fatalf("the test binary links %s:\n%s", lib, out)
		}
	}
}

// A kernel writing just past the end of a cudaMalloc buffer, into the
// bytes between its end and the guard page, is caught by cudaFree's canary
// check: a sticky cudaErrorIllegalAddress naming the buffer.
func TestCanaryPastTheEnd(t *testing.T) {
	lockThread(t)
	t.Cleanup(func() { clearSticky() })
	s := newStream(t, streamNonBlocking)
	p, err := malloc(1000) // 250 floats; 24 canary bytes up to the guard page
	must(t, err)
	must(t, fill(p, 252, 0, s)) // two floats too many
	must(t, streamSync(s))
	err = free(p)
	wantCode(t, "cudaFree of the overrun buffer", err, errIllegalAddress)
	if !strings.Contains(err.Error(), "past the end of the 1000-byte device buffer") {
		t.Fatalf("message %q", err)
	}
	if c := clearSticky(); c != errIllegalAddress {
		t.Fatalf("sticky error %d", c)
	}
}

// An access through the guard page after a cudaMalloc buffer ends the
// process with the simulator's report (a child process here), as in
// lsp_sim builds.
func TestGuardPage(t *testing.T) {
	if os.Getenv("CUDASIMRT_GUARD_CHILD") == "1" {
		s, err := streamCreate(streamNonBlocking)
		must(t, err)
		p, err := malloc(1000)
		must(t, err)
		must(t, fill(p, 266, 0, s)) // 64 bytes past the end: 40 into the guard page
		_ = streamSync(s)
		t.Fatal("the write into the guard page did not fault")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGuardPage$")
	cmd.Env = append(os.Environ(), "CUDASIMRT_GUARD_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the child did not die:\n%s", out)
	}
	for _, want := range []string{"SIGSEGV in kernel rt_fill_kernel", "past its end", "1000-byte device buffer"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the child's report lacks %q:\n%s", want, out)
		}
	}
}

// LSP_CUDASIM_MEM and LSP_CUDASIM_DELAYS set the device memory and the
// hazard delays at start (in a child process: they are read once).
func TestEnvironment(t *testing.T) {
	if os.Getenv("CUDASIMRT_ENV_CHILD") == "1" {
		_, total, err := memGetInfo()
		must(t, err)
		if total != 64<<20 {
			t.Fatalf("LSP_CUDASIM_MEM=64M gave %d bytes", total)
		}
		s := newStream(t, streamNonBlocking)
		d := devBuf(t, 64)
		traceOn(true)
		for range 20 {
			must(t, memsetAsync(d, 0, 64, s))
		}
		must(t, streamSync(s))
		var sum uint
		for _, o := range traceRead() {
			if o.DelayUS > 100 {
				t.Fatalf("delay %d us above LSP_CUDASIM_DELAYS's 100", o.DelayUS)
			}
			sum += o.DelayUS
		}
		if sum == 0 {
			t.Fatal("LSP_CUDASIM_DELAYS=5:100 gave no delays")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEnvironment$", "-test.v")
	cmd.Env = append(os.Environ(), "CUDASIMRT_ENV_CHILD=1", "LSP_CUDASIM_MEM=64M", "LSP_CUDASIM_DELAYS=5:100")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestEnvironment") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
