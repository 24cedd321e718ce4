package plan

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/calibrate"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// fakeCalibration is a hand-made description with round figures.
func fakeCalibration() calibrate.CPU {
	sq := func(n int, rate float64) calibrate.GemmSample {
		s := calibrate.GemmShape{M: n, N: n, K: n}
		return calibrate.GemmSample{Shape: s, Seconds: s.FLOPs() / rate, Rate: rate}
	}
	exact := calibrate.GemmShape{TransB: true, M: 64, N: 96, K: 32}
	return calibrate.CPU{
		Threads: 2, SIMD: "test",
		Gemm:        []calibrate.GemmSample{{Shape: exact, Seconds: exact.FLOPs() / 20e9, Rate: 20e9}},
		GemmSquares: []calibrate.GemmSample{sq(32, 10e9), sq(256, 50e9)},
		GemmPeak:    50e9,
		Memory:      calibrate.Memory{Triad: 10e9},
		Ops: []calibrate.OpSample{
			{Method: "GeluForward", Bytes: 1e6, Seconds: 2e-4 + 1e-6, Eff: 0.5},
			{Method: "AttentionForward", FLOPs: 1e8, Bytes: 1e5, Seconds: 4e-3 + 1e-6, Eff: 0.5},
		},
		Overhead: calibrate.Overhead{Op: 1e-6, RoundTrip: 5e-6, RecordWait: 2e-6, Synchronize: 1e-6},
		Link:     calibrate.Link{H2D: 4e9, D2H: 2e9, H2DLatency: 3e-6, D2HLatency: 1e-6, Bytes: 64 << 20},
		HostAdam: calibrate.HostAdam{Params: 1 << 20, BytesPerParam: 32, Rate: 1.5625e8, Eff: 0.5, Overhead: 30e-6},
		Sharing: []calibrate.Sharing{
			{A: "gemm NN 256x256x256", B: "host adam", AAlone: 50e9, AShared: 30e9, BAlone: 1.5e8, BShared: 0.6e8},
			{A: "gemm NN 256x256x256", B: "copy h2d", AAlone: 50e9, AShared: 40e9, BAlone: 4e9, BShared: 2e9},
			{A: "host adam", B: "copy h2d", AAlone: 1.5e8, AShared: 1.2e8, BAlone: 4e9, BShared: 3e9},
		},
	}
}

func TestFromCalibration(t *testing.T) {
	c := fakeCalibration()
	m, err := FromCalibration(c, cpu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	close := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("%s: %g, want %g", name, got, want)
		}
	}
	// A GEMM at a measured shape: its measured time; at another, the
	// squares' rate interpolated (calibrate.GemmTime).
	g := trace.Op{Method: "Gemm", Family: trace.Gemm, FLOPs: 2 * 64 * 96 * 32, Gemm: trace.GemmArgs{TransB: true, M: 64, N: 96, K: 32}}
	close("measured gemm", m.OpTime(g), 2*64*96*32/20e9)
	g.Gemm.TransB = false
	close("unmeasured gemm", m.OpTime(g), c.GemmTime(calibrate.GemmShape{M: 64, N: 96, K: 32}))
	// A memory-bound op: calibrate's OpTime at its bytes and no FLOPs,
	// whatever FLOPs the tracer counted.
	e := trace.Op{Method: "GeluForward", Family: trace.Activation, FLOPs: 1e9, Bytes: 1e6}
	close("gelu", m.OpTime(e), c.OpTime("GeluForward", 0, 1e6))
	close("gelu", m.OpTime(e), 1e6/10e9/0.5+1e-6)
	// Attention: its FLOPs count.
	a := trace.Op{Method: "AttentionForward", Family: trace.Attention, FLOPs: 1e8, Bytes: 1e5}
	close("attention", m.OpTime(a), 1e8/50e9/0.5+1e-6)
	// The link: memcpy bandwidth and latency, no charge.
	l := trace.Op{Method: "CopyH2D", Family: trace.Copy, Bytes: 4e6, Link: trace.H2D}
	close("h2d", m.OpTime(l), 2e-6+4e6/4e9)
	// Host Adam: its overhead plus its bytes at the measured rate.
	close("host adam", m.HostTime(engine.HostWork{Bytes: 32e6}), 30e-6+32e6/(32*1.5625e8))
	// Schedule overheads.
	close("sync", m.GPU.Sync, 4e-6)
	close("event", m.GPU.Event, 2e-6)
	// Contention: each side of each pair.
	for _, x := range []struct {
		a, b Bound
		want float64
	}{
		{ComputeBound, HostBound, 0.6}, {HostBound, ComputeBound, 0.4},
		{ComputeBound, LinkBound, 0.8}, {LinkBound, ComputeBound, 0.5},
		{HostBound, LinkBound, 0.8}, {LinkBound, HostBound, 0.75},
	} {
		close(string(x.a)+" with "+string(x.b), m.GPU.Contention[[2]Bound{x.a, x.b}], x.want)
	}
	if !m.GPU.SharesHost || m.Host.Workers != 2 {
		t.Errorf("shares host %v, %d workers", m.GPU.SharesHost, m.Host.Workers)
	}

	// A charged link (cpu.Config's LinkBandwidth and LinkLatency): the
	// sleep adds to the memcpy, and a copy contends for the cores only
	// while it copies: 64 MiB at 4 GB/s copying, at 1 GB/s plus 10 us
	// sleeping.
	m, err = FromCalibration(c, cpu.Config{LinkBandwidth: 1e9, LinkLatency: 10 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	close("charged h2d", m.OpTime(l), 2e-6+10e-6+4e6/4e9+4e6/1e9)
	n := float64(64 << 20)
	busy := (n / 4e9) / (n/4e9 + 10e-6 + n/1e9)
	close("compute with charged link", m.GPU.Contention[[2]Bound{ComputeBound, LinkBound}], 1-busy*(1-0.8))
	close("charged link with compute", m.GPU.Contention[[2]Bound{LinkBound, ComputeBound}], 1/(1-busy+busy/0.5))

	if _, err := FromCalibration(calibrate.CPU{Threads: 2}, cpu.Config{}); err == nil {
		t.Error("an empty calibration made a machine")
	}
}

// TestContentionSlowsBoth: with measured contention, two queues running
// at once each run at the measured share; alone at full speed.
func TestContentionSlowsBoth(t *testing.T) {
	r := Resources{SharesHost: true, Cores: 2, Workers: 2,
		Contention: map[[2]Bound]float64{{ComputeBound, HostBound}: 0.5, {HostBound, ComputeBound}: 0.25}}
	tasks := []Task{{Name: "c", Queue: engine.Compute, Work: 1}, {Name: "h", Queue: engine.Host, Work: 1}}
	res, err := Simulate(tasks, r)
	if err != nil {
		t.Fatal(err)
	}
	// Both run: compute at 0.5 ends at 2; the host did 0.5 by then, its
	// last 0.5 alone: 2.5.
	if !near(res.End[0], 2) || !near(res.End[1], 2.5) {
		t.Errorf("ends %v, want [2 2.5]", res.End)
	}
}

// TestCPUMachinePredictsStep: the CPU machine built from a small
// calibration predicts a small model's step on this machine within a loose
// factor (the machine may be shared), and its predictions are consistent:
// the sequential step is the sum of its tasks.
func TestCPUMachinePredictsStep(t *testing.T) {
	arch := gpt2.Config{V: 128, MaxT: 32, C: 64, L: 2, NH: 4, Eps: 1e-5}
	const B, T = 4, 32
	cfg := engineConfig(engine.Zero)
	cfg.Pipelined, cfg.HostThreads = false, 2
	cfg.DenseParams = engine.DenseDevice
	_, ops, err := Trace(arch, B, T, 1, backend.F32, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var gemms []calibrate.GemmShape
	for _, o := range ops {
		if o.Family == trace.Gemm {
			gemms = append(gemms, calibrate.GemmShape{TransA: o.Gemm.TransA, TransB: o.Gemm.TransB, M: o.Gemm.M, N: o.Gemm.N, K: o.Gemm.K})
		}
	}
	size, err := calibrate.SizeOf(arch, B, T)
	if err != nil {
		t.Fatal(err)
	}
	size.D, size.R = 8, 2
	c, err := calibrate.Measure(context.Background(), calibrate.Options{Threads: 2, Gemms: gemms, Ops: []calibrate.OpSize{size},
		Budget: time.Second, Squares: []int{16, 64, 128}, TriadElements: 1 << 20, AdamParams: 1 << 18, Window: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m, err := FromCalibration(c, cpu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := mustPlan(t, Config{Arch: arch, B: B, T: T, Accum: 1, DType: backend.F32, Engine: cfg}, m)
	sum := 0.0
	for _, task := range r.Tasks {
		sum += task.Work
	}
	if math.Abs(r.Step-sum) > 1e-9*sum {
		t.Errorf("sequential step %g s, its tasks sum to %g s", r.Step, sum)
	}

	be := cpu.New(cpu.Config{Threads: 2})
	defer be.Close()
	e, err := engine.New(be, arch, B, T, 1, backend.F32, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Free()
	if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, arch.Init(1)); err != nil {
		t.Fatal(err)
	}
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	b := data.Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T), NumTargets: B * T}
	for i := range b.Inputs {
		b.Inputs[i], b.Targets[i] = int32(i*7%arch.V), int32(i*11%arch.V)
	}
	var ts []float64
	for i := range 8 {
		t0 := time.Now()
		if _, err := e.Step([]data.Batch{b}, 1e-4); err != nil {
			t.Fatal(err)
		}
		if i >= 2 { // after warm-up
			ts = append(ts, time.Since(t0).Seconds())
		}
	}
	slices.Sort(ts)
	meas := ts[len(ts)/2]
	t.Logf("predicted %.3g s, measured %.3g s (median of %d), calibration %.1f s", r.Step, meas, len(ts), c.Seconds)
	if !raceEnabled && (r.Step > 3*meas || meas > 3*r.Step) {
		t.Errorf("predicted %.3g s, measured %.3g s: not within 3x", r.Step, meas)
	}
}

// TestMeasuredOpsFromEvents: ops timed by events on a real step of the CPU
// backend (trace.WrapTimed) answer the Measured hook for every device op
// of the traced graph of the same configuration, and price the step at
// what its ops took. cuda_test.go runs the same on the CUDA backend.
func TestMeasuredOpsFromEvents(t *testing.T) {
	checkMeasuredOps(t, backend.F32, func() (backend.Backend, error) { return cpu.New(cpu.Config{Threads: 2}), nil })
}

// checkMeasuredOps is TestMeasuredOpsFromEvents on the backends open makes,
// one per mode, with a model of dtype dt.
func checkMeasuredOps(t *testing.T, dt backend.DType, open func() (backend.Backend, error)) {
	t.Helper()
	for _, mode := range engine.Modes {
		if mode == engine.Galore {
			// The engine's weights here are zeros, so galore's
			// gradients are, and its timed step retries the refresh
			// that found nothing (galore.Device): ops the traced step,
			// which has no refresh, lacks.
			continue
		}
		cfg := engineConfig(mode)
		cfg.Pipelined, cfg.HostThreads = false, 2
		be, err := open()
		if err != nil {
			t.Fatal(err)
		}
		w := trace.WrapTimed(be)
		e, err := engine.New(w, tiny, 2, 8, 1, dt, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Init(); err != nil {
			t.Fatal(err)
		}
		b := data.Batch{B: 2, T: 8, Inputs: make([]int32, 16), Targets: make([]int32, 16), NumTargets: 16}
		for i := range b.Inputs {
			b.Inputs[i], b.Targets[i] = int32(i%tiny.V), int32((i+1)%tiny.V)
		}
		if _, err := e.Step([]data.Batch{b}, 1e-3); err != nil {
			t.Fatal(err)
		}
		w.Reset() // the timed step only
		if _, err := e.Step([]data.Batch{b}, 1e-3); err != nil {
			t.Fatal(err)
		}
		timed, err := w.Times()
		if err != nil {
			t.Fatal(err)
		}
		e.Free()
		w.Close()

		hook := MeasuredOps(timed)
		_, ops, err := Trace(tiny, 2, 8, 1, dt, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var pred, meas float64
		for _, o := range ops {
			if o.Link != trace.NoLink {
				if _, ok := hook(o); ok {
					t.Errorf("%s: a link copy answered by the measured hook", mode)
				}
				continue
			}
			s, ok := hook(o)
			if !ok || !(s > 0) {
				t.Errorf("%s: %s %v not measured", mode, o.Method, o.Shapes)
			}
			pred += s
		}
		for _, o := range timed {
			if o.Link == trace.NoLink {
				meas += o.Seconds
			}
		}
		// The means of the ops of each kind, one op each: their sum.
		if math.Abs(pred-meas) > 1e-9*meas {
			t.Errorf("%s: traced ops priced at %g s, the timed step's ops took %g s", mode, pred, meas)
		}
		t.Logf("%s on %s: the traced step's %d ops, link copies apart, priced from events at %.4g s", mode, be.Name(), len(ops), pred)
	}
}
