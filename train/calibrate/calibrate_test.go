package calibrate

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/llama"
)

// methods are the ops Measure times at every geometry.
var methods = []string{
	"Accumulate", "AdamW", "Add", "AddBias", "AttentionBackward", "AttentionForward", "BiasBackward",
	"CopyD2D", "DenseApply", "DenseGemm", "CrossEntropyForwardBackward", "EncoderBackward", "EncoderForward", "Fill",
	"GeluBackward", "GeluForward", "LayerNormBackward", "LayerNormForward", "NonFiniteFlag",
	"RMSNormBackward", "RMSNormForward", "RoPEBackward", "RoPEForward", "Scale", "SparseApply",
	"SparseCompressA", "SparseCompressB", "SparseS", "SumSquares", "SwiGLUBackward", "SwiGLUForward",
}

func finitePositive(t *testing.T, name string, x float64) {
	t.Helper()
	if !(x > 0) || math.IsInf(x, 0) {
		t.Errorf("%s = %v, want finite and positive", name, x)
	}
}

// TestMeasureSmall runs Measure at tiny sizes and checks that every figure
// is there, positive and finite, and that the figures agree with each
// other; absolute speeds are not checked (the machine may be shared).
func TestMeasureSmall(t *testing.T) {
	big := GemmShape{M: 256, N: 256, K: 256}
	tiny := GemmShape{TransB: true, M: 4, N: 4, K: 4}
	opt := Options{
		Threads: 2,
		Gemms:   []GemmShape{big, tiny, big},
		// Two geometries: gpt2-like (fused MHA) and llama-like (planar GQA).
		Ops: []OpSize{{B: 2, T: 64, C: 64, NH: 4, V: 300},
			{B: 1, T: 32, C: 64, NH: 4, KVH: 2, V: 100, I: 96, Layout: backend.QKVPlanar, D: 32, R: 4}},
		Budget: time.Second, Squares: []int{16, 64, 256},
		TriadElements: 1 << 20, AdamParams: 1 << 18, Window: 50 * time.Millisecond,
	}
	c, err := Measure(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if c.Threads != 2 || c.SIMD == "" {
		t.Errorf("threads %d, simd %q", c.Threads, c.SIMD)
	}
	if len(c.Gemm) != 2 || len(c.GemmSquares) != 3 {
		t.Fatalf("%d gemm samples and %d squares, want 2 (duplicates timed once) and 3", len(c.Gemm), len(c.GemmSquares))
	}
	for _, g := range append(slices.Clone(c.Gemm), c.GemmSquares...) {
		finitePositive(t, "rate of "+g.Shape.String(), g.Rate)
		if !(g.Best > 0 && g.Best <= g.Seconds) {
			t.Errorf("%v: best %v s, median %v s", g.Shape, g.Best, g.Seconds)
		}
		if math.Abs(g.Rate*g.Seconds/g.Shape.FLOPs()-1) > 1e-9 {
			t.Errorf("%v: rate %v x %v s is not its FLOPs", g.Shape, g.Rate, g.Seconds)
		}
	}
	if c.GemmRate(big) <= c.GemmRate(tiny) {
		t.Errorf("gemm rate at %v (%v) not above %v (%v)", big, c.GemmRate(big), tiny, c.GemmRate(tiny))
	}
	finitePositive(t, "peak", c.GemmPeak)
	for _, x := range []struct {
		name string
		v    float64
	}{
		{"triad", c.Memory.Triad}, {"triad plain", c.Memory.TriadPlain}, {"rmw", c.Memory.RMW}, {"copy", c.Memory.Copy},
		{"op overhead", c.Overhead.Op}, {"round trip", c.Overhead.RoundTrip}, {"record/wait", c.Overhead.RecordWait},
		{"synchronize", c.Overhead.Synchronize},
		{"h2d", c.Link.H2D}, {"d2h", c.Link.D2H}, {"h2d latency", c.Link.H2DLatency}, {"d2h latency", c.Link.D2HLatency},
		{"adam", c.HostAdam.Rate}, {"adam eff", c.HostAdam.Eff}, {"adam overhead", c.HostAdam.Overhead},
		{"seconds", c.Seconds},
	} {
		finitePositive(t, x.name, x.v)
	}
	// Bandwidths of one memory: triad, backend copy and read-modify-write
	// within a factor of 10 of each other, whatever else runs (not under
	// the race detector, which slows the backend's Go loops).
	for _, b := range []float64{c.Memory.Copy, c.Memory.RMW} {
		if r := b / c.Memory.Triad; !raceEnabled && (r < 0.1 || r > 10) {
			t.Errorf("bandwidth %v is %.2f times the triad %v", b, r, c.Memory.Triad)
		}
	}
	if c.Memory.Triad < c.Memory.TriadPlain {
		t.Errorf("triad %v below its plain-store figure %v: it is the higher of two", c.Memory.Triad, c.Memory.TriadPlain)
	}
	// A one-element op costs less than a 256^3 GEMM.
	if c.Overhead.Op >= c.GemmTime(big) {
		t.Errorf("op overhead %v s not below a %v GEMM's %v s", c.Overhead.Op, big, c.GemmTime(big))
	}
	// Every pair of the GEMM, the host Adam and a copy, each rate there.
	if len(c.Sharing) != 3 {
		t.Errorf("%d sharing pairs, want 3", len(c.Sharing))
	}
	for _, p := range c.Sharing {
		for _, v := range []float64{p.AAlone, p.AShared, p.BAlone, p.BShared} {
			finitePositive(t, p.A+" with "+p.B, v)
		}
	}
	if c.HostAdam.BytesPerParam != 32 {
		t.Errorf("host adam %d bytes per parameter, want 32 (fp32 gradient read twice, w, m, v read and written)", c.HostAdam.BytesPerParam)
	}

	seen := map[string]int{}
	for _, o := range c.Ops {
		seen[o.Method]++
		finitePositive(t, o.Method+" seconds", o.Seconds)
		finitePositive(t, o.Method+" bytes", o.Bytes)
		finitePositive(t, o.Method+" eff", o.Eff)
		finitePositive(t, o.Method+" rate", o.Rate)
		if !(o.Best > 0 && o.Best <= o.Seconds) {
			t.Errorf("%s %s: best %v s, median %v s", o.Method, o.Dims, o.Best, o.Seconds)
		}
		if (o.Basis == "flops") != (o.FLOPs > 0) || (o.Basis != "flops" && o.Basis != "bytes") {
			t.Errorf("%s %s: basis %q with %v FLOPs", o.Method, o.Dims, o.Basis, o.FLOPs)
		}
		// OpTime gives back the measured time at a measured size (the
		// geometric mean of samples of the same cost: AdamW and
		// SumSquares, of 12*C*C elements in both geometries).
		if same(c.Ops, o) {
			continue
		}
		if got := c.OpTime(o.Method, o.FLOPs, o.Bytes); math.Abs(got/o.Seconds-1) > 1e-6 && o.Seconds > 1.02*c.Overhead.Op {
			t.Errorf("%s %s: OpTime %v s, measured %v s", o.Method, o.Dims, got, o.Seconds)
		}
	}
	for _, m := range methods {
		if seen[m] < 2 {
			t.Errorf("%s measured %d times, want once per geometry at least", m, seen[m])
		}
	}
	// T=64 gives attention at T 16, 32 and 64; T=32 at 16 and 32 (8 is
	// too short).
	if seen["AttentionForward"] != 5 || seen["AttentionBackward"] != 5 {
		t.Errorf("attention measured %d/%d times, want 5 each", seen["AttentionForward"], seen["AttentionBackward"])
	}
	if len(seen) != len(methods) {
		t.Errorf("measured methods %v, want %v", seen, methods)
	}

	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cpu.json")
	if err := os.WriteFile(path, js, 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("ReadFile of a missing file succeeded")
	}
	if err := os.WriteFile(path, []byte(`{"threads": 2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err == nil {
		t.Error("ReadFile of a description with no rates succeeded")
	}
	if back.GemmRate(big) != c.GemmRate(big) || back.Memory != c.Memory || len(back.Ops) != len(c.Ops) {
		t.Errorf("JSON round trip changed the description")
	}
}

// same reports whether another sample of o's method has o's cost.
func same(ops []OpSample, o OpSample) bool {
	n := 0
	for _, x := range ops {
		if x.Method == o.Method && x.FLOPs == o.FLOPs && x.Bytes == o.Bytes {
			n++
		}
	}
	return n > 1
}

func TestMeasureRejects(t *testing.T) {
	for _, o := range []Options{
		{Gemms: []GemmShape{{M: 0, N: 1, K: 1}}},
		{Ops: []OpSize{{B: 1, T: 8, C: 6, NH: 4, V: 10}}},          // C not NH times a head size
		{Ops: []OpSize{{B: 1, T: 8, C: 64, NH: 4, KVH: 3, V: 10}}}, // NH not a multiple of KVH
	} {
		if _, err := Measure(context.Background(), o); err == nil {
			t.Errorf("Measure(%+v) succeeded", o)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Measure(ctx, Options{Squares: []int{8}, TriadElements: 1 << 10, AdamParams: 1 << 10}); err == nil {
		t.Error("Measure with a cancelled context succeeded")
	}
}

// TestGemmRate checks the fallback on a made-up description.
func TestGemmRate(t *testing.T) {
	sq := func(n int, rate float64) GemmSample {
		s := GemmShape{M: n, N: n, K: n}
		return GemmSample{Shape: s, Rate: rate, Seconds: s.FLOPs() / rate}
	}
	exact := GemmShape{TransA: true, M: 64, N: 64, K: 64}
	c := CPU{Gemm: []GemmSample{{Shape: exact, Rate: 7}}, GemmSquares: []GemmSample{sq(256, 100), sq(16, 10), sq(64, 40)}}
	for _, x := range []struct {
		s    GemmShape
		want float64
	}{
		{exact, 7},                           // measured: its own rate
		{GemmShape{M: 64, N: 64, K: 64}, 40}, // a square
		{GemmShape{TransB: true, M: 64, N: 64, K: 64}, 40},       // same intensity as the square
		{GemmShape{M: 4, N: 4, K: 4}, 10},                        // clamped below
		{GemmShape{M: 4096, N: 4096, K: 4096}, 100},              // clamped above
		{GemmShape{M: 1024, N: 1024, K: 1}, 10},                  // K=1: intensity under 1, the smallest class
		{GemmShape{M: 128, N: 128, K: 128}, math.Sqrt(40 * 100)}, // halfway in log
	} {
		if got := c.GemmRate(x.s); math.Abs(got/x.want-1) > 1e-9 {
			t.Errorf("GemmRate(%v) = %v, want %v", x.s, got, x.want)
		}
	}
	if got := (CPU{}).GemmRate(exact); got != 0 {
		t.Errorf("GemmRate with nothing measured = %v, want 0", got)
	}
	if got := (CPU{}).GemmTime(exact); !math.IsInf(got, 1) {
		t.Errorf("GemmTime with nothing measured = %v, want +Inf", got)
	}
	// Only exact shapes: they are the fallback.
	c2 := CPU{Gemm: []GemmSample{sq(16, 10), sq(256, 100)}}
	if got := c2.GemmRate(GemmShape{M: 64, N: 64, K: 64}); !(got > 10 && got < 100) {
		t.Errorf("GemmRate between exact shapes = %v, want in (10, 100)", got)
	}
}

func TestGemmShapeText(t *testing.T) {
	for _, s := range []GemmShape{{M: 1, N: 2, K: 3}, {TransA: true, M: 50257, N: 768, K: 1024}, {TransB: true, M: 4, N: 5, K: 6}, {true, true, 7, 8, 9}} {
		b, err := s.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back GemmShape
		if err := back.UnmarshalText(b); err != nil || back != s {
			t.Errorf("%q read back as %v (%v), want %v", b, back, err, s)
		}
	}
	if got := (GemmShape{TransB: true, M: 1024, N: 50257, K: 768}).String(); got != "NT 1024x50257x768" {
		t.Errorf("String = %q", got)
	}
	for _, bad := range []string{"", "NX 1x2x3", "N 1x2x3", "NN 1x2"} {
		var s GemmShape
		if err := s.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q read as %v", bad, s)
		}
	}
}

// TestStepGemms checks the GPT-2 124M list against bench/gemm's (the
// shapes of train/gpt2 at B*T = 1024), and a LLaMA model's count.
func TestStepGemms(t *testing.T) {
	c, err := gpt2.Preset("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	got, err := StepGemms(c, 4, 256)
	if err != nil {
		t.Fatal(err)
	}
	want := []GemmShape{
		{false, false, 1024, 2304, 768}, {false, false, 1024, 768, 768}, {false, false, 1024, 3072, 768}, {false, false, 1024, 768, 3072},
		{false, true, 1024, 50257, 768}, {false, false, 1024, 768, 50257}, {true, false, 50257, 768, 1024},
		{true, false, 3072, 768, 1024}, {false, true, 1024, 3072, 768}, {true, false, 768, 3072, 1024}, {false, true, 1024, 768, 3072},
		{true, false, 768, 768, 1024}, {false, true, 1024, 768, 768}, {true, false, 768, 2304, 1024}, {false, true, 1024, 768, 2304},
	}
	if !slices.Equal(got, want) {
		t.Errorf("gpt2 step gemms\n got %v\nwant %v", got, want)
	}
	l, err := llama.Preset("llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	got, err = StepGemms(l, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	// q, k, v, o, gate, up, down: 4 distinct shapes each of forward, dW
	// and dX (q and o are 128 x 128, k and v 128 x 64, gate and up 128 x
	// 344), and the head's 3.
	if len(got) != 15 {
		t.Errorf("llama-tiny: %d distinct shapes, want 15: %v", len(got), got)
	}
	if _, err := StepGemms(c, 0, 256); err == nil {
		t.Error("StepGemms with B=0 succeeded")
	}
	g, err := SizeOf(l, 2, 8)
	if err != nil || g.KVH != 2 || g.Layout != backend.QKVPlanar || g.I != 344 {
		t.Errorf("SizeOf(llama-tiny) = %+v, %v", g, err)
	}
}

// TestOpEff checks the interpolation and fallback on a made-up description.
func TestOpEff(t *testing.T) {
	c := CPU{GemmPeak: 100, Memory: Memory{Triad: 10}, Overhead: Overhead{Op: 1},
		Ops: []OpSample{
			{Method: "X", Bytes: 10, Seconds: 3},    // ideal 1 s, eff 1/2
			{Method: "X", Bytes: 1000, Seconds: 26}, // ideal 100 s, eff 4
			{Method: "Y", FLOPs: 100, Bytes: 1, Seconds: 5},
			{Method: "W", Bytes: 10, Seconds: 2}, // eff 1
			{Method: "W", Bytes: 10, Seconds: 5}, // eff 1/4
		}}
	c.finishOps()
	for _, x := range []struct {
		m            string
		flops, bytes float64
		want         float64
		known        bool
	}{
		{"X", 0, 10, 0.5, true},
		{"X", 0, 1000, 4, true},
		{"X", 0, 100, 2.25, true}, // halfway in log(ideal)
		{"X", 0, 1, 0.5, true},    // clamped
		{"Y", 100, 1, 0.25, true},
		{"W", 0, 10, 0.5, true}, // two samples of one cost: geometric mean
		{"Z", 0, 1, 0.5, false}, // the median of all
	} {
		got, known := c.OpEff(x.m, x.flops, x.bytes)
		if math.Abs(got-x.want) > 1e-12 || known != x.known {
			t.Errorf("OpEff(%s, %v, %v) = %v, %v; want %v, %v", x.m, x.flops, x.bytes, got, known, x.want, x.known)
		}
	}
	if got := c.OpTime("X", 0, 100); math.Abs(got-(10/2.25+1)) > 1e-12 {
		t.Errorf("OpTime = %v", got)
	}
}

// TestColdTiming: cold timing reads a buffer twice the last-level cache's
// size before each op, times the op alone by events, adds the enqueue
// overhead it is given, and frees what it allocated when turned off; a
// cold op is not faster than its warm time by more than noise can explain
// (its sweep is outside the events).
func TestColdTiming(t *testing.T) {
	be := cpu.New(cpu.Config{Threads: 1})
	defer be.Close()
	m := &meter{ctx: context.Background(), be: be, s: be.DefaultStream(), share: 20 * time.Millisecond}
	x, err := m.alloc("x", 1<<20, backend.F32, 1)
	if err != nil {
		t.Fatal(err)
	}
	y, err := m.alloc("y", 1<<20, backend.F32, 1)
	if err != nil {
		t.Fatal(err)
	}
	op := func() error { return be.Accumulate(m.s, y, x) }
	before := be.MemStats().InUse
	off, err := m.coldTiming(1e-3)
	if err != nil {
		t.Fatal(err)
	}
	llc := host.TriadLLCBytes()
	if llc <= 0 {
		llc = 32 << 20
	}
	if got := be.MemStats().InUse - before; got < 2*llc || got > 2*llc+1<<20 {
		t.Errorf("flush buffers: %d bytes, want twice the last-level cache's %d and a little", got, llc)
	}
	if !(m.cold.sec > 0) {
		t.Errorf("sweep time %v, want > 0", m.cold.sec)
	}
	cold, err := m.perOp(op)
	if err != nil {
		t.Fatal(err)
	}
	if cold < 1e-3 {
		t.Errorf("cold time %v lacks the 1 ms overhead it was given", cold)
	}
	off()
	if m.cold != nil || m.e0 != nil {
		t.Error("cold timing still on after off()")
	}
	if got := be.MemStats().InUse; got != before {
		t.Errorf("after off(): %d bytes in use, want %d", got, before)
	}
	warm, err := m.perOp(op)
	if err != nil {
		t.Fatal(err)
	}
	if !(warm > 0) {
		t.Errorf("warm time %v", warm)
	}
	m.release()
}

// TestMeasureBetween: Between runs after every round of the cold timings,
// Rounds times, and its error stops Measure.
func TestMeasureBetween(t *testing.T) {
	calls := 0
	opt := Options{
		Threads: 1, Gemms: []GemmShape{{M: 8, N: 8, K: 8}}, Squares: []int{16},
		Ops:    []OpSize{{B: 1, T: 16, C: 16, NH: 2, V: 50}},
		Budget: 200 * time.Millisecond, TriadElements: 1 << 16, AdamParams: 1 << 12, Window: 10 * time.Millisecond,
		Rounds: 7, Between: func() error { calls++; return nil },
	}
	if _, err := Measure(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if calls != 7 {
		t.Errorf("Between called %d times, want Rounds = 7", calls)
	}
	stop := errors.New("stop here")
	opt.Between = func() error { return stop }
	if _, err := Measure(context.Background(), opt); !errors.Is(err, stop) {
		t.Errorf("Measure with a failing Between: %v, want its error", err)
	}
}
