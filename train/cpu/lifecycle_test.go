// Tests of the contract's lifecycle and threading rules on the CPU
// backend: destroying streams and events (their work still runs, later use
// is an error, no goroutine outlives a stream or the backend), Record's
// errors, event timing, the device-goroutine rule of hazard mode, the
// staging buffer (one pinned allocation, reused, chunked), and the
// KernelDTypes mode that refuses what the CUDA kernels do not take.

package cpu

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/backend/backendtest"
)

// wantErr fails unless err is an error saying every one of subs.
var wantErr = backendtest.WantErr

func TestCloseEndsEveryGoroutine(t *testing.T) {
	before := backendtest.QuietGoroutines()
	be := New(Config{})
	for _, name := range []string{"a", "b", "c"} {
		newStream(t, be, name)
	}
	if runtime.NumGoroutine() < before+4 {
		t.Fatalf("%d goroutines after 4 streams, %d before: the test counts nothing", runtime.NumGoroutine(), before)
	}
	ok(t, be.Close())
	if n := backendtest.SettledGoroutines(before); n > before {
		t.Errorf("%d goroutines after Close, %d before New", n, before)
	}
}

func TestDestroyStream(t *testing.T) {
	const latency = 20 * time.Millisecond
	be := newBE(t, Config{LinkLatency: latency})
	x := alloc(t, be, "x", 1, backend.F32)
	h, err := be.AllocHost("h", 4)
	ok(t, err)
	h.Float32()[0] = 7
	before := backendtest.QuietGoroutines()
	s := newStream(t, be, "doomed")
	// Work enqueued before the destroy still runs: a slow copy, then a
	// scale that reads what it wrote.
	ok(t, be.CopyH2D(s, x, h, 0))
	ok(t, be.Scale(s, x, 3))
	ok(t, be.DestroyStream(s))
	if n := backendtest.SettledGoroutines(before); n > before {
		t.Errorf("%d goroutines after DestroyStream, %d before NewStream", n, before)
	}
	same(t, "x", get(t, be, x), []float32{21})
	e := newEvent(t, be, "e")
	backendtest.DestroyedStreamRefused(t, be, s, "doomed", x, e)
	mustSync(t, be, be.DefaultStream())
}

func TestDestroyEvent(t *testing.T) {
	const latency = 20 * time.Millisecond
	be := newBE(t, Config{LinkLatency: latency})
	a, b := newStream(t, be, "A"), newStream(t, be, "B")
	x, y := alloc(t, be, "x", 1, backend.F32), alloc(t, be, "y", 1, backend.F32)
	h, err := be.AllocHost("h", 4)
	ok(t, err)
	h.Float32()[0] = 5
	e := newEvent(t, be, "gone")
	ok(t, be.CopyH2D(a, x, h, 0)) // slow
	ok(t, be.Record(e, a))
	ok(t, be.Wait(b, e))
	ok(t, be.DestroyEvent(e))
	// The wait enqueued before the destroy still orders B after the copy.
	ok(t, be.CopyD2D(b, y, x))
	mustSync(t, be, b)
	same(t, "y", get(t, be, y), []float32{5})
	backendtest.DestroyedEventRefused(t, be, e, "gone", a, b)
}

func TestRecordErrors(t *testing.T) {
	be := newBE(t, Config{})
	s, e := backendtest.ForeignRecordRefused(t, be, newBE(t, Config{}), "not a CPU event")
	ok(t, be.Record(e, s))
	mustSync(t, be, s)

	closed := New(Config{})
	ce, cs := newEvent(t, closed, "late"), closed.DefaultStream()
	ok(t, closed.Close())
	wantErr(t, "Record after Close", closed.Record(ce, cs), "closed")
	_, err := closed.NewStream("late")
	wantErr(t, "NewStream after Close", err, "closed")
	_, err = closed.NewEvent("late")
	wantErr(t, "NewEvent after Close", err, "closed")
}

func TestElapsedTime(t *testing.T) {
	const latency = 30 * time.Millisecond
	be := newBE(t, Config{LinkLatency: latency})
	a, b := newStream(t, be, "A"), newStream(t, be, "B")
	x := alloc(t, be, "x", 1, backend.F32)
	h, err := be.AllocHost("h", 4)
	ok(t, err)
	start, mid, end, never := newEvent(t, be, "start"), newEvent(t, be, "mid"), newEvent(t, be, "end"), newEvent(t, be, "never")
	ok(t, be.Record(start, a))
	ok(t, be.CopyH2D(a, x, h, 0)) // latency
	ok(t, be.Record(mid, a))
	// B runs the second copy after the first: end is two latencies after start.
	ok(t, be.Wait(b, mid))
	ok(t, be.CopyD2H(b, h, 0, x))
	ok(t, be.Record(end, b))
	ok(t, be.EventSynchronize(start))
	_, err = be.ElapsedTime(start, end)
	wantErr(t, "ElapsedTime before end completed", err, "end", "not completed")
	ok(t, be.EventSynchronize(end))
	d1, err := be.ElapsedTime(start, mid)
	ok(t, err)
	d2, err := be.ElapsedTime(start, end)
	ok(t, err)
	if d1 < latency*9/10 || d2 < 2*latency*9/10 || d2 <= d1 {
		t.Errorf("elapsed start->mid %v, start->end %v; want at least %v and %v, in that order", d1, d2, latency, 2*latency)
	}
	if back, err := be.ElapsedTime(end, start); err != nil || back != -d2 {
		t.Errorf("elapsed end->start = %v, %v; want %v", back, err, -d2)
	}
	_, err = be.ElapsedTime(start, never)
	wantErr(t, "ElapsedTime of a never-recorded event", err, "never", "never recorded")
	// A later record moves the event: timing uses the latest record.
	ok(t, be.Record(start, b))
	ok(t, be.EventSynchronize(start))
	if d, err := be.ElapsedTime(start, end); err != nil || d > 0 || d < -latency {
		t.Errorf("elapsed from a start recorded after end: %v, %v; want a little below 0", d, err)
	}
}

// TestDeviceGoroutineRule: in hazard mode a call that only the device
// goroutine may make is an error naming the method when another goroutine
// makes it (Free, which returns nothing, reports at the next Synchronize);
// the calls any goroutine may make pass.
func TestDeviceGoroutineRule(t *testing.T) {
	backendtest.DeviceGoroutineRule(t, newBE(t, Config{HazardCheck: true}))

	// Without hazard mode nothing is checked.
	plain := newBE(t, Config{})
	y := alloc(t, plain, "y", 1, backend.F32)
	if err := backendtest.OffGoroutine(func() error { return plain.Fill(plain.DefaultStream(), y, 1) }); err != nil {
		t.Errorf("Fill off the device goroutine without hazard mode: %v", err)
	}
	mustSync(t, plain, plain.DefaultStream())
}

// TestStaging: transfers go through one pinned buffer, allocated at the
// first transfer and reused; tensors larger than it move in chunks.
func TestStaging(t *testing.T) {
	be := newBE(t, Config{HazardCheck: true})
	s := be.DefaultStream()
	r := newRand(3)
	first := be.HostAllocs()
	for _, dt := range []backend.DType{backend.F32, backend.BF16} {
		// Larger than StagingBytes: three chunks.
		n := 2*backend.StagingBytes/dt.Size() + 17
		x := alloc(t, be, "x", n, dt)
		v := randVals(r, n, 3)
		if dt == backend.BF16 {
			v = roundBF16(v)
		}
		ok(t, backend.Upload(be, s, x, v))
		same(t, "round trip "+dt.String(), get(t, be, x), v)
		be.Free(x)
	}
	ids := alloc(t, be, "ids", 5, backend.I32)
	ok(t, backend.UploadInt32(be, s, ids, []int32{1, -2, 3, -4, 5}))
	if got := slices.Clone(i32View(ids)); !slices.Equal(got, []int32{1, -2, 3, -4, 5}) {
		t.Errorf("int32 upload: %v", got)
	}
	empty := alloc(t, be, "empty", 0, backend.F32)
	if v, err := backend.Download(be, s, empty); err != nil || len(v) != 0 {
		t.Errorf("download of nothing: %v, %v", v, err)
	}
	if n := be.HostAllocs() - first; n != 1 {
		t.Errorf("%d host allocations for every transfer, want 1 (the staging buffer)", n)
	}
	if hz := be.Hazards(); len(hz) > 0 {
		t.Errorf("staging reuse has hazards: %v", hz)
	}

	// A small staging buffer: chunks of 16 fp32 values, into a view.
	small := backend.NewStaging(be, 64)
	x := alloc(t, be, "x", 100, backend.F32)
	v := randVals(r, 90, 1)
	ok(t, small.Upload(s, x.Slice(10, 90), v))
	got := make([]float32, 100)
	ok(t, small.DownloadInto(s, got, x))
	same(t, "chunked", got[10:], v)
	same(t, "untouched", got[:10], make([]float32, 10))
	wantErr(t, "upload of the wrong length", small.Upload(s, x, v), "90 values for 100 elements")
	wantErr(t, "download into the wrong length", small.DownloadInto(s, got[:5], x), "5 values for 100")
	wantErr(t, "float upload to i32", small.Upload(s, ids, make([]float32, 5)), "not a float tensor")
	small.Free()
	wantErr(t, "transfer after Free", small.Upload(s, x, make([]float32, 100)), "closed")
}

// TestKernelDTypesMode: with KernelDTypes the CPU backend refuses at
// enqueue, naming the op and the dtypes, exactly the storage the CUDA
// kernels do not take: fp32 GEMM and attention. Without it, it computes
// them.
func TestKernelDTypesMode(t *testing.T) {
	refused := map[string]string{ // case -> the op named in the error
		"gemm": "Gemm(A fp32, B fp32, C fp32)", "attention forward": "AttentionForward(out fp32, lse fp32, qkv fp32, pos absent)",
		"attention backward": "AttentionBackward(dqkv fp32, dout fp32, qkv fp32, out fp32, lse fp32, pos absent, scratch fp32)",
	}
	for _, tc := range dtypeCases() {
		for _, strict := range []bool{true, false} {
			be := newBE(t, Config{Threads: 2, KernelDTypes: strict})
			x := map[string]backend.Tensor{}
			for _, sp := range tc.tensors {
				dt := backend.F32
				if sp.kind == ints {
					dt = backend.I32
				}
				x[sp.name] = alloc(t, be, sp.name, sp.n, dt)
			}
			err := tc.run(t, be, be.DefaultStream(), x)
			if want, ok := refused[tc.name]; ok && strict {
				wantErr(t, tc.name+" in fp32", err, "refused as the CUDA kernel would", want, "must be bf16")
				continue
			}
			if err != nil {
				t.Errorf("%s in fp32 (KernelDTypes %v): %v", tc.name, strict, err)
			}
			// Values are zeros and ids 0: nothing fails on the stream.
			mustSync(t, be, be.DefaultStream())
		}
	}
	// The LayerNorm backward's gradient groups: the activation gradients
	// (dinp, dout) share g_bf16, the parameter gradients (dweight, dbias)
	// dw_bf16; a bf16 model with fp32 parameter gradients mixes the two.
	be := newBE(t, Config{KernelDTypes: true})
	const N, C = 3, 4
	f := func(n int) backend.Tensor { return alloc(t, be, "f", n, backend.F32) }
	h := func(n int) backend.Tensor { return alloc(t, be, "h", n, backend.BF16) }
	s := be.DefaultStream()
	err := be.LayerNormBackward(s, f(N*C), h(C), h(C), h(N*C), h(N*C), h(C), f(N), f(N), lnScratch(t, be, N, C), N, C)
	wantErr(t, "layernorm backward with mixed activation gradients", err, "LayerNormBackward(dinp fp32, dweight bf16, dbias bf16, dout bf16",
		"dinp, dout must share one dtype", "g_bf16")
	err = be.LayerNormBackward(s, h(N*C), h(C), f(C), h(N*C), h(N*C), h(C), f(N), f(N), lnScratch(t, be, N, C), N, C)
	wantErr(t, "layernorm backward with mixed parameter gradients", err, "dweight, dbias must share one dtype", "dw_bf16")
	if err := be.LayerNormBackward(s, h(N*C), f(C), f(C), h(N*C), h(N*C), h(C), f(N), f(N), lnScratch(t, be, N, C), N, C); err != nil {
		t.Errorf("layernorm backward of a bf16 model with fp32 parameter gradients: %v", err)
	}
	mustSync(t, be, s)
}
