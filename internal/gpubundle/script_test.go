package gpubundle

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/plan"
)

// entry is one line of report.jsonl: the start line (Budget, Quick,
// Stages), a stage's result, or the end line.
type entry struct {
	Stage    string  `json:"stage"`
	Status   string  `json:"status"`
	Seconds  float64 `json:"seconds"`
	Allotted float64 `json:"allotted"`
	Note     string  `json:"note"`
	Log      string  `json:"log"`
	Excerpt  string  `json:"excerpt"`
	Budget   float64 `json:"budget"`
	Quick    bool    `json:"quick"`
	Stages   string  `json:"stages"`
}

// readReport parses dir's report.jsonl: the start line, the stages' in
// order, and whether the end line is there; and checks that report.md
// has a heading for each stage.
func readReport(dir string) (start entry, stages []entry, ended bool, err error) {
	f, err := os.Open(filepath.Join(dir, "report.jsonl"))
	if err != nil {
		return start, nil, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	for n := 1; sc.Scan(); n++ {
		var e entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return start, nil, false, fmt.Errorf("report.jsonl line %d: %w", n, err)
		}
		switch e.Stage {
		case "start":
			start = e
		case "end":
			ended = true
		default:
			stages = append(stages, e)
		}
	}
	if err := sc.Err(); err != nil {
		return start, nil, false, err
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		return start, nil, false, err
	}
	for _, s := range stages {
		if h := fmt.Sprintf("## %s: %s (", s.Stage, s.Status); !strings.Contains(string(md), h) {
			return start, nil, false, fmt.Errorf("report.md lacks %q", h)
		}
	}
	return start, stages, ended, nil
}

// runScript runs the bundle's run.sh with args and extra environment,
// into a new folder, and returns it.
func runScript(t *testing.T, env []string, args ...string) string {
	t.Helper()
	dir := os.Getenv("LSP_BUNDLE_DIR")
	if dir == "" {
		t.Skip("LSP_BUNDLE_DIR not set: make cudasim-bundle-test runs this on the bundle it builds")
	}
	out := filepath.Join(t.TempDir(), "report")
	cmd := exec.Command(filepath.Join(dir, "run.sh"), append(args, "--out", out)...)
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	t.Logf("run.sh %s:\n%s", strings.Join(args, " "), b)
	if err != nil {
		t.Fatalf("run.sh: %v", err)
	}
	return out
}

// TestBundleScript runs every stage in its reduced form (--quick) on the
// simulated runtime, one of them made to fail (LSP_BUNDLE_FAIL): the
// report parses, lists every stage in order, the others succeeded, the
// failed one carries its log's tail, and the calibration the block stage
// wrote is one plan --calibration reads.
func TestBundleScript(t *testing.T) {
	const failed = "bench-pcie"
	out := runScript(t, []string{"LSP_BUNDLE_FAIL=" + failed}, "--quick", "--budget", "20m")
	start, stages, ended, err := readReport(out)
	if err != nil {
		t.Fatal(err)
	}
	if !start.Quick || start.Budget != 1200 || !ended {
		t.Errorf("start line %+v (want quick, budget 1200), ended %v", start, ended)
	}
	want := strings.Fields(start.Stages)
	if len(want) != 10 || len(stages) != len(want) {
		t.Fatalf("%d stages reported, want %d (%v)", len(stages), len(want), want)
	}
	for i, s := range stages {
		if s.Stage != want[i] {
			t.Errorf("stage %d is %s, want %s", i, s.Stage, want[i])
		}
		if s.Stage == failed {
			if s.Status != "failed" || !strings.Contains(s.Note, "injected") || !strings.Contains(s.Excerpt, "LSP_BUNDLE_FAIL") ||
				!strings.Contains(s.Excerpt, "bench-pcie") {
				t.Errorf("the injected failure: %+v", s)
			}
			continue
		}
		if s.Status != "ok" {
			log, _ := os.ReadFile(filepath.Join(out, s.Log))
			t.Errorf("stage %s: %s (%s); its log:\n%s", s.Stage, s.Status, s.Note, log)
		}
		if s.Log == "" || s.Excerpt == "" {
			t.Errorf("stage %s: no log (%q) or no excerpt", s.Stage, s.Log)
		}
	}
	c, err := plan.ReadGPUCalibration(filepath.Join(out, "calibration.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Simulated || len(c.Eff) == 0 {
		t.Errorf("calibration %+v: want the simulated runtime's, with efficiencies", c)
	}
	block, err := os.ReadFile(filepath.Join(out, "logs", "block.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(block), "op efficiencies measured by --calibration") {
		t.Errorf("the block stage's plan did not read the calibration:\n%s", block)
	}
}

// TestBundleScriptBudget: a budget too small for any stage's share skips
// every stage, each with a line saying why, and still writes the report.
func TestBundleScriptBudget(t *testing.T) {
	out := runScript(t, nil, "--quick", "--budget", "3s")
	_, stages, ended, err := readReport(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 10 || !ended {
		t.Fatalf("%d stages, ended %v; want 10, true", len(stages), ended)
	}
	for _, s := range stages {
		if s.Status != "skipped" || !strings.Contains(s.Note, "share of the budget") {
			t.Errorf("stage %s: %s (%s), want skipped for the budget", s.Stage, s.Status, s.Note)
		}
	}
}

// TestBundleScriptTimeout: a stage that runs past its time is killed and
// reported as such with its log, and the next stage still runs. The
// binary is a stand-in whose gpu-info hangs (every other command
// succeeds at once), so the timing is the script's alone.
func TestBundleScriptTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for two stages to be killed (about 5 s)")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "lsp-train")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nif [ \"$*\" = gpu-info ]; then echo hanging; exec sleep 60; fi\necho \"fake $1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "report")
	// 36 s: the device stage's share is 1 s, the memory stage's 2 s, and
	// each may use only the few seconds the later shares' rounding
	// leaves, so both are killed long before gpu-info's 60 s.
	cmd := exec.Command("bash", "../../scripts/gpu-bundle.sh", "--budget", "36", "--out", out)
	cmd.Env = append(os.Environ(), "LSP_BUNDLE_BIN="+fake, "PATH=/usr/bin:/bin") // no nvidia-smi
	b, err := cmd.CombinedOutput()
	t.Logf("run.sh --budget 36:\n%s", b)
	if err != nil {
		t.Fatalf("run.sh: %v", err)
	}
	_, stages, ended, err := readReport(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 10 || !ended {
		t.Fatalf("%d stages, ended %v; want 10, true", len(stages), ended)
	}
	for _, s := range stages[:2] {
		if s.Status != "timeout" || !strings.Contains(s.Note, "ran past") || !strings.Contains(s.Excerpt, "hanging") {
			t.Errorf("stage %s: %+v, want killed with its log", s.Stage, s)
		}
	}
	if s := stages[2]; s.Stage != "kernels" || s.Status != "ok" || !strings.Contains(s.Excerpt, "fake gpu-test") {
		t.Errorf("the stage after: %+v, want kernels ok", s)
	}
}
