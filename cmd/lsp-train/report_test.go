// Tests of what a run reports as the built command prints it: the
// learning rate in the progress lines, and the measured peak memory
// beside the plan in the summary.

package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// reportRun runs four steps of the tiny preset as a child process (its
// stderr a pipe, so the progress display writes log lines) and returns
// its stdout and stderr.
func reportRun(t *testing.T, extra ...string) (string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the command as a child process")
	}
	args := append([]string{"--steps", "4", "--warmup", "2", "--batch", "4", "--data", "builtin:reverse:200",
		"--eval-every", "0", "--threads", "1", "--out", filepath.Join(t.TempDir(), "out")}, extra...)
	var stdout, stderr bytes.Buffer
	cmd := startChild(t, "", args, &stdout, &stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %v\nstdout:\n%s\nstderr:\n%s", args, err, stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String()
}

// TestProgressShowsLR: every progress line holds the step's learning
// rate, which moves with the warmup.
func TestProgressShowsLR(t *testing.T) {
	_, stderr := reportRun(t)
	lrs := map[string]bool{}
	lines := 0
	for _, line := range strings.Split(stderr, "\n") {
		if !strings.Contains(line, "msg=train ") {
			continue
		}
		lines++
		m := regexp.MustCompile(` lr=([0-9.e+-]+) `).FindStringSubmatch(line)
		if m == nil {
			t.Errorf("a progress line has no lr=: %s", line)
			continue
		}
		lrs[m[1]] = true
	}
	if lines == 0 {
		t.Fatalf("no progress lines in stderr:\n%s", stderr)
	}
	if len(lrs) < 2 {
		t.Errorf("the progress lines show one learning rate, %v, through warmup and decay:\n%s", lrs, stderr)
	}
}

// TestSummaryMemory: the summary shows the measured peak device memory
// beside the plan and the budget, within the budget, and the process's
// resident peak beside the host plan.
func TestSummaryMemory(t *testing.T) {
	stdout, _ := reportRun(t, "--device-mem", "64MiB")
	dev := regexp.MustCompile(`\n  device memory +peak ([0-9.]+) MiB measured \(allocated by the backend\), ([0-9.]+) MiB planned, budget ([0-9.]+) MiB\n`).
		FindStringSubmatch(stdout)
	host := regexp.MustCompile(`\n  host memory +peak ([0-9.]+) MiB resident \(the process's VmHWM[^)]*\), ([0-9.]+) MiB planned`).
		FindStringSubmatch(stdout)
	if dev == nil || host == nil {
		t.Fatalf("the summary has no device or host memory line:\n%s", stdout)
	}
	peak, planned, budget := mibOf(t, dev[1]), mibOf(t, dev[2]), mibOf(t, dev[3])
	if peak <= 0 || peak > budget || budget != 64 || planned <= 0 {
		t.Errorf("device memory: peak %v MiB, planned %v, budget %v (want 0 < peak <= budget = 64):\n%s", peak, planned, budget, stdout)
	}
	if resident, hostPlanned := mibOf(t, host[1]), mibOf(t, host[2]); resident < peak || hostPlanned <= 0 {
		// The cpu backend's device memory is the process's.
		t.Errorf("host memory: resident peak %v MiB below the device's %v, or planned %v:\n%s", resident, peak, hostPlanned, stdout)
	}
}

func mibOf(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestTensorBoardEvents: a run writes <out>/tb/events.out.tfevents.*
// holding every step's train loss and learning rate of metrics.jsonl.
func TestTensorBoardEvents(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	reportRun(t, "--out", out)
	files, _ := filepath.Glob(filepath.Join(out, "tb", "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("events files %v, want one", files)
	}
	evs, err := metrics.ReadTB(files[0])
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[int64]float32{}
	for _, ev := range evs {
		for _, s := range ev.Scalars {
			if got[s.Tag] == nil {
				got[s.Tag] = map[int64]float32{}
			}
			got[s.Tag][ev.Step] = s.Value
		}
	}
	recs := readMetrics(t, out)
	steps := 0
	for _, r := range recs {
		if r.TrainLoss == nil {
			continue
		}
		steps++
		s := int64(r.Step)
		if got["train/loss"][s] != float32(*r.TrainLoss) || got["train/learning_rate"][s] != float32(*r.LR) {
			t.Errorf("step %d: events hold loss %v, lr %v; metrics.jsonl %v, %v", s, got["train/loss"][s], got["train/learning_rate"][s], *r.TrainLoss, *r.LR)
		}
	}
	if steps != 4 || len(got["eval/loss"]) != 1 {
		t.Errorf("%d train steps in metrics.jsonl, eval losses in the events %v", steps, got["eval/loss"])
	}
}
