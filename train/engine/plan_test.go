package engine

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

func TestPlanMatchesArena(t *testing.T) {
	lspHost, lspNoFit, lspFrozen, zeroBF16 := testConfig(LSP), testConfig(LSP), testConfig(LSP), testConfig(Zero)
	lspHost.DenseParams = DenseHost
	lspHost.GradDType, zeroBF16.GradDType = backend.BF16, backend.BF16
	lspNoFit.LSP.NoFit = true
	lspFrozen.DenseParams = DenseFrozen
	nativeAttn, zeroLayer, lspLayer := testConfig(Native), testConfig(Zero), testConfig(LSP)
	nativeAttn.Recompute, zeroLayer.Recompute, lspLayer.Recompute = model.RecomputeAttn, model.RecomputeLayer, model.RecomputeLayer
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"native", testConfig(Native)}, {"zero", testConfig(Zero)}, {"lsp-device", testConfig(LSP)},
		{"lsp-host-bf16-grads", lspHost}, {"lsp-nofit", lspNoFit}, {"lsp-frozen", lspFrozen},
		{"zero-bf16-grads", zeroBF16}, {"native-recompute-attn", nativeAttn}, {"zero-recompute-layer", zeroLayer},
		{"lsp-device-recompute-layer", lspLayer},
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
				// The checkpoint write's transient is the parameters and
				// the arrays SaveStateView allocates (downloads and
				// conversions, new at every call; the views are the
				// same arrays each time), to the byte; and the views
				// hold what SaveState's copies do.
				state, err := tr.e.SaveState()
				if err != nil {
					t.Fatal(err)
				}
				view1, err := tr.e.SaveStateView()
				if err != nil {
					t.Fatal(err)
				}
				view2, err := tr.e.SaveStateView()
				if err != nil {
					t.Fatal(err)
				}
				saved, file := 4*int64(small.NumParams()), 4*int64(small.NumParams())
				for _, v := range state {
					file += 4 * int64(len(v))
				}
				if plan.CheckpointBytes != file {
					t.Errorf("planned checkpoint tensors %d bytes, the parameters and SaveState hold %d", plan.CheckpointBytes, file)
				}
				for name, v := range view1 {
					if !slices.Equal(v, state[name]) || len(view1) != len(state) {
						t.Errorf("SaveStateView's %s differs from SaveState's", name)
					}
					if len(v) > 0 && &v[0] != &view2[name][0] {
						saved += 4 * int64(len(v))
					}
				}
				var ckpt int64 = -1
				for _, x := range plan.Transient {
					if x.Name == "checkpoint write" {
						ckpt = x.Bytes
					}
				}
				if ckpt != saved {
					t.Errorf("planned checkpoint write %d bytes, the parameters and SaveStateView's new arrays hold %d", ckpt, saved)
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
			// The statement: 8 d^2 per LSP matrix plus the dense
			// parameters' traffic (plus the batch), and the 4-byte
			// non-finite flag the host Adam reads.
			want := int64(4)
			for _, row := range tr.e.lsp.mats {
				for _, x := range row {
					want += int64(8 * x.d * x.d)
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
		{func(c *Config) { c.LSP.D = 0 }, "--d"},
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

// TestCheckFitsProjectors checks the fit, the carry-over and the re-warm
// after a large change, with the fit's own data deciding (the held-out
// rule has its own test).
func TestCheckFitsProjectors(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.FitIters = 100
	cfg.LSP.Accept, cfg.LSP.Rewarm = AcceptFit, RewarmChange
	tr := newTrainer(t, cfg, backend.F32, 1, cpu.Config{Threads: 2})
	if !tr.e.CheckDue() {
		t.Fatal("no check before step 1")
	}
	reps, err := tr.e.Check(batches(77, tr.e.CalibBatches()))
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != small.L*4 {
		t.Fatalf("%d reports for %d matrices", len(reps), small.L*4)
	}
	for _, r := range reps {
		// Random projectors start far above alpha, so every matrix is refitted.
		if r.RatioBefore <= cfg.LSP.Alpha || !r.Resampled || !(r.RatioAfter < r.RatioBefore) || r.Iters == 0 {
			t.Errorf("%s: %+v", r.Matrix, r)
		}
		if r.Rewarm {
			t.Errorf("%s: re-warm before any step (the moments are zero)", r.Matrix)
		}
	}
	tr.run(t, 5)
	if tr.e.CheckDue() != true {
		t.Error("no check after --check-every steps")
	}
	// After 5 steps the moments are non-zero: a refit that changes the
	// subspace carries them, and a large change re-warms. Projectors fitted
	// to one calibration batch miss alpha on another, so matrices are
	// refitted again, and their new subspaces are far from the old ones.
	reps, err = tr.e.Check(batches(78, tr.e.CalibBatches()))
	if err != nil {
		t.Fatal(err)
	}
	resampled, rewarmed := 0, 0
	for i, r := range reps {
		if r.Resampled {
			resampled++
			if r.Change == 0 {
				t.Errorf("%s: resampled without a subspace change: %+v", r.Matrix, r)
			}
		} else if r.Change != 0 || r.Rewarm {
			t.Errorf("%s: kept projectors but carried: %+v", r.Matrix, r)
		}
		if r.Rewarm {
			rewarmed++
			// The next step (6) runs at a lowered learning rate.
			x := tr.e.lsp.mats[i/4][i%4]
			tr.e.step++
			mult := tr.e.lsp.lr(x, 1)
			tr.e.step--
			if x.rewarmFrom != 6 || !(mult < 1) {
				t.Errorf("%s: re-warm reported, but it starts at step %d with lr multiplier %g", r.Matrix, x.rewarmFrom, mult)
			}
		}
	}
	if resampled == 0 || rewarmed == 0 {
		t.Errorf("the second check resampled %d and re-warmed %d of %d matrices, want some of each: %+v", resampled, rewarmed, len(reps), reps)
	}
}

// TestCheckHeldOut checks that held-out micro-batches decide: a refit is
// kept when it captures more of them (here they are the fitting batch
// itself), and otherwise the projectors and the moments stay as they were.
func TestCheckHeldOut(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.FitIters = 100
	tr := newTrainer(t, cfg, backend.F32, 1, cpu.Config{Threads: 2})
	if n := tr.e.CalibBatches(); n != 2 {
		t.Fatalf("CalibBatches %d with --calib-samples %d and batch %d, want 2 (one fits, one decides)", n, cfg.LSP.CalibSamples, testB)
	}
	b := batches(77, 1)[0]
	reps, err := tr.e.Check([]data.Batch{b, b})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		if !r.Resampled || r.Rejected || !(r.CaptureAfter > r.CaptureBefore*(1+acceptMargin)) {
			t.Errorf("%s: fitted and held out on the same batch, not kept: %+v", r.Matrix, r)
		}
	}
	tr.run(t, 5)
	type kept struct {
		P, Q *lsp.Projector
		M, V []float32
	}
	var before []kept
	for _, row := range tr.e.lsp.mats {
		for _, x := range row {
			before = append(before, kept{x.in.P.Clone(), x.Q.Clone(), slices.Clone(x.state.M), slices.Clone(x.state.V)})
		}
	}
	// Fresh random candidates (--refit random) capture less of the
	// held-out gradient than the fitted projectors in use: they are
	// rejected, and a rejected matrix keeps everything.
	tr.e.lsp.cfg.Refit = RefitRandom
	reps, err = tr.e.Check(batches(78, 2))
	if err != nil {
		t.Fatal(err)
	}
	rejected := 0
	for i, r := range reps {
		x := tr.e.lsp.mats[i/4][i%4]
		if !r.Rejected {
			continue
		}
		rejected++
		if r.Resampled || r.Change != 0 || r.Rewarm || r.CaptureAfter != r.CaptureBefore || r.RatioAfter != r.RatioBefore {
			t.Errorf("%s: rejected but reported as changed: %+v", r.Matrix, r)
		}
		if !x.in.P.Equal(before[i].P) || !x.Q.Equal(before[i].Q) || !slices.Equal(x.state.M, before[i].M) || !slices.Equal(x.state.V, before[i].V) {
			t.Errorf("%s: rejected, but its projectors or moments changed", r.Matrix)
		}
	}
	if rejected == 0 {
		t.Errorf("no refit rejected on held-out data: %+v", reps)
	}
	if _, err := tr.e.Check(batches(79, 1)); err == nil {
		t.Error("a check with one micro-batch was accepted with held-out acceptance")
	}
}

// TestRewarmMeasured checks the measured re-warm rule on one matrix: a
// carried second moment far below the new subspace's calls for it, one
// far above does not.
func TestRewarmMeasured(t *testing.T) {
	tr := newTrainer(t, testConfig(LSP), backend.F32, 1, cpu.Config{Threads: 2})
	tr.run(t, 3)
	x := tr.e.lsp.mats[0][1]
	rng := rand.New(rand.NewPCG(5, 5))
	G := make([]float32, x.m*x.n)
	for i := range G {
		G[i] = float32(rng.NormFloat64())
	}
	cs := calibSet{fit: [][][]float32{{G}}, fitW: []float64{1}}
	for _, tc := range []struct {
		v    float32
		want bool
	}{{0, true}, {1e6, false}} {
		for e := range x.state.V {
			x.state.V[e] = tc.v
		}
		got, err := tr.e.lsp.underestimated(x, cs, 0)
		if err != nil || got != tc.want {
			t.Errorf("V = %g: underestimated %v (%v), want %v", tc.v, got, err, tc.want)
		}
	}
}

func TestNoFitNeverChecks(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.NoFit = true
	tr := newTrainer(t, cfg, backend.F32, 1, cpu.Config{Threads: 2})
	if tr.e.CheckDue() {
		t.Fatal("check due without fitting")
	}
	losses := tr.run(t, 10)
	if !(losses[9] < losses[0]) {
		t.Errorf("random projectors did not lower the loss: %v", losses)
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

// TestGradSum: a group's gradient is the target-weighted mean of its
// micro-batches' (each the mean over its own targets), i.e. the mean over
// all their targets.
func TestGradSum(t *testing.T) {
	var s gradSum
	s.add(0, 2, []float32{1, 2}, 3)
	s.add(1, 2, []float32{5}, 3)
	s.add(0, 2, []float32{5, 6}, 1)
	s.add(1, 2, []float32{1}, 1)
	if got := s.mean(0); !slices.Equal(got, []float32{2, 3}) || s.w != 4 {
		t.Errorf("matrix 0: mean %v over weight %v, want [2 3] over 4", got, s.w)
	}
	if got := s.mean(1); !slices.Equal(got, []float32{4}) {
		t.Errorf("matrix 1: mean %v, want [4]", got)
	}
}

// TestCheckShareLayers: with --share-layers one fit serves every layer,
// which then holds equal copies of the kept projectors (separate ones,
// so a later refit of one layer's copy cannot alias another's).
func TestCheckShareLayers(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.FitIters, cfg.LSP.ShareLayers = 100, true
	tr := newTrainer(t, cfg, backend.F32, 1, cpu.Config{Threads: 2})
	b := batches(77, 1)[0]
	reps, err := tr.e.Check([]data.Batch{b, b})
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != small.L*4 {
		t.Fatalf("%d reports for %d matrices", len(reps), small.L*4)
	}
	for i, r := range reps {
		if x := tr.e.lsp.mats[i/4][i%4]; r.Matrix != x.name || !r.Resampled {
			t.Errorf("report %d: %+v, want %s refitted", i, r, x.name)
		}
	}
	m0, m1 := tr.e.lsp.mats[0], tr.e.lsp.mats[1]
	for k := range m0 {
		if !m0[k].in.P.Equal(m1[k].in.P) || !m0[k].Q.Equal(m1[k].Q) {
			t.Errorf("matrix %d: layers 0 and 1 hold different projectors", k)
		}
		if m0[k].Q == m1[k].Q || m0[k].in.P == m1[k].in.P {
			t.Errorf("matrix %d: layers 0 and 1 share one projector object", k)
		}
	}
	tr.run(t, 3) // trains on the shared projectors
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
