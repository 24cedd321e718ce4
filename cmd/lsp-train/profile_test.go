package main

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/profile"
)

// profileSteps is the steps of each mode's profiled run in the tests: a
// projector check (--check-every 2) comes before the third.
const profileSteps = 3

// TestProfile profiles tiny in every mode on the CPU backend.
func TestProfile(t *testing.T) {
	checkProfile(t, "cpu", "--threads", "2")
}

// checkProfile runs the profile command on device, in every mode with a
// projector check in lsp, and checks its table and its metrics lines: one
// per step and mode, each parsing, its phases and its families each
// summing to its device time, every phase its mode has present, the
// check's ops in the step that ran it, and each stream busy no longer
// than the engine step (ops on one stream run one at a time).
func checkProfile(t *testing.T, device string, extra ...string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "prof")
	args := append([]string{"profile", "--device", device, "--model", "tiny", "--mode", "all", "--steps", "3",
		"--batch", "2", "--seq-len", "16", "--fit", "--check-every", "2", "--calib-samples", "4", "--fit-iters", "3",
		"--out", dir}, extra...)
	code, stdout, stderr := runCmd(t, args...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	t.Logf("\n%s", stdout)
	for _, want := range []string{"native", "zero", "lsp", "lora", "galore", "by phase", "by op family", "gemm", "of which lora adapters", "attention", "sparse", "dense",
		"host-adam (wall)", "streams: busy / idle", filepath.Join(dir, "metrics.jsonl")} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the table lacks %q", want)
		}
	}
	recs := readMetrics(t, dir)
	modes := []string{"native", "zero", "lsp", "lora", "galore"}
	if len(recs) != len(modes)*profileSteps {
		t.Fatalf("%d records, want %d (%d modes x %d steps)", len(recs), len(modes)*profileSteps, len(modes), profileSteps)
	}
	// The phases each mode must show at every step (device time by events,
	// host Adam by the clock).
	want := map[string][]profile.Phase{
		"native": {profile.Forward, profile.Backward, profile.Optimizer},
		"zero":   {profile.Forward, profile.Backward, profile.Comm, profile.HostAdam},
		"lsp":    {profile.Forward, profile.Backward, profile.Optimizer, profile.Comm, profile.HostAdam},
		"lora":   {profile.Forward, profile.Backward, profile.Optimizer}, // the adapters' device AdamW
		// The matrices' updates run in their blocks' backward; the
		// optimizer phase is the dense parameters' AdamW.
		"galore": {profile.Forward, profile.Backward, profile.Optimizer},
	}
	checks := 0
	for i, r := range recs {
		p := r.Profile
		if r.Event != metrics.ProfileEvent || p == nil {
			t.Fatalf("record %d: event %q, profile %v", i, r.Event, p)
		}
		if r.Step != i%profileSteps+1 || p.Mode != modes[i/profileSteps] {
			t.Errorf("record %d: step %d of %s, want step %d in mode order", i, r.Step, p.Mode, i%profileSteps+1)
		}
		near := func(what string, got float64) {
			if math.Abs(got-p.Device) > 1e-9*max(p.Device, 1e-9) {
				t.Errorf("%s step %d: %s sum to %g s, the ops to %g s", p.Mode, r.Step, what, got, p.Device)
			}
		}
		var phases, fams float64
		ops := 0
		for k, v := range p.Phases {
			if k != string(profile.HostAdam) {
				phases += v
			}
		}
		for k, v := range p.Families {
			fams += v
			ops += p.FamilyOps[k]
		}
		near("the device phases", phases)
		near("the families", fams)
		if ops != p.Ops || p.Ops == 0 || !(p.Device > 0) {
			t.Errorf("%s step %d: %d ops by family, %d in all, %g s", p.Mode, r.Step, ops, p.Ops, p.Device)
		}
		for _, ph := range want[p.Mode] {
			if !(p.Phases[string(ph)] > 0) {
				t.Errorf("%s step %d: phase %s has %g s", p.Mode, r.Step, ph, p.Phases[string(ph)])
			}
		}
		if p.Check > 0 {
			checks++
			if p.Mode != "lsp" || !(p.Phases[string(profile.Check)] > 0) || p.Check > p.Wall {
				t.Errorf("%s step %d: a check of %g s (wall %g s) with %g s of device ops", p.Mode, r.Step, p.Check, p.Wall,
					p.Phases[string(profile.Check)])
			}
		} else if p.Phases[string(profile.Check)] != 0 {
			t.Errorf("%s step %d: check ops without a check", p.Mode, r.Step)
		}
		if !(p.Engine > 0) || p.Engine > p.Wall {
			t.Errorf("%s step %d: engine step %g s of a %g s step", p.Mode, r.Step, p.Engine, p.Wall)
		}
		for s, b := range p.Busy {
			// The clocks differ (events against the wall), so a little slack.
			if b > 1.05*p.Engine+1e-4 {
				t.Errorf("%s step %d: stream %s busy %g s in an engine step of %g s", p.Mode, r.Step, s, b, p.Engine)
			}
			if math.Abs(p.Idle[s]-max(p.Engine-b, 0)) > 1e-12 {
				t.Errorf("%s step %d: stream %s idle %g s, busy %g s of %g s", p.Mode, r.Step, s, p.Idle[s], b, p.Engine)
			}
		}
		// Native, lora and galore (a preset's dense parameters on the
		// device) have no host node.
		if (p.Mode == "native" || p.Mode == "lora" || p.Mode == "galore") == (p.Busy[profile.HostStream] > 0) {
			t.Errorf("%s step %d: host busy %g s", p.Mode, r.Step, p.Busy[profile.HostStream])
		}
	}
	if checks != 1 {
		t.Errorf("%d steps ran a projector check, want 1 (lsp, --check-every 2)", checks)
	}
}
