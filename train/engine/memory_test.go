package engine

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

func TestPlanMatchesArena(t *testing.T) {
	lspHost, lspNoFit, lspFrozen, zeroBF16 := testConfig(LSP), testConfig(LSP), testConfig(LSP), testConfig(Zero)
	lspHost.DenseParams = DenseHost
	lspHost.GradDType, zeroBF16.GradDType = backend.BF16, backend.BF16
	lspNoFit.LSP.NoFit = true
	lspFrozen.DenseParams = DenseFrozen
	loraHost, loraFrozen := testConfig(LoRA), testConfig(LoRA)
	loraHost.DenseParams, loraFrozen.DenseParams = DenseHost, DenseFrozen
	loraNF4, loraInt8 := testConfig(LoRA), testConfig(LoRA)
	loraNF4.LoRA.Base, loraInt8.LoRA.Base, loraInt8.DenseParams = backend.NF4, backend.Int8, DenseFrozen
	galoreFrozen := testConfig(Galore)
	galoreFrozen.DenseParams = DenseFrozen
	nativeAttn, zeroLayer, lspLayer := testConfig(Native), testConfig(Zero), testConfig(LSP)
	lspSVD, lspGauss := testConfig(LSP), testConfig(LSP)
	lspSVD.LSP.Projector = lsp.KindSVD
	lspGauss.LSP.Projector, lspGauss.LSP.NoFit = lsp.KindGaussian, true
	nativeAttn.Recompute, zeroLayer.Recompute, lspLayer.Recompute = model.RecomputeAttn, model.RecomputeLayer, model.RecomputeLayer
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"native", testConfig(Native)}, {"zero", testConfig(Zero)}, {"lsp-device", testConfig(LSP)},
		{"lsp-host-bf16-grads", lspHost}, {"lsp-nofit", lspNoFit}, {"lsp-frozen", lspFrozen},
		{"zero-bf16-grads", zeroBF16}, {"native-recompute-attn", nativeAttn}, {"zero-recompute-layer", zeroLayer},
		{"lsp-device-recompute-layer", lspLayer}, {"lsp-svd", lspSVD}, {"lsp-gauss", lspGauss},
		{"zero-ring", ringConfig(backend.F32)}, {"zero-ring-bf16-grads", ringConfig(backend.BF16)},
		{"lora-device", testConfig(LoRA)}, {"lora-host", loraHost}, {"lora-frozen", loraFrozen},
		{"lora-nf4", loraNF4}, {"lora-int8-frozen", loraInt8},
		{"galore", testConfig(Galore)}, {"galore-frozen", galoreFrozen},
	} {
		for _, dt := range []backend.DType{backend.F32, backend.BF16} {
			t.Run(tc.name+"/"+dt.String(), func(t *testing.T) {
				plan, err := MemoryOf(small, testB, testT, 2, dt, tc.cfg)
				if err != nil {
					t.Fatal(err)
				}
				tr := newTrainer(t, tc.cfg, dt, 2, cpu.Config{Threads: 2})
				tr.run(t, 2)
				hw := tr.be.MemStats().HighWater
				pred := plan.DeviceTotal()
				if pred < hw || float64(pred) > 1.1*float64(hw) {
					t.Errorf("predicted device peak %d, arena high-water mark %d (%s)", pred, hw, plan)
				}
				// A checkpoint write's reads of the state hold what the
				// plan's StateWrite says, give or take their closures:
				// everything they allocate, counted with the collector
				// off. The arrays are the file's tensors beside the
				// parameters.
				arrays, finish, err := tr.e.StateArrays()
				if err != nil {
					t.Fatal(err)
				}
				file := 4 * int64(small.NumParams())
				var ms runtime.MemStats
				defer debug.SetGCPercent(debug.SetGCPercent(-1))
				runtime.ReadMemStats(&ms)
				before := ms.TotalAlloc
				for _, a := range arrays {
					n := 0
					if err := a.Read(func(v []float32) error { n += len(v); return nil }); err != nil {
						t.Fatal(err)
					}
					if n != a.Len {
						t.Errorf("%s: read %d elements, its Len is %d", a.Name, n, a.Len)
					}
					file += 4 * int64(n)
				}
				runtime.ReadMemStats(&ms)
				if err := finish(); err != nil {
					t.Fatal(err)
				}
				if got := int64(ms.TotalAlloc - before); got < plan.StateWrite || got > plan.StateWrite+16<<10 {
					t.Errorf("reading the state allocated %d bytes, the plan's StateWrite is %d", got, plan.StateWrite)
				}
				if plan.CheckpointBytes != file {
					t.Errorf("planned checkpoint tensors %d bytes, the parameters and the state's arrays hold %d", plan.CheckpointBytes, file)
				}
			})
		}
	}
}

// TestRecomputeSavesMemory: each recompute setting lowers both the
// predicted device peak and the arena's high-water mark of a real run (the
// run without recompute is the control), by the activations the plan says
// it drops, in every mode.
func TestRecomputeSavesMemory(t *testing.T) {
	for _, mode := range []Mode{Native, Zero, LSP} {
		t.Run(string(mode), func(t *testing.T) {
			var pred, hw []int64
			for _, rc := range model.Recomputes {
				cfg := testConfig(mode)
				cfg.Recompute = rc
				plan, err := MemoryOf(small, testB, testT, 1, backend.F32, cfg)
				if err != nil {
					t.Fatal(err)
				}
				tr := newTrainer(t, cfg, backend.F32, 1, cpu.Config{Threads: 2})
				tr.run(t, 1)
				pred, hw = append(pred, plan.DeviceTotal()), append(hw, tr.be.MemStats().HighWater)
			}
			for i := 1; i < len(pred); i++ {
				if !(pred[i] < pred[i-1] && hw[i] < hw[i-1]) {
					t.Errorf("recompute %v: predicted %d, high-water %d bytes; %v: %d, %d (want both lower)",
						model.Recomputes[i], pred[i], hw[i], model.Recomputes[i-1], pred[i-1], hw[i-1])
				}
				if saved, measured := pred[i-1]-pred[i], hw[i-1]-hw[i]; saved != measured {
					t.Errorf("recompute %v saves %d bytes in the plan, %d in the arena", model.Recomputes[i], saved, measured)
				}
			}
		})
	}
}

func TestTrafficPerStep(t *testing.T) {
	lspHost, zeroBF16 := testConfig(LSP), testConfig(Zero)
	lspHost.DenseParams = DenseHost
	zeroBF16.GradDType = backend.BF16
	for _, tc := range []struct {
		name string
		cfg  Config
		dt   backend.DType
	}{
		{"native", testConfig(Native), backend.F32}, {"zero", testConfig(Zero), backend.BF16},
		{"zero-bf16-grads", zeroBF16, backend.BF16},
		{"lsp-device", testConfig(LSP), backend.BF16}, {"lsp-host", lspHost, backend.F32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const accum = 2
			plan, err := MemoryOf(small, testB, testT, accum, tc.dt, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			tr := newTrainer(t, tc.cfg, tc.dt, accum, cpu.Config{Threads: 2})
			tr.run(t, 1) // the projector check and its uploads happen before step 1
			before := tr.be.Traffic()
			if _, err := tr.e.Step(batches(5, accum), 1e-2); err != nil {
				t.Fatal(err)
			}
			after := tr.be.Traffic()
			d2h, h2d := after.D2H-before.D2H, after.H2D-before.H2D
			if d2h != plan.LinkD2H+plan.BatchD2H || h2d != plan.LinkH2D+plan.BatchH2D {
				t.Errorf("moved d2h %d h2d %d, plan says d2h %d+%d h2d %d+%d", d2h, h2d,
					plan.LinkD2H, plan.BatchD2H, plan.LinkH2D, plan.BatchH2D)
			}
			if tc.cfg.Mode != LSP {
				return
			}
			// lsp's traffic: 8 d^2 per LSP matrix plus the dense
			// parameters' traffic (plus the batch), and the 4-byte
			// non-finite flag the host Adam reads.
			want := int64(4)
			for _, row := range tr.e.lsp.Mats {
				for _, x := range row {
					want += int64(8 * x.D * x.D)
				}
			}
			if tr.e.off != nil {
				want += int64(tr.e.off.n) * int64(tc.cfg.GradDType.Size()+tc.dt.Size())
			}
			if got := d2h + h2d - plan.BatchD2H - plan.BatchH2D; got != want {
				t.Errorf("link bytes per step %d, want %d", got, want)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		flag string
	}{
		{func(c *Config) { c.LSP.R = 9 }, "--r"},
		{func(c *Config) { c.LSP.Alpha = 1 }, "--alpha"},
		{func(c *Config) { c.LSP.Alpha = 0 }, "--alpha"},
		{func(c *Config) { c.LSP.CheckEvery = 0 }, "--check-every"},
		{func(c *Config) { c.LSP.D = -1 }, "--d"}, // 0 is AutoD
		{func(c *Config) { c.LSP.CalibSamples = 0 }, "--calib-samples"},
		{func(c *Config) { c.DenseParams = "gpu" }, "--dense-params"},
		{func(c *Config) { c.Mode = "fast" }, "--mode"},
		{func(c *Config) { c.Mode = Zero; c.Hyper.Clip = "global-prev" }, "--clip-mode"},
	} {
		c := testConfig(LSP)
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: got %v", tc.flag, err)
		}
		if _, err := New(cpu.New(cpu.Config{}), small, testB, testT, 1, backend.F32, c); err == nil {
			t.Errorf("%s: New accepted the bad config", tc.flag)
		}
	}
	if err := testConfig(LSP).Validate(); err != nil {
		t.Errorf("the test config is rejected: %v", err)
	}
}

// TestNewOutOfMemory: a budget below the plan fails cleanly in every mode
// (an error, no panic), and everything allocated so far is released.
func TestNewOutOfMemory(t *testing.T) {
	for _, mode := range []Mode{Native, Zero, LSP} {
		cfg := testConfig(mode)
		plan, err := MemoryOf(small, testB, testT, 1, backend.F32, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, budget := range []int64{1, plan.DeviceTotal() / 2, plan.DeviceTotal() - 1} {
			be := cpu.New(cpu.Config{MemBudget: budget})
			if _, err := New(be, small, testB, testT, 1, backend.F32, cfg); err == nil {
				t.Errorf("%s: budget %d below the plan %d accepted", mode, budget, plan.DeviceTotal())
			}
			if in := be.MemStats().InUse; in != 0 {
				t.Errorf("%s: budget %d: %d bytes left allocated after the failure", mode, budget, in)
			}
			be.Close()
		}
		be := cpu.New(cpu.Config{MemBudget: plan.DeviceTotal()})
		e, err := New(be, small, testB, testT, 1, backend.F32, cfg)
		if err != nil {
			t.Errorf("%s: budget = plan refused: %v", mode, err)
		} else {
			e.Free()
		}
		be.Close()
	}
}

// TestHostPeak: the host peak is the held parts, the device's when it is
// host memory, and the largest transient only, which the summary marks.
func TestHostPeak(t *testing.T) {
	p := Memory{Device: []Part{{"weights", 1000}}, Host: []Part{{"moments", 10}, {"staging", 5}},
		Transient: []Part{{"load", 300}, {"checkpoint write", 700}, {"export", 200}}}
	if got := p.HostPeak(); got != 715 {
		t.Errorf("HostPeak = %d, want 715 (held 15 + the largest transient 700)", got)
	}
	p.DeviceOnHost = true
	if got := p.HostPeak(); got != 1715 {
		t.Errorf("HostPeak with the device on the host = %d, want 1715", got)
	}
	if got := p.HostTotal(); got != 15 {
		t.Errorf("HostTotal = %d, want the held parts' 15", got)
	}
	s := p.HostString()
	for _, want := range []string{"moments 0.00", "device memory (cpu backend)", "checkpoint write 0.00 (the peak's)", "load 0.00, "} {
		if !strings.Contains(s, want) {
			t.Errorf("HostString %q lacks %q", s, want)
		}
	}
	if strings.Count(s, "(the peak's)") != 1 {
		t.Errorf("HostString %q marks other than one transient", s)
	}
	if got := (Memory{}).HostPeak(); got != 0 {
		t.Errorf("empty plan's HostPeak = %d", got)
	}
}

// TestInFlightDropsWhatThePlanDrops: each way of holding less on the
// device (no gradients for frozen dense parameters; lsp's S, A and
// projectors for the blocks in flight only) lowers the arena's
// high-water mark of a real run by exactly the bytes the plan drops,
// against the configuration that holds them, in the same run.
func TestInFlightDropsWhatThePlanDrops(t *testing.T) {
	device, frozen := testConfig(LSP), testConfig(LSP)
	frozen.DenseParams = DenseFrozen
	whole, ring := testConfig(LSP), testConfig(LSP)
	whole.Recompute, ring.Recompute = model.RecomputeLayer, model.RecomputeLayer
	ring.GradResidency, ring.slots = ResidencyRing, 1
	for _, tc := range []struct {
		name       string
		held, less Config
		accum      int
	}{
		{"lsp frozen dense params", device, frozen, 1},
		{"lsp ring, one micro-batch", whole, ring, 1},
		{"lsp ring, S summed on the host", whole, ring, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pred, hw [2]int64
			for i, cfg := range []Config{tc.held, tc.less} {
				plan, err := MemoryOf(small, testB, testT, tc.accum, backend.F32, cfg)
				if err != nil {
					t.Fatal(err)
				}
				tr := newTrainer(t, cfg, backend.F32, tc.accum, cpu.Config{Threads: 2})
				tr.run(t, 2)
				pred[i], hw[i] = plan.DeviceTotal(), tr.be.MemStats().HighWater
			}
			if pred[1] >= pred[0] {
				t.Errorf("the plan drops nothing: %d bytes, %d holding", pred[1], pred[0])
			}
			if saved, measured := pred[0]-pred[1], hw[0]-hw[1]; saved != measured {
				t.Errorf("the plan drops %d bytes, the arena %d (high-water %d against %d)", saved, measured, hw[1], hw[0])
			}
		})
	}
}
