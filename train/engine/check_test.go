package engine

import (
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// TestCheckFitsProjectors checks the fit, the carry-over and the re-warm
// after a large change, with the fit's own data deciding (the held-out
// rule has its own test).
func TestCheckFitsProjectors(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.FitIters = 100
	cfg.LSP.Accept, cfg.LSP.Rewarm = lsp.AcceptFit, lsp.RewarmChange
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
			x := tr.e.lsp.Mats[i/4][i%4]
			mult := tr.e.lsp.LR(x, tr.e.step+1, 1)
			if x.RewarmFrom != 6 || !(mult < 1) {
				t.Errorf("%s: re-warm reported, but it starts at step %d with lr multiplier %g", r.Matrix, x.RewarmFrom, mult)
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
		if !r.Resampled || r.Rejected || !(r.CaptureAfter > r.CaptureBefore*(1+lsp.AcceptMargin)) {
			t.Errorf("%s: fitted and held out on the same batch, not kept: %+v", r.Matrix, r)
		}
	}
	tr.run(t, 5)
	type kept struct {
		P, Q *lsp.Projector
		M, V []float32
	}
	var before []kept
	for _, row := range tr.e.lsp.Mats {
		for _, x := range row {
			before = append(before, kept{x.In.P.Clone(), x.Q.Clone(), slices.Clone(x.Adam.M), slices.Clone(x.Adam.V)})
		}
	}
	// Fresh random candidates (--refit random) capture less of the
	// held-out gradient than the fitted projectors in use: they are
	// rejected, and a rejected matrix keeps everything.
	tr.e.lsp.Config.Refit = lsp.RefitRandom
	reps, err = tr.e.Check(batches(78, 2))
	if err != nil {
		t.Fatal(err)
	}
	rejected := 0
	for i, r := range reps {
		x := tr.e.lsp.Mats[i/4][i%4]
		if !r.Rejected {
			continue
		}
		rejected++
		if r.Resampled || r.Change != 0 || r.Rewarm || r.CaptureAfter != r.CaptureBefore || r.RatioAfter != r.RatioBefore {
			t.Errorf("%s: rejected but reported as changed: %+v", r.Matrix, r)
		}
		if !x.In.P.Equal(before[i].P) || !x.Q.Equal(before[i].Q) || !slices.Equal(x.Adam.M, before[i].M) || !slices.Equal(x.Adam.V, before[i].V) {
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
		if x := tr.e.lsp.Mats[i/4][i%4]; r.Matrix != x.Name || !r.Resampled {
			t.Errorf("report %d: %+v, want %s refitted", i, r, x.Name)
		}
	}
	m0, m1 := tr.e.lsp.Mats[0], tr.e.lsp.Mats[1]
	for k := range m0 {
		if !m0[k].In.P.Equal(m1[k].In.P) || !m0[k].Q.Equal(m1[k].Q) {
			t.Errorf("matrix %d: layers 0 and 1 hold different projectors", k)
		}
		if m0[k].Q == m1[k].Q || m0[k].In.P == m1[k].In.P {
			t.Errorf("matrix %d: layers 0 and 1 share one projector object", k)
		}
	}
	tr.run(t, 3) // trains on the shared projectors
}

// TestCheckRewarmMeasured: with --rewarm measured, a check re-warms the
// refitted matrices whose carried second moment is far below what the new
// subspace measures, and only those: the same run with every moment zeroed
// before the check re-warms every refitted matrix from the next step, and
// with every moment huge re-warms none (the rule itself is tested in
// train/lsp; this is the engine's check reaching it).
func TestCheckRewarmMeasured(t *testing.T) {
	cfg := testConfig(LSP)
	cfg.LSP.FitIters = 100
	cfg.LSP.Accept, cfg.LSP.Rewarm = lsp.AcceptFit, lsp.RewarmMeasured
	for _, tc := range []struct {
		v      float32
		rewarm bool
	}{{0, true}, {1e6, false}} {
		tr := newTrainer(t, cfg, backend.F32, 1, cpu.Config{Threads: 2})
		tr.run(t, 5)
		for _, row := range tr.e.lsp.Mats {
			for _, x := range row {
				for e := range x.Adam.V {
					x.Adam.V[e] = tc.v
				}
			}
		}
		reps, err := tr.e.Check(batches(78, tr.e.CalibBatches()))
		if err != nil {
			t.Fatal(err)
		}
		resampled := 0
		for i, r := range reps {
			if !r.Resampled {
				continue
			}
			resampled++
			x := tr.e.lsp.Mats[i/4][i%4]
			if r.Rewarm != tc.rewarm || (x.RewarmFrom == 6) != tc.rewarm {
				t.Errorf("V = %g: %s re-warm %v from step %d, want %v", tc.v, r.Matrix, r.Rewarm, x.RewarmFrom, tc.rewarm)
			}
		}
		if resampled == 0 {
			t.Errorf("V = %g: no matrix refitted: %+v", tc.v, reps)
		}
	}
}

// TestCheckRefused: a projector check outside lsp mode, or in lsp mode
// without --fit, is never due and is refused with an error saying so.
func TestCheckRefused(t *testing.T) {
	noFit := testConfig(LSP)
	noFit.LSP.NoFit = true
	for _, cfg := range []Config{testConfig(Native), testConfig(Zero), noFit} {
		tr := newTrainer(t, cfg, backend.F32, 1, cpu.Config{Threads: 2})
		if tr.e.CheckDue() {
			t.Errorf("%s (no fit %v): a check is due", cfg.Mode, cfg.LSP.NoFit)
		}
		if _, err := tr.e.Check(batches(77, 2)); err == nil || !strings.Contains(err.Error(), "no projector check") {
			t.Errorf("%s (no fit %v): Check gave %v, want an error saying there is no projector check", cfg.Mode, cfg.LSP.NoFit, err)
		}
	}
}
