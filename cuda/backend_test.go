//go:build cuda || cudasim

// Tests of the contract on the CUDA backend: the lifecycle of streams,
// events and the backend (work still runs after a destroy, later use is an
// error, Close releases the device memory and ends the device thread),
// Record's errors, events with CUDA's rules and the contract's
// never-recorded error, elapsed time, out-of-memory errors that name the
// bytes, sticky async errors, dtype refusals by name, the staging buffer,
// and the device-goroutine rule.
//
// Where a test needs work that has not completed yet it holds a stream
// with a gate (testhooks.go) instead of hoping a kernel is slow.

package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/backend/backendtest"
)

func TestNewDescribesTheDevice(t *testing.T) {
	be := newBE(t, Config{})
	d := be.Device()
	if d.Name == "" || d.TotalMem <= 0 || CheckCapability(d) != nil || be.Name() != "cuda:0" {
		t.Errorf("device %v, name %q: want a named sm_80+ device with memory, cuda:0", d, be.Name())
	}
	if st := be.MemStats(); st.Budget != testBudget || st.InUse != 0 {
		t.Errorf("MemStats %+v, want the budget %d and nothing in use", st, testBudget)
	}
	t.Logf("%v", d)
}

func TestNoSuchDevice(t *testing.T) {
	devs, err := Devices()
	ok(t, err)
	_, err = New(Config{Device: len(devs)})
	wantErr(t, "New on a device past the last", err, "does not exist", "cuda:0")
}

// deviceFree is the free device memory as the runtime reports it, read on
// be's device thread.
func deviceFree(t *testing.T, be *Backend) int64 {
	t.Helper()
	var free int64
	ok(t, be.w.do(func() (err error) {
		free, _, err = rtMemGetInfo()
		return err
	}))
	return free
}

// TestCloseReleases: a backend's arena, host buffers, streams and events
// go at Close, and so does its device thread.
func TestCloseReleases(t *testing.T) {
	watch := newBE(t, Config{MemBudget: 1 << 20})
	before := deviceFree(t, watch)
	goroutines := backendtest.QuietGoroutines()
	const budget = 32 << 20
	be, err := New(Config{MemBudget: budget})
	ok(t, err)
	if used := before - deviceFree(t, watch); used < budget {
		t.Errorf("a backend with a budget of %d bytes took %d bytes of the device", budget, used)
	}
	s := newStream(t, be, "s")
	e := newEvent(t, be, "e")
	x := alloc(t, be, "x", 1000, backend.F32)
	_, err = be.AllocHost("h", 1<<16)
	ok(t, err)
	put(t, be, x, randVals(newRand(1), 1000, 1))
	ok(t, be.Scale(s, x, 2))
	ok(t, be.Record(e, s))
	ok(t, be.Close())
	if free := deviceFree(t, watch); free < before {
		t.Errorf("after Close %d bytes free, %d before New: not released", free, before)
	}
	if n := backendtest.SettledGoroutines(goroutines); n > goroutines {
		t.Errorf("%d goroutines after Close, %d before New: the device thread lives on", n, goroutines)
	}
	ok(t, be.Close()) // again: nothing left, no error
	wantErr(t, "Fill after Close", be.Fill(s, x, 1), "closed")
	wantErr(t, "Record after Close", be.Record(e, be.DefaultStream()), "closed")
	wantErr(t, "EventSynchronize after Close", be.EventSynchronize(e), "closed")
	_, err = be.NewStream("late")
	wantErr(t, "NewStream after Close", err, "closed")
	_, err = be.NewEvent("late")
	wantErr(t, "NewEvent after Close", err, "closed")
	_, err = be.Alloc("late", 1, backend.F32)
	wantErr(t, "Alloc after Close", err, "closed")
	_, err = be.AllocHost("late", 1)
	wantErr(t, "AllocHost after Close", err, "closed")
	wantErr(t, "Synchronize after Close", be.Synchronize(be.DefaultStream()), "closed")
}

// TestDestroyStream: DestroyStream returns at once, as cudaStreamDestroy
// does, yet the work enqueued before it still runs; later use is an error.
func TestDestroyStream(t *testing.T) {
	be := newBE(t, Config{})
	x := alloc(t, be, "x", 100, backend.F32)
	put(t, be, x, slices.Repeat([]float32{7}, 100))
	s := newStream(t, be, "doomed")
	e := newEvent(t, be, "after")
	open, err := be.gate(s)
	ok(t, err)
	defer open()
	ok(t, be.Scale(s, x, 3))
	ok(t, be.Record(e, s))
	notHeld(t, open, func() error { return be.DestroyStream(s) }, // must not wait for the gate
		"DestroyStream waited for the work queued on the stream")
	open()
	ok(t, be.EventSynchronize(e))
	same(t, "x", get(t, be, x), slices.Repeat([]float32{21}, 100))
	backendtest.DestroyedStreamRefused(t, be, s, "doomed", x, e)
	ok(t, be.Synchronize(be.DefaultStream()))
}

// notHeld fails t with held unless f returns, without error, within 10 s
// while a gate is closed; open opens the gate before t fails, so that
// nothing stays held.
func notHeld(t *testing.T, open func(), f func() error, held string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		ok(t, err)
	case <-time.After(10 * time.Second):
		open()
		t.Fatal(held)
	}
}

// TestDestroyEvent: a wait enqueued before the destroy still orders its
// stream after the record; later use is an error.
func TestDestroyEvent(t *testing.T) {
	be := newBE(t, Config{})
	a, b := newStream(t, be, "A"), newStream(t, be, "B")
	x, y := alloc(t, be, "x", 64, backend.F32), alloc(t, be, "y", 64, backend.F32)
	e := newEvent(t, be, "gone")
	open, err := be.gate(a)
	ok(t, err)
	defer open()
	ok(t, be.Fill(a, x, 5))
	ok(t, be.Record(e, a))
	ok(t, be.Wait(b, e))
	ok(t, be.DestroyEvent(e))
	ok(t, be.CopyD2D(b, y, x))
	open()
	ok(t, be.Synchronize(b))
	same(t, "y", get(t, be, y), slices.Repeat([]float32{5}, 64))
	backendtest.DestroyedEventRefused(t, be, e, "gone", a, b)
}

func TestRecordErrors(t *testing.T) {
	be := newBE(t, Config{})
	s, e := backendtest.ForeignRecordRefused(t, be, newBE(t, Config{}), "not a CUDA event")
	wantErr(t, "Record on the backend's internal stream", be.Record(e, be.internal), "does not belong")
	ok(t, be.Record(e, s))
	ok(t, be.Synchronize(s))
}

// TestNeverRecorded: CUDA makes a wait on (and a synchronisation with) an
// event never recorded a no-op; the contract makes it an error.
func TestNeverRecorded(t *testing.T) {
	be := newBE(t, Config{})
	s := newStream(t, be, "s")
	e, rec := newEvent(t, be, "never"), newEvent(t, be, "rec")
	wantErr(t, "Wait", be.Wait(s, e), "never", "never recorded")
	wantErr(t, "EventSynchronize", be.EventSynchronize(e), "never", "never recorded")
	ok(t, be.Record(rec, s))
	ok(t, be.EventSynchronize(rec))
	_, err := be.ElapsedTime(rec, e)
	wantErr(t, "ElapsedTime", err, "never", "never recorded")
	ok(t, be.Record(e, s))
	ok(t, be.Wait(s, e))
	ok(t, be.Synchronize(s))
}

// TestWaitBindsToLatestRecord: a wait binds to the latest record of its
// event when it is enqueued; a record made later (here held by a gate)
// does not hold the waiting stream.
func TestWaitBindsToLatestRecord(t *testing.T) {
	be := newBE(t, Config{})
	a, b := newStream(t, be, "A"), newStream(t, be, "B")
	x := alloc(t, be, "x", 256, backend.F32)
	e, bDone := newEvent(t, be, "e"), newEvent(t, be, "B done")
	ok(t, be.Fill(a, x, 2))
	ok(t, be.Record(e, a)) // record 1: after the fill
	ok(t, be.Wait(b, e))   // binds to record 1
	open, err := be.gate(a)
	ok(t, err)
	defer open()
	ok(t, be.Record(e, a)) // record 2: held by the gate
	ok(t, be.Scale(b, x, 3))
	ok(t, be.Record(bDone, b))
	notHeld(t, open, func() error { return be.EventSynchronize(bDone) },
		"stream B waited for a record of e made after its wait")
	open()
	ok(t, be.Synchronize(a))
	same(t, "x", get(t, be, x), slices.Repeat([]float32{6}, 256))
}

// TestStreamsOrderedByEvents: work on B after a wait on an event recorded
// on A sees A's writes, with the simulated runtime's random delays before
// every queued operation where it has them.
func TestStreamsOrderedByEvents(t *testing.T) {
	if simulated {
		simSetDelays(7, 300)
		defer simSetDelays(0, 0)
	}
	be := newBE(t, Config{})
	a, b := newStream(t, be, "A"), newStream(t, be, "B")
	const n = 4099
	x, y := alloc(t, be, "x", n, backend.F32), alloc(t, be, "y", n, backend.BF16)
	e := newEvent(t, be, "x ready")
	for round := range 20 {
		ok(t, be.Fill(a, x, float32(round)))
		ok(t, be.Scale(a, x, 2))
		ok(t, be.Record(e, a))
		ok(t, be.Wait(b, e))
		ok(t, be.CopyD2D(b, y, x)) // reads x after A's writes
		ok(t, be.Accumulate(b, y, y))
		ok(t, be.Record(e, b))
		ok(t, be.Wait(a, e)) // A's next fill waits for B's read
	}
	ok(t, be.Synchronize(a))
	ok(t, be.Synchronize(b))
	same(t, "y", get(t, be, y), slices.Repeat([]float32{4 * 19}, n))
}

// TestElapsedTime: the time between two records, refused before the
// latest record of either has completed.
func TestElapsedTime(t *testing.T) {
	be := newBE(t, Config{})
	a := newStream(t, be, "A")
	start, end := newEvent(t, be, "start"), newEvent(t, be, "end")
	ok(t, be.Record(start, a))
	open, err := be.gate(a)
	ok(t, err)
	defer open()
	ok(t, be.Record(end, a))
	ok(t, be.EventSynchronize(start))
	_, err = be.ElapsedTime(start, end)
	wantErr(t, "ElapsedTime before end completed", err, "end", "not completed")
	const hold = 50 * time.Millisecond
	time.Sleep(hold)
	open()
	ok(t, be.EventSynchronize(end))
	d, err := be.ElapsedTime(start, end)
	ok(t, err)
	if d < hold*9/10 || d > 30*time.Second {
		t.Errorf("elapsed %v across a gate held %v", d, hold)
	}
	if back, err := be.ElapsedTime(end, start); err != nil || math.Abs(float64(back+d)) > float64(time.Microsecond) {
		t.Errorf("elapsed end->start = %v, %v; want about %v", back, err, -d)
	}
	if z, err := be.ElapsedTime(end, end); err != nil || z != 0 {
		t.Errorf("elapsed end->end = %v, %v; want 0", z, err)
	}
}

// TestOutOfMemory: the budget, the arena and the device refuse with an
// *OutOfMemoryError naming the bytes asked and free.
func TestOutOfMemory(t *testing.T) {
	be := newBE(t, Config{MemBudget: 1 << 20})
	x := alloc(t, be, "x", 100_000, backend.F32) // 400000 bytes
	_, err := be.Alloc("too big", 200_000, backend.F32)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || oom.Asked != 800_000 || oom.Free != 1<<20-400_000 {
		t.Fatalf("over the budget: %v; want an OutOfMemoryError asking 800000 with %d free", err, 1<<20-400_000)
	}
	wantErr(t, "over the budget", err, "too big", "asked 800000 bytes", "648576 bytes", "budget of 1048576")
	be.Free(x)
	y := alloc(t, be, "fits now", 200_000, backend.F32)
	if st := be.MemStats(); st.InUse != 800_000 || st.HighWater != 800_000 {
		t.Errorf("MemStats %+v, want 800000 in use and as high water", st)
	}
	be.Free(y)

	// The device itself: an arena larger than its memory.
	total := be.Device().TotalMem
	_, err = New(Config{MemBudget: 2 * total})
	if !errors.As(err, &oom) || oom.Asked < 2*total || oom.Free <= 0 || oom.Free > total {
		t.Fatalf("an arena of twice the device's memory: %v; want an OutOfMemoryError with the bytes asked and free", err)
	}
	wantErr(t, "arena larger than the device", err, "the device arena", "free on the device", "cudaErrorMemoryAllocation")
	// The device is still usable: the failed cudaMalloc is not sticky.
	z := alloc(t, be, "after", 10, backend.F32)
	ok(t, be.Fill(be.DefaultStream(), z, 1))
	same(t, "z", get(t, be, z), slices.Repeat([]float32{1}, 10))
}

// TestDefaultArena: with no budget the arena is the free memory less the
// headroom (capped in the simulated build).
func TestDefaultArena(t *testing.T) {
	watch := newBE(t, Config{MemBudget: 1 << 20})
	free := deviceFree(t, watch)
	be, err := New(Config{})
	ok(t, err)
	defer be.Close()
	got, want := be.MemStats().Budget, min(free-backend.DeviceHeadroom(free), maxDefaultArena)&^(arenaAlign-1)
	if simulated && got != want || !simulated && (got > want || got < want-free/10) {
		t.Errorf("arena of %d bytes with %d free; want %d", got, free, want)
	}
}

// TestAllocZeroed: Alloc returns zeros, also where a freed buffer was.
func TestAllocZeroed(t *testing.T) {
	be := newBE(t, Config{})
	x := alloc(t, be, "x", 5000, backend.BF16)
	ok(t, be.Fill(be.DefaultStream(), x, 3))
	ok(t, be.Synchronize(be.DefaultStream()))
	be.Free(x)
	y := alloc(t, be, "y", 5000, backend.BF16)
	if y.Buf.(*buffer).off != x.Buf.(*buffer).off {
		t.Fatalf("the arena did not reuse the freed block; the test checks nothing")
	}
	same(t, "y", get(t, be, y), make([]float32, 5000))
	empty := alloc(t, be, "empty", 0, backend.F32)
	ok(t, be.Fill(be.DefaultStream(), empty, 1))
	if v := get(t, be, empty); len(v) != 0 {
		t.Errorf("empty tensor downloads %d values", len(v))
	}
}

// TestTensorChecks: views outside their buffer, freed buffers and another
// backend's tensors are refused before anything is enqueued.
func TestTensorChecks(t *testing.T) {
	be, other := newBE(t, Config{}), newBE(t, Config{})
	s := be.DefaultStream()
	x := alloc(t, be, "x", 10, backend.F32)
	wantErr(t, "view past the end", be.Fill(s, x.Slice(5, 6), 1), "outside its buffer")
	wantErr(t, "another backend's tensor", be.Fill(s, alloc(t, other, "o", 4, backend.F32), 1), "another backend")
	f := alloc(t, be, "freed", 4, backend.F32)
	be.Free(f)
	wantErr(t, "freed buffer", be.Fill(s, f, 1), "freed")
	wantErr(t, "wrong length", be.Add(s, x, x, x.Slice(0, 9)), "b has 9 elements, want 10")
	wantErr(t, "i32 where a float goes", be.Fill(s, alloc(t, be, "ids", 3, backend.I32), 1), "dtype i32")
	h, err := be.AllocHost("h", 16)
	ok(t, err)
	wantErr(t, "copy past the host buffer", be.CopyH2D(s, x, h, 0), "outside buffer of 16 bytes")
	ho, err := other.AllocHost("ho", 64)
	ok(t, err)
	wantErr(t, "another backend's host buffer", be.CopyD2H(s, ho, 0, x), "not a live host buffer")
}

// TestFreeHost: nil is ignored; a freed host buffer is refused by copies,
// and freeing it again is an error the next Synchronize (and Close)
// reports, as FreeHost returns none.
func TestFreeHost(t *testing.T) {
	be, err := New(Config{MemBudget: testBudget})
	ok(t, err)
	s := be.DefaultStream()
	x := alloc(t, be, "x", 1, backend.F32)
	h, err := be.AllocHost("h", 16)
	ok(t, err)
	be.FreeHost(nil)
	ok(t, be.Synchronize(s))
	be.FreeHost(h)
	wantErr(t, "copy from a freed host buffer", be.CopyH2D(s, x, h, 0), "not a live host buffer")
	be.FreeHost(h)
	wantErr(t, "Synchronize after a host buffer freed twice", be.Synchronize(s), "FreeHost", "not a live host buffer")
	wantErr(t, "Close after a host buffer freed twice", be.Close(), "FreeHost", "not a live host buffer")
}

// TestDTypeRefusedByName: what the kernels do not take is refused at
// enqueue, naming the op and every tensor's dtype.
func TestDTypeRefusedByName(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	f := func(n int) backend.Tensor { return alloc(t, be, "f", n, backend.F32) }
	h := func(n int) backend.Tensor { return alloc(t, be, "h", n, backend.BF16) }
	wantErr(t, "fp32 gemm", be.Gemm(s, false, false, 3, 4, 5, 1, f(15), f(20), 0, f(12)),
		"Gemm(A fp32, B fp32, C fp32)", "A, B must be bf16")
	wantErr(t, "fp32 attention", be.AttentionForward(s, f(2*3*8), f(2*2*3), f(2*3*24), backend.Tensor{}, 2, 3, 2, 2, 4, backend.QKVFused),
		"AttentionForward(out fp32, lse fp32, qkv fp32, pos absent)", "must be bf16")
	const N, C = 3, 4
	// dinp and dout share g_bf16 (dweight and dbias have dw_bf16 of their own).
	err := be.LayerNormBackward(s, f(N*C), h(C), h(C), h(N*C), h(N*C), h(C), f(N), f(N), f(backend.LayerNormBackwardScratch(N, C)), N, C)
	wantErr(t, "mixed gradient dtypes", err, "LayerNormBackward(dinp fp32, dweight bf16, dbias bf16, dout bf16", "share one dtype", "g_bf16")
	wantErr(t, "bf16 losses", be.CrossEntropyForwardBackward(s, h(2), f(6), alloc(t, be, "t", 2, backend.I32), 2, 3, 0),
		"CrossEntropyForwardBackward(losses bf16", "losses must be fp32")
	ok(t, be.Gemm(s, false, false, 3, 4, 5, 1, h(15), h(20), 0, f(12)))
	ok(t, be.Synchronize(s))
}

// TestCopies: H2D, D2H at offsets, and D2D in every dtype pair (a cast
// kernel between fp32 and bf16), against the CPU backend.
func TestCopies(t *testing.T) {
	be, ref := newBE(t, Config{}), cpuBE(t)
	s := be.DefaultStream()
	vals := randVals(newRand(5), 1001, 100)
	vals[3], vals[4] = float32(math.Inf(1)), float32(math.NaN())
	h, err := be.AllocHost("h", 8*1001)
	ok(t, err)
	copy(h.Float32()[1001:], vals)
	x := alloc(t, be, "x", 1001, backend.F32)
	ok(t, be.CopyH2D(s, x, h, 4*1001))
	for _, pair := range [][2]backend.DType{{backend.F32, backend.BF16}, {backend.BF16, backend.F32}, {backend.BF16, backend.BF16}, {backend.F32, backend.F32}} {
		src := alloc(t, be, "src", 1001, pair[0])
		dst := alloc(t, be, "dst", 1001, pair[1])
		rs, rd := alloc(t, ref, "src", 1001, pair[0]), alloc(t, ref, "dst", 1001, pair[1])
		ok(t, be.CopyD2D(s, src, x))
		put(t, ref, rs, vals)
		ok(t, be.CopyD2D(s, dst, src))
		ok(t, ref.CopyD2D(ref.DefaultStream(), rd, rs))
		same(t, "copy "+pair[0].String()+" to "+pair[1].String(), get(t, be, dst), get(t, ref, rd))
	}
	ok(t, be.CopyD2H(s, h, 0, x))
	ok(t, be.Synchronize(s))
	same(t, "round trip through the host", h.Float32()[:1001], vals)
	ids := alloc(t, be, "ids", 7, backend.I32)
	ok(t, backend.UploadInt32(be, s, ids, []int32{1, -2, 3, -4, 5, 1 << 30, -7}))
	ids2 := alloc(t, be, "ids2", 7, backend.I32)
	ok(t, be.CopyD2D(s, ids2, ids))
	ok(t, be.CopyD2H(s, h, 0, ids2))
	ok(t, be.Synchronize(s))
	if got := h.Int32()[:7]; !slices.Equal(got, []int32{1, -2, 3, -4, 5, 1 << 30, -7}) {
		t.Errorf("int32 copies: %v", got)
	}
	wantErr(t, "i32 to fp32", be.CopyD2D(s, x.Slice(0, 7), ids), "dtype")
	if tr := be.Traffic(); tr.H2D < 4*1001 || tr.D2H < 4*1001 {
		t.Errorf("traffic %+v, want at least the copies above", tr)
	}
}

// TestStaging: transfers go through one pinned buffer, reused; tensors
// larger than it move in chunks.
func TestStaging(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	first := be.HostAllocs()
	for _, dt := range []backend.DType{backend.F32, backend.BF16} {
		n := 2*backend.StagingBytes/dt.Size() + 17
		x := alloc(t, be, "x", n, dt)
		v := randVals(newRand(3), n, 3)
		if dt == backend.BF16 {
			v = roundBF16(v)
		}
		ok(t, backend.Upload(be, s, x, v))
		same(t, "round trip "+dt.String(), get(t, be, x), v)
		be.Free(x)
	}
	if n := be.HostAllocs() - first; n != 1 {
		t.Errorf("%d host allocations for every transfer, want 1 (the staging buffer)", n)
	}
}

// TestStickyAsyncError: a kernel that fails while it runs returns no error
// when it is enqueued; Synchronize reports it, and so does every later
// Synchronize, EventSynchronize and Close, whichever stream they name. In
// a child process: on a GPU the fault poisons the process's context.
func TestStickyAsyncError(t *testing.T) {
	if !inChild() {
		out := runChild(t, "TestStickyAsyncError")
		if !strings.Contains(out, "sticky error seen") {
			t.Errorf("the child did not reach its checks:\n%s", out)
		}
		return
	}
	be, err := New(Config{MemBudget: testBudget})
	ok(t, err)
	s, other := newStream(t, be, "faulty"), newStream(t, be, "other")
	e := newEvent(t, be, "after fault")
	ok(t, be.fault(s))
	ok(t, be.Record(e, s))
	first := be.Synchronize(s)
	if first == nil {
		t.Fatal("Synchronize after a failing kernel: no error")
	}
	want := "cudaErrorIllegalAddress"
	if simulated {
		want = "lspcu_fault_kernel"
	}
	wantErr(t, "Synchronize after a failing kernel", first, "faulty", want)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"second Synchronize", be.Synchronize(s)},
		{"Synchronize of another stream", be.Synchronize(other)},
		{"EventSynchronize", be.EventSynchronize(e)},
		{"Close", be.Close()},
	} {
		if !errors.Is(c.err, first) {
			t.Errorf("%s: %v, want the first error again: %v", c.what, c.err, first)
		}
	}
	t.Logf("sticky error seen: %v", first)
}

// TestGoroutineRule: with CheckGoroutine a call only the device goroutine
// may make is an error naming the method when another goroutine makes it;
// the calls any goroutine may make pass.
func TestGoroutineRule(t *testing.T) {
	backendtest.DeviceGoroutineRule(t, newBE(t, Config{CheckGoroutine: true}))
}

// TestDeviceThread: every runtime call the backend makes for enqueues and
// resources runs on its device thread, whichever OS thread the device
// goroutine is on (here one locked to a thread of its own) and while host
// goroutines wait on events and read pinned memory on theirs.
func TestDeviceThread(t *testing.T) {
	before := offWorkerCalls()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Add(1)
	go func() { // the device goroutine, on a thread the backend did not pick
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		errs <- deviceWork()
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := offWorkerCalls() - before; n != 0 {
		t.Errorf("%d runtime calls made off the backend's device thread", n)
	}
}

// deviceWork opens a backend, streams rounds of work to host goroutines
// that wait on events and check pinned memory, and closes it.
func deviceWork() (err error) {
	be, err := New(Config{MemBudget: testBudget, CheckGoroutine: true})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := be.Close(); err == nil {
			err = cerr
		}
	}()
	const n, rounds = 1000, 8
	s := be.DefaultStream()
	x := make([]backend.Tensor, rounds)
	hs := make([]backend.HostBuffer, rounds)
	es := make([]backend.Event, rounds)
	for i := range rounds {
		if x[i], err = be.Alloc("x", n, backend.F32); err != nil {
			return err
		}
		if hs[i], err = be.AllocHost("h", 4*n); err != nil {
			return err
		}
		if es[i], err = be.NewEvent("e"); err != nil {
			return err
		}
	}
	hostErrs := make(chan error, rounds)
	for i := range rounds {
		if err := be.Fill(s, x[i], float32(i)); err != nil {
			return err
		}
		if err := be.CopyD2H(s, hs[i], 0, x[i]); err != nil {
			return err
		}
		if err := be.Record(es[i], s); err != nil {
			return err
		}
		go func() { // a host node: wait, then read pinned memory
			if err := be.EventSynchronize(es[i]); err != nil {
				hostErrs <- err
				return
			}
			for j, v := range hs[i].Float32() {
				if v != float32(i) {
					hostErrs <- fmt.Errorf("round %d: the host read %v at %d after the event, want %d", i, v, j, i)
					return
				}
			}
			hostErrs <- nil
		}()
	}
	for range rounds {
		if err := <-hostErrs; err != nil {
			return err
		}
	}
	if v := be.ThreadViolations(); len(v) > 0 {
		return v[0]
	}
	return be.Synchronize(s)
}

// BenchmarkEnqueue is the cost of one enqueue through the device thread
// (the checks, the hand-over to the locked thread and back, and the
// runtime call), in ns/op, measured with Record, whose device work is
// negligible next to it.
func BenchmarkEnqueue(b *testing.B) {
	be := newBE(b, Config{})
	s := be.DefaultStream()
	e := newEvent(b, be, "e")
	b.ResetTimer()
	for range b.N {
		if err := be.Record(e, s); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	ok(b, be.Synchronize(s))
}
