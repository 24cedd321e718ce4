package plan

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/galore"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

var tiny = gpt2.Config{V: 64, MaxT: 16, C: 32, L: 2, NH: 4, Eps: 1e-5}

func engineConfig(mode engine.Mode) engine.Config {
	c := engine.Config{Mode: mode, DenseParams: engine.DenseHost, Hyper: optim.DefaultHyper(), Seed: 1, Pipelined: true,
		LSP:    lsp.Config{D: 8, R: 2, Alpha: 0.5, CheckEvery: 5, CalibSamples: 4, ProjLR: 0.05, FitIters: 20},
		LoRA:   lora.Config{R: 4, Alpha: 8},
		Galore: galore.Config{Rank: 4, Every: 200, Scale: 0.25}}
	if mode == engine.Galore {
		c.DenseParams = engine.DenseDevice // its optimizer is on the device
	}
	return c
}

// gpuPreset is the machine of the --gpu preset gpu, with its usual link
// and host.
func gpuPreset(t *testing.T, gpu string) Machine {
	t.Helper()
	m, err := Preset(gpu, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// llama7B is LLaMA-7B's shape.
func llama7B(t *testing.T) llama.Config {
	t.Helper()
	c7, err := llama.Preset("llama-7b")
	if err != nil {
		t.Fatal(err)
	}
	return c7
}

// mustPlan is the plan of c on m.
func mustPlan(t *testing.T, c Config, m Machine) Report {
	t.Helper()
	r, err := Plan(c, m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTraceLinkBytes: the bytes the traced graph copies across the link
// are engine.MemoryOf's link and batch traffic, and every copy is on a
// queue of its direction but the batch's, which the forward uploads on the
// compute stream.
func TestTraceLinkBytes(t *testing.T) {
	type tc struct {
		name string
		cfg  engine.Config
	}
	var cases []tc
	for _, mode := range engine.Modes {
		cases = append(cases, tc{string(mode), engineConfig(mode)})
		// One rank of two (data parallelism): the gradients native's
		// AdamW reads, and the non-finite flag, go down and up again.
		if mode == engine.Galore {
			continue // one process only
		}
		dp := engineConfig(mode)
		dp.Comm = comm.Planned{Ranks: 2}
		cases = append(cases, tc{string(mode) + "/2 ranks", dp})
	}
	dense := engineConfig(engine.LSP)
	dense.Comm, dense.DenseParams = comm.Planned{Ranks: 3}, engine.DenseDevice
	cases = append(cases, tc{"lsp dense device/3 ranks", dense})
	for _, c := range cases {
		mode, cfg := c.name, c.cfg
		g, ops, err := Trace(tiny, 2, 8, 3, backend.BF16, cfg)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := engine.MemoryOf(tiny, 2, 8, 3, backend.BF16, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var down, up, batch int64
		for _, o := range ops {
			q := g.Nodes[o.Node].Queue
			switch {
			case o.Link == trace.D2H && q == engine.D2H:
				down += o.Bytes
			case o.Link == trace.H2D && q == engine.H2D:
				up += o.Bytes
			case o.Link == trace.H2D && q == engine.Compute:
				batch += o.Bytes
			case o.Link != trace.NoLink:
				t.Errorf("%s: %s on queue %v", mode, o.Method, q)
			}
		}
		if down != mem.LinkD2H || up != mem.LinkH2D || batch != mem.BatchH2D {
			t.Errorf("%s: traced d2h %d, h2d %d, batch %d; plan %d, %d, %d", mode, down, up, batch, mem.LinkD2H, mem.LinkH2D, mem.BatchH2D)
		}
	}
}

func TestOpTime(t *testing.T) {
	m, err := Preset("a100-80gb", "pcie4", "server")
	if err != nil {
		t.Fatal(err)
	}
	// A bf16 GEMM of 4096^3: 2*4096^3 FLOPs at 312 TFLOPS * 0.7, far
	// above its bytes' time.
	g := trace.Op{Family: trace.Gemm, DType: backend.BF16, FLOPs: 2 * math.Pow(4096, 3), Bytes: 3 * 4096 * 4096 * 2}
	want := 2*math.Pow(4096, 3)/(312e12*0.7) + 5e-6
	if got := m.OpTime(g); math.Abs(got-want) > 1e-12 {
		t.Errorf("gemm %g s, want %g", got, want)
	}
	// The same GEMM in fp32 runs on the 19.5 TFLOPS cores.
	g.DType = backend.F32
	if got, want := m.OpTime(g), 2*math.Pow(4096, 3)/(19.5e12*0.7)+5e-6; math.Abs(got-want) > 1e-12 {
		t.Errorf("fp32 gemm %g s, want %g", got, want)
	}
	// An elementwise op is bound by its bytes.
	e := trace.Op{Family: trace.Elementwise, DType: backend.BF16, FLOPs: 1e6, Bytes: 4e6}
	if got, want := m.OpTime(e), 4e6/(2039e9*0.8)+5e-6; math.Abs(got-want) > 1e-15 {
		t.Errorf("elementwise %g s, want %g", got, want)
	}
	// A measured time replaces the model's, where there is one.
	m.GPU.Measured = func(o trace.Op) (float64, bool) { return 0.25, o.Family == trace.Gemm }
	if got := m.OpTime(g); got != 0.25 {
		t.Errorf("measured gemm %g s, want 0.25", got)
	}
	if got, want := m.OpTime(e), 4e6/(2039e9*0.8)+5e-6; math.Abs(got-want) > 1e-15 {
		t.Errorf("unmeasured elementwise %g s, want %g", got, want)
	}
	m.GPU.Measured = nil
	// A copy: latency and the link's bandwidth, no launch.
	c := trace.Op{Family: trace.Copy, Bytes: 1 << 30, Link: trace.D2H}
	if got, want := m.OpTime(c), 10e-6+float64(1<<30)/(0.8*31.5e9); math.Abs(got-want) > 1e-12 {
		t.Errorf("copy %g s, want %g", got, want)
	}
	// Host Adam: bytes over min(workers x core bandwidth, 70% of memory
	// bandwidth) = min(32 x 12, 322.56) GB/s.
	if got, want := m.HostTime(engine.HostWork{Bytes: 1e9}), 20e-6+1e9/(0.7*460.8e9); math.Abs(got-want) > 1e-12 {
		t.Errorf("host adam %g s, want %g", got, want)
	}
	m.Host.Workers = 4
	if got, want := m.HostTime(engine.HostWork{Bytes: 1e9}), 20e-6+1e9/(4*12e9); math.Abs(got-want) > 1e-12 {
		t.Errorf("host adam on 4 workers %g s, want %g", got, want)
	}
}

func TestPresetsValid(t *testing.T) {
	for name := range GPUs {
		if err := gpuPreset(t, name).Validate(); err != nil {
			t.Error(err)
		}
	}
	for _, bad := range []struct{ gpu, link, host, flag, value string }{
		{"rtx9999", "", "", "--gpu", "rtx9999"},
		{"rtx4090", "pcie9", "", "--link", "pcie9"},
		{"rtx4090", "", "mainframe", "--host", "mainframe"},
	} {
		_, err := Preset(bad.gpu, bad.link, bad.host)
		if err == nil || !strings.Contains(err.Error(), bad.flag) || !strings.Contains(err.Error(), bad.value) {
			t.Errorf("%+v: error %v, want one naming %s and %q", bad, err, bad.flag, bad.value)
		}
	}
}

// TestPreset4060Ti: the 16 GB card comes with its x8 link, half of x16's
// bytes per second, and the desktop host.
func TestPreset4060Ti(t *testing.T) {
	m := gpuPreset(t, "rtx4060ti-16gb")
	if m.GPU.Memory != 16<<30 {
		t.Errorf("memory %d bytes, want 16 GiB", m.GPU.Memory)
	}
	x16 := Links["pcie4"]
	if m.Link.H2D != x16.H2D/2 || m.Link.D2H != x16.D2H/2 {
		t.Errorf("link %+v, want half of pcie4's %+v", m.Link, x16)
	}
	if m.Host != Hosts["desktop"] {
		t.Errorf("host %s, want the desktop", m.Host.Name)
	}
}

// TestPlanSchedules: on tiny, the sequential schedule is the sum of the
// tasks, the pipelined one no longer and, in zero mode, shorter.
func TestPlanSchedules(t *testing.T) {
	m := gpuPreset(t, "rtx4090")
	for _, mode := range engine.Modes {
		c := Config{Arch: tiny, B: 2, T: 8, Accum: 2, DType: backend.BF16, Engine: engineConfig(mode)}
		pip := mustPlan(t, c, m)
		c.Engine.Pipelined = false
		seq := mustPlan(t, c, m)
		sum := 0.0
		for _, task := range seq.Tasks {
			sum += task.Work
		}
		if math.Abs(seq.Step-sum) > 1e-12 || !near(seq.Overlap, 1) {
			t.Errorf("%s: sequential step %g, overlap %g; the tasks sum to %g", mode, seq.Step, seq.Overlap, sum)
		}
		if pip.Step > seq.Step*(1+1e-12) || (mode == engine.Zero && !(pip.Step < seq.Step)) {
			t.Errorf("%s: pipelined %g s, sequential %g s", mode, pip.Step, seq.Step)
		}
		if !pip.DeviceInBudget || !pip.HostInBudget || !(pip.TokensPerSec > 0) {
			t.Errorf("%s: tiny does not fit a 4090 or has no speed: %+v", mode, pip.Memory)
		}
		img, err := Timeline(pip.Prediction, 3, "tiny "+string(mode))
		if err != nil {
			t.Fatal(err)
		}
		p, err := png.Decode(bytes.NewReader(img))
		if err != nil {
			t.Fatal(err)
		}
		if p.Bounds().Dx() != 1400 {
			t.Errorf("timeline %v wide", p.Bounds())
		}
	}
}

// TestPlanLlama7B: planning llama-7b in every mode takes well under 30 s
// and 1 GB: nothing of the model's size is allocated.
func TestPlanLlama7B(t *testing.T) {
	c7, m := llama7B(t), gpuPreset(t, "rtx4090")
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	for _, mode := range engine.Modes {
		cfg := engineConfig(mode)
		cfg.LSP.D, cfg.LSP.R = 512, 16
		r := mustPlan(t, Config{Arch: c7, B: 4, T: 512, Accum: 2, DType: backend.BF16, Engine: cfg}, m)
		if !(r.Step > 0.1 && r.Step < 100) {
			t.Errorf("%s: step %g s", mode, r.Step)
		}
	}
	elapsed := time.Since(t0)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("llama-7b, every mode: %v, %d MiB allocated, heap %d MiB", elapsed, alloc>>20, after.HeapSys>>20)
	if elapsed > 30*time.Second {
		t.Errorf("planning took %v, want under 30 s", elapsed)
	}
	if alloc > 1<<30 || after.HeapSys > 1<<30 {
		t.Errorf("planning allocated %d MiB (heap %d MiB), want under 1 GiB", alloc>>20, after.HeapSys>>20)
	}
	if hwm, ok := peakRSS(); ok && hwm > 1<<30 {
		t.Errorf("peak resident memory %d MiB, want under 1 GiB", hwm>>20)
	}
}

// TestPlanRecompute: LLaMA-7B in lsp mode at 2 x 2048 (d 512, r 16:
// lsp-train's defaults; dense parameters frozen, as when fine-tuning a
// checkpoint) needs --recompute layer to fit a 24 GB GPU; each setting costs the
// step the forward GEMMs it recomputes, counted from the model's shapes
// (none is the control), and the predicted step grows with it.
func TestPlanRecompute(t *testing.T) {
	c7, m := llama7B(t), gpuPreset(t, "rtx4090")
	const B, T = 2, 2048
	BT, C, I, L := float64(B*T), float64(c7.Hidden), float64(c7.Intermediate), float64(c7.NumLayers)
	attnFLOPs := L * 2 * BT * C * C * 3 // q, k and v (LLaMA-7B has no grouped heads)
	recomputed := map[model.Recompute]float64{
		model.RecomputeNone:  0,
		model.RecomputeAttn:  attnFLOPs,
		model.RecomputeLayer: attnFLOPs + L*2*BT*(C*C+2*C*I), // o, gate and up
	}
	var steps []float64
	var gemm0 float64
	for _, rc := range model.Recomputes {
		cfg := engineConfig(engine.LSP)
		cfg.LSP.D, cfg.LSP.R, cfg.DenseParams, cfg.Recompute = 512, 16, engine.DenseFrozen, rc
		r := mustPlan(t, Config{Arch: c7, B: B, T: T, Accum: 1, DType: backend.BF16, Engine: cfg}, m)
		if want := rc == model.RecomputeLayer; r.DeviceInBudget != want {
			t.Errorf("recompute %v: %.2f GiB fits %v, want %v", rc, float64(r.Memory.DeviceTotal())/(1<<30), r.DeviceInBudget, want)
		}
		_, ops, err := Trace(c7, B, T, 1, backend.BF16, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var gemm float64
		for _, o := range ops {
			if o.Family == trace.Gemm {
				gemm += o.FLOPs
			}
		}
		if rc == model.RecomputeNone {
			gemm0 = gemm
		}
		if got, want := gemm-gemm0, recomputed[rc]; math.Abs(got-want) > 1e-9*want {
			t.Errorf("recompute %v: %.4g more GEMM FLOPs per step than none, want %.4g", rc, got, want)
		}
		steps = append(steps, r.Step)
		t.Logf("recompute %v: device %.2f GiB", rc, float64(r.Memory.DeviceTotal())/(1<<30))
	}
	t.Logf("predicted steps none/attn/layer: %.3f / %.3f / %.3f s", steps[0], steps[1], steps[2])
	if !(steps[0] < steps[1] && steps[1] < steps[2]) {
		t.Errorf("predicted steps %v: want each recompute setting slower than the one before", steps)
	}
}

// TestPlanDataParallel: two ranks of gpt2 over 10 Gb Ethernet. Each
// rank sends what its step all-reduces: native every parameter, lsp
// (dense parameters frozen) d^2 per block matrix, plus the non-finite
// flag; the network time follows, and lsp's step beats native's by it.
// One rank (the control) has no collective.
// gpt2Over10GbE is gpt2 and RTX 4090s joined by 10 Gb Ethernet, the
// data-parallel plans' setting.
func gpt2Over10GbE(t *testing.T) (model.Arch, Machine) {
	t.Helper()
	spec, err := catalog.Preset("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	m := gpuPreset(t, "rtx4090")
	if m.Net, err = NetPreset("10gbe"); err != nil {
		t.Fatal(err)
	}
	return spec, m
}

func TestPlanDataParallel(t *testing.T) {
	spec, m := gpt2Over10GbE(t)
	c7 := spec.(gpt2.Config)
	const D = 512
	want := map[engine.Mode]int64{
		engine.Native: 4 * (int64(spec.NumParams()) + 1),
		engine.LSP:    4 * (int64(c7.L)*4*D*D + 1), // every gpt2 matrix has both sides >= 768 > D
	}
	var steps, nets [2]map[engine.Mode]float64
	for i, ranks := range []int{1, 2} {
		m.Ranks = ranks
		steps[i], nets[i] = map[engine.Mode]float64{}, map[engine.Mode]float64{}
		for _, mode := range []engine.Mode{engine.Native, engine.LSP} {
			cfg := engineConfig(mode)
			cfg.LSP.D, cfg.DenseParams = D, engine.DenseFrozen
			r := mustPlan(t, Config{Arch: spec, B: 4, T: 512, Accum: 1, DType: backend.BF16, Engine: cfg}, m)
			w := want[mode]
			if ranks == 1 {
				w = 0
			}
			if r.NetBytes != w {
				t.Errorf("%d ranks, %s: %d bytes sent per step, want %d", ranks, mode, r.NetBytes, w)
			}
			if wantT := float64(w) / m.Net.Bandwidth; ranks > 1 && !(r.NetSeconds >= wantT && r.NetSeconds < 1.01*wantT+1e-3) {
				t.Errorf("%d ranks, %s: %g s on the network, want about %g", ranks, mode, r.NetSeconds, wantT)
			}
			if tok := float64(4 * 512 * ranks); math.Abs(r.TokensPerSec*r.Step-tok) > 1e-6*tok {
				t.Errorf("%d ranks, %s: %g tokens/s over a %g s step, want %g tokens per step", ranks, mode, r.TokensPerSec, r.Step, tok)
			}
			steps[i][mode], nets[i][mode] = r.Step, r.NetSeconds
		}
	}
	t.Logf("step 1 rank native %.3f s, lsp %.3f s; 2 ranks native %.3f s (network %.3f s), lsp %.3f s (network %.4f s)",
		steps[0][engine.Native], steps[0][engine.LSP], steps[1][engine.Native], nets[1][engine.Native], steps[1][engine.LSP], nets[1][engine.LSP])
	if !(steps[1][engine.Native] > steps[0][engine.Native] && steps[1][engine.LSP] < steps[1][engine.Native]) {
		t.Errorf("steps %v (1 rank) and %v (2 ranks): want native slower on two ranks, and lsp faster than native there", steps[0], steps[1])
	}
}

// peakRSS is the process's peak resident memory (Linux's VmHWM).
func peakRSS() (int64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// TestPaperModels: the paper's models (the official scripts' MODEL,
// deepseek-coder 1.3b and 6.7b base) have the published sizes: a public
// print of the 1.3b's parameters counts 1,347,258,368 with 786,432 LoRA
// parameters added; the 6.7b is LLaMA-7B's shape with a 32256 vocabulary.
func TestPaperModels(t *testing.T) {
	for _, c := range []struct {
		dir  string
		want int
	}{{"testdata/deepseek-coder-1.3b-base", 1347258368 - 786432}, {"testdata/deepseek-coder-6.7b-base", 6740512768}} {
		spec, _, err := catalog.Resolve(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := spec.NumParams(); got != c.want {
			t.Errorf("%s: %d parameters, want %d", c.dir, got, c.want)
		}
	}
}

// TestPlanSharedCores: a CPU-backend machine, where compute and host Adam
// share the cores, predicts a longer zero-mode step than the same machine
// with cores of their own: the host Adam of deep layers overlaps the
// backward of shallow ones, and both slow down.
func TestPlanSharedCores(t *testing.T) {
	m := Machine{
		GPU: GPU{Name: "cpu", Memory: 1 << 30, PeakF32: 50e9, PeakBF16: 50e9, MemBW: 10e9, Launch: 2e-6,
			SharesHost: true, ComputeThreads: 2},
		Link: Link{Name: "charged", H2D: 1e9, D2H: 1e9, Latency: 1e-6},
		Host: Host{Name: "two cores", Cores: 2, MemBW: 10e9, Memory: 1 << 30, Workers: 2, CoreBW: 5e9, AdamBWFraction: 0.7},
	}
	c := Config{Arch: tiny, B: 2, T: 8, Accum: 1, DType: backend.F32, Engine: engineConfig(engine.Zero)}
	shared := mustPlan(t, c, m)
	m.GPU.SharesHost = false
	apart := mustPlan(t, c, m)
	if !(shared.Step > apart.Step) {
		t.Errorf("shared cores %g s, own cores %g s: want the shared step longer (host Adam overlaps the backward)", shared.Step, apart.Step)
	}
}

// TestPlanDeviceCollectives: summing on the GPUs (NCCL) moves the same
// bytes between ranks as summing on the host, without native mode's
// gradients' round trip through pinned memory (fewer link bytes, a step
// no slower), and lsp's S copy still carries d^2 per matrix.
func TestPlanDeviceCollectives(t *testing.T) {
	spec, m := gpt2Over10GbE(t)
	m.Ranks = 2
	for _, mode := range []engine.Mode{engine.Native, engine.LSP} {
		var rs [2]Report
		for i, dev := range []bool{false, true} {
			cfg := engineConfig(mode)
			cfg.LSP.D, cfg.DenseParams = 512, engine.DenseFrozen
			rs[i] = mustPlan(t, Config{Arch: spec, B: 4, T: 512, Accum: 1, DType: backend.BF16, Engine: cfg, DeviceCollectives: dev}, m)
		}
		host, dev := rs[0], rs[1]
		if dev.NetBytes != host.NetBytes || dev.NetBytes == 0 {
			t.Errorf("%s: %d bytes between ranks per step summing on the device, %d on the host", mode, dev.NetBytes, host.NetBytes)
		}
		grads := 4 * int64(spec.NumParams())
		wantD2H := host.Memory.LinkD2H
		if mode == engine.Native {
			wantD2H -= grads
		}
		if dev.Memory.LinkD2H != wantD2H {
			t.Errorf("%s: %d bytes copied down per step summing on the device, want %d (on the host %d)", mode, dev.Memory.LinkD2H, wantD2H, host.Memory.LinkD2H)
		}
		if dev.Step > host.Step*(1+1e-9) {
			t.Errorf("%s: step %.4g s summing on the device, %.4g s on the host", mode, dev.Step, host.Step)
		}
		t.Logf("%s: step %.4g s summing on the host, %.4g s on the device; %d bytes copied down per step, %d", mode, host.Step, dev.Step, host.Memory.LinkD2H, dev.Memory.LinkD2H)
	}
}

// TestGPUName: --gpu takes a preset in the spellings people use (the
// maker's words, case, dashes and spaces aside; a unique beginning), and
// says which presets an ambiguous name could be; every preset resolves
// to a machine with its usual link and host.
func TestGPUName(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		several    []string
	}{
		{"4090", "rtx4090", nil}, {"RTX4090", "rtx4090", nil}, {"rtx-4090", "rtx4090", nil},
		{"NVIDIA GeForce RTX 4090", "rtx4090", nil}, {"4060", "rtx4060", nil}, {"4060 Ti", "rtx4060ti-16gb", nil},
		{"rtx4060ti-16gb", "rtx4060ti-16gb", nil}, {"3060", "rtx3060", nil}, {"A10", "a10", nil}, {"l4", "l4", nil},
		{"H200", "h200", nil}, {"a100", "", []string{"a100-40gb", "a100-80gb", "a1000-laptop"}},
		{"rtx5090", "", nil}, {"", "", nil},
	} {
		got, several := GPUName(tc.name)
		if got != tc.want || !slices.Equal(several, tc.several) {
			t.Errorf("GPUName(%q) = %q, %v; want %q, %v", tc.name, got, several, tc.want, tc.several)
		}
	}
	for name, g := range GPUs {
		m, err := Preset(name, "", "")
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if m.GPU.Name != g.Name || m.Link.H2D <= 0 || m.Host.Memory <= 0 || g.PeakBF16 < g.PeakF32 || g.MemBW <= 0 {
			t.Errorf("%s: machine %+v", name, m)
		}
	}
	if _, err := Preset("a100", "", ""); err == nil || !strings.Contains(err.Error(), "a100-40gb, a100-80gb") {
		t.Errorf("an ambiguous --gpu: %v", err)
	}
}

// TestPlanLoRAAdapters: the planned lora step costs the adapters' GEMMs:
// seven per adapted matrix (the forward's A x and B u; the backward's
// u again, du, dB, dA and dX), which the compute stream's busy time
// includes beside the frozen model's ops, on tiny and on llama-7b.
func TestPlanLoRAAdapters(t *testing.T) {
	m, c7 := gpuPreset(t, "rtx4090"), llama7B(t)
	for _, tc := range []struct {
		name  string
		arch  model.Arch
		sites int // adapted matrices with the family's default targets
		B, T  int
	}{
		{"tiny", tiny, tiny.L * 4, 2, 8},            // c_attn, attn.c_proj, c_fc, mlp.c_proj
		{"llama-7b", c7, c7.NumLayers * 7, 1, 1024}, // q, k, v, o, gate, up, down
	} {
		cfg := engineConfig(engine.LoRA)
		cfg.DenseParams, cfg.LoRA.R = engine.DenseFrozen, 8
		r := mustPlan(t, Config{Arch: tc.arch, B: tc.B, T: tc.T, Accum: 1, DType: backend.BF16, Engine: cfg}, m)
		if r.AdapterGemms != 7*tc.sites {
			t.Errorf("%s: %d adapter GEMMs, want 7 x %d sites", tc.name, r.AdapterGemms, tc.sites)
		}
		var compute float64
		for _, task := range r.Tasks {
			if task.Queue == engine.Compute {
				compute += task.Work
			}
		}
		if !(r.AdapterSeconds > 0) || !(compute >= r.AdapterSeconds) || !near(r.Busy[engine.Compute], compute) {
			t.Errorf("%s: adapters %g s, compute tasks %g s, compute busy %g s", tc.name, r.AdapterSeconds, compute, r.Busy[engine.Compute])
		}
		t.Logf("%s: %d adapter GEMMs, %.3g ms of a %.3g ms step (%.1f%%)", tc.name, r.AdapterGemms, r.AdapterSeconds*1e3, r.Step*1e3, 100*r.AdapterSeconds/r.Step)
	}
}

// SVDRefreshTime prices --projector svd's refresh only: nothing for
// sparse or gaussian projectors or other modes, more for a larger d, and
// the host's factorisations at its rate (so a slower host costs more).
func TestSVDRefreshTime(t *testing.T) {
	spec, err := catalog.Preset("llama-7b")
	if err != nil {
		t.Fatal(err)
	}
	m := gpuPreset(t, "rtx4090")
	at := func(mode engine.Mode, kind lsp.Kind, d int) float64 {
		ec := engineConfig(mode)
		ec.LSP.Projector, ec.LSP.D, ec.LSP.R = kind, d, 1
		s, err := SVDRefreshTime(Config{Arch: spec, B: 1, T: 1024, Accum: 1, DType: backend.BF16, Engine: ec}, m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := at(engine.LSP, lsp.KindSparse, 64) + at(engine.LSP, lsp.KindGaussian, 64) + at(engine.Galore, lsp.KindSVD, 64); s != 0 {
		t.Errorf("svd refresh time outside svd projectors: %v s", s)
	}
	s64, s256 := at(engine.LSP, lsp.KindSVD, 64), at(engine.LSP, lsp.KindSVD, 256)
	if !(s64 > 0) || !(s256 > 2*s64) {
		t.Errorf("svd refresh: %v s at d 64, %v s at d 256", s64, s256)
	}
	// Its device share alone is what a GPU with infinite rates would
	// leave out: halving the peak at most doubles the time.
	slow := m
	slow.GPU.PeakBF16 /= 2
	ec := engineConfig(engine.LSP)
	ec.LSP.Projector, ec.LSP.D, ec.LSP.R = lsp.KindSVD, 256, 1
	s, err := SVDRefreshTime(Config{Arch: spec, B: 1, T: 1024, Accum: 1, DType: backend.BF16, Engine: ec}, slow)
	if err != nil {
		t.Fatal(err)
	}
	if !(s > s256) || !(s < 2*s256) {
		t.Errorf("svd refresh at half the GPU's rate: %v s, at full %v s", s, s256)
	}
}
