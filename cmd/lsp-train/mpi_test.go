//go:build mpi

// The train command under mpirun (make mpi-test): the ranks are this test
// binary re-executed by mpirun with childEnv set, built with -tags mpi, so
// each rank joins the job through mpi.Init.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/internal/mpitest"
)

// dpArgs is a short lsp run of the tiny preset with fitted projectors
// (checked at steps 0 and 2: every rank fits on the same calibration
// rows), writing into out.
func dpArgs(out string, steps int, extra ...string) []string {
	return append([]string{"--model", "tiny", "--data", "builtin:sort:300", "--steps", strconv.Itoa(steps), "--batch", "4",
		"--seq-len", "24", "--warmup", "2", "--eval-generate", "2", "--threads", "1", "--mode", "lsp", "--d", "32",
		"--r", "4", "--dense-params", "frozen", "--fit", "--check-every", "2", "--calib-samples", "8", "--fit-iters", "20",
		"--out", out}, extra...)
}

// runRanks runs the command under mpirun -np np and returns its output
// and error.
func runRanks(t *testing.T, np int, args []string) (string, error) {
	t.Helper()
	out, err, _ := mpitest.Run(t, np, 2*time.Minute, []string{childEnv + "=1"}, args...)
	return out, err
}

// sameExport reports whether the runs in directories a and b exported
// the same weights, byte for byte.
func sameExport(t *testing.T, a, b string) bool {
	t.Helper()
	return bytes.Equal(readFile(t, a, "hf", "model.safetensors"), readFile(t, b, "hf", "model.safetensors"))
}

// trainRecord is a step's train record in metrics.jsonl.
type trainRecord struct {
	Step      int      `json:"step"`
	TrainLoss *float64 `json:"train_loss"`
	CommBytes *float64 `json:"comm_bytes"`
}

// trainRecords reads the train records of metrics.jsonl; each must have
// comm_bytes.
func trainRecords(t *testing.T, out string) []trainRecord {
	t.Helper()
	b := readFile(t, out, "metrics.jsonl")
	var recs []trainRecord
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec trainRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("metrics.jsonl: %v: %s", err, line)
		}
		if rec.TrainLoss != nil {
			if rec.CommBytes == nil || *rec.CommBytes <= 0 {
				t.Errorf("metrics.jsonl: step %d has no comm_bytes: %s", rec.Step, line)
				continue
			}
			recs = append(recs, rec)
		}
	}
	return recs
}

// stepRecords counts the train records of each step in metrics.jsonl.
func stepRecords(t *testing.T, out string) map[int]int {
	t.Helper()
	n := map[int]int{}
	for _, r := range trainRecords(t, out) {
		n[r.Step]++
	}
	return n
}

// stepCommBytes is each step's comm_bytes in metrics.jsonl.
func stepCommBytes(t *testing.T, out string) map[int]float64 {
	t.Helper()
	b := map[int]float64{}
	for _, r := range trainRecords(t, out) {
		b[r.Step] = *r.CommBytes
	}
	return b
}

// TestDataParallelCommand: lsp-train under mpirun -np 2, 2 steps, then
// resumed to 4 under mpirun -np 2, exports the same weights bit for bit
// as one process with --grad-accum 2 for 4 steps; rank 0 alone reports
// and writes one metrics record per step; a resume by one process is
// refused naming the world size.
func TestDataParallelCommand(t *testing.T) {
	dir := t.TempDir()
	one, dp := filepath.Join(dir, "one"), filepath.Join(dir, "dp")
	runChild(t, dpArgs(one, 4, "--grad-accum", "2"), "", 0)

	out, err := runRanks(t, 2, dpArgs(dp, 2))
	if err != nil {
		t.Fatalf("mpirun -np 2: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dp, "checkpoint.safetensors")); err != nil {
		t.Fatalf("no checkpoint after the first run: %v\n%s", err, out)
	}
	out, err = runRanks(t, 2, dpArgs(dp, 4, "--resume"))
	if err != nil {
		t.Fatalf("mpirun -np 2 --resume: %v\n%s", err, out)
	}
	if n := strings.Count(out, "Trained tiny"); n != 1 {
		t.Errorf("the report was printed %d times, want once (rank 0's):\n%s", n, out)
	}
	if !strings.Contains(out, "data parallel     2 ranks") {
		t.Errorf("the report does not say the run was data parallel:\n%s", out)
	}
	for step := 1; step <= 4; step++ {
		if n := stepRecords(t, dp)[step]; n != 1 {
			t.Errorf("metrics.jsonl: %d records of step %d, want 1 (rank 0's)", n, step)
		}
	}
	if !sameExport(t, one, dp) {
		t.Errorf("the weights of mpirun -np 2 (2 steps, resumed to 4) differ from one process with --grad-accum 2")
	}

	// One process cannot continue the two ranks' run.
	b, err := childCmd("", dpArgs(dp, 6, "--resume"), "").CombinedOutput()
	if err == nil || !strings.Contains(string(b), "2 ranks (mpirun -np 2)") {
		t.Errorf("one process resuming a checkpoint of 2 ranks: %v, want an error naming the 2 ranks:\n%s", err, b)
	}
}

// TestDataParallelKilledRank: rank 1 of a training run that checkpoints
// every 2 steps, killed with SIGKILL once a checkpoint is on disk, ends the
// job non-zero within 60 s, and rank 0 (which catches mpirun's SIGTERM)
// prints its own error naming rank 1 and the checkpoint it keeps. That
// checkpoint is intact and holds the step it is labelled with: resumed
// under mpirun -np 2 to the end, the run exports the same weights bit for
// bit as a run of the same steps never interrupted.
func TestDataParallelKilledRank(t *testing.T) {
	const steps = 40
	dir := t.TempDir()
	out, whole := filepath.Join(dir, "dp"), filepath.Join(dir, "whole")
	args := func(out string, extra ...string) []string {
		return dpArgs(out, steps, append([]string{"--checkpoint-every", "2"}, extra...)...)
	}
	cmd := mpitest.Command(context.Background(), t, 2, []string{childEnv + "=1", noteExitEnv + "=1"}, args(out)...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever is left, if the test fails
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	// Once rank 0 has written a checkpoint, find rank 1 among mpirun's
	// children.
	ckpt := filepath.Join(out, "checkpoint.safetensors")
	deadline := time.Now().Add(time.Minute)
	rank1 := 0
	for rank1 == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint written and no rank 1 found in a minute; output:\n%s", buf.String())
		}
		time.Sleep(20 * time.Millisecond)
		if _, err := os.Stat(ckpt); err != nil {
			continue
		}
		rank1 = childWithRank(cmd.Process.Pid, "1")
	}
	killed := time.Now()
	if err := syscall.Kill(rank1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err == nil {
			t.Errorf("mpirun exited 0 after rank 1 was killed")
		}
		t.Logf("mpirun ended %v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
	case <-time.After(60 * time.Second):
		t.Fatalf("mpirun still running 60 s after rank 1 was killed; output:\n%s", buf.String())
	}
	t.Logf("output:\n%s", buf.String())
	if strings.Contains(buf.String(), "Trained tiny") {
		t.Fatalf("the run finished before rank 1 was killed")
	}

	// Rank 0's own line, with the checkpoint it keeps.
	// "after step" and the collective are missing when the signal
	// handler reports (rank 0 was computing when mpirun's SIGTERM came).
	re := regexp.MustCompile(`(?m)^lsp-train: rank 0 of 2: rank 1 was lost( after step \d+)?( \(in [^)]*\))?; ` +
		`stopping without a checkpoint .*: the last checkpoint, of step (?P<kept>\d+) \(` + regexp.QuoteMeta(ckpt) + `\), is kept; ` +
		`continue from it with mpirun -np 2 and the same flags plus --resume: .*lost rank 1: its process ended \(pid ` +
		strconv.Itoa(rank1) + ` on \S+\)$`)
	m := re.FindStringSubmatch(buf.String())
	if m == nil {
		t.Fatalf("rank 0 printed no line matching %s", re)
	}
	// By itself, before mpirun's SIGKILL.
	if !strings.Contains(buf.String(), "test child: rank 0 exits with status 1\n") {
		t.Errorf("rank 0 did not exit by itself with status 1")
	}
	kept, _ := strconv.Atoi(m[re.SubexpIndex("kept")])
	step, err := checkpointStep(ckpt)
	if err != nil || step != kept || step < 2 || step >= steps {
		t.Fatalf("checkpoint on disk: step %d, %v; rank 0 said it keeps step %d (want one of 2..%d)", step, err, kept, steps-2)
	}

	// Intact (checksums verified) and labelled with its step: resumed to
	// the end it gives an uninterrupted run's weights.
	o, err := runRanks(t, 2, args(out, "--resume"))
	if err != nil {
		t.Fatalf("mpirun -np 2 --resume from the checkpoint of step %d: %v\n%s", step, err, o)
	}
	if want := fmt.Sprintf("resumed at step %d", step); !strings.Contains(o, want) {
		t.Errorf("the resumed run does not say %q:\n%s", want, o)
	}
	if o, err := runRanks(t, 2, args(whole)); err != nil {
		t.Fatalf("mpirun -np 2, %d steps: %v\n%s", steps, err, o)
	}
	if !sameExport(t, whole, out) {
		t.Errorf("the run resumed from the checkpoint of step %d kept after the lost rank exports other weights than %d steps uninterrupted", step, steps)
	}
}

// childWithRank is the process id of the child of parent that mpirun
// started as rank (its OMPI_COMM_WORLD_RANK), or 0.
func childWithRank(parent int, rank string) int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(parent) + "/task/*/children")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			env, _ := os.ReadFile("/proc/" + p + "/environ")
			for _, kv := range strings.Split(string(env), "\x00") {
				if kv == "OMPI_COMM_WORLD_RANK="+rank {
					pid, _ := strconv.Atoi(p)
					return pid
				}
			}
		}
	}
	return 0
}

// zeroArgs is a short zero-mode run of the tiny preset (fp32 gradients,
// which the ranks reduce-scatter), writing into out.
func zeroArgs(out string, steps int, extra ...string) []string {
	return append([]string{"--model", "tiny", "--data", "builtin:sort:300", "--steps", strconv.Itoa(steps), "--batch", "4",
		"--seq-len", "24", "--warmup", "2", "--eval-generate", "2", "--threads", "1", "--mode", "zero", "--grad-dtype", "fp32",
		"--out", out}, extra...)
}

// TestDataParallelZeroResume: zero mode under mpirun -np 2 shards the host
// optimizer among the ranks; a run of 2 steps resumed to 4 exports the
// same weights bit for bit as 4 steps in one go, so the checkpoint (rank
// 0's, gathered from both shards) held all of the master and moments and
// each rank took its shard back.
func TestDataParallelZeroResume(t *testing.T) {
	dir := t.TempDir()
	whole, split := filepath.Join(dir, "whole"), filepath.Join(dir, "split")
	if out, err := runRanks(t, 2, zeroArgs(whole, 4)); err != nil {
		t.Fatalf("mpirun -np 2, 4 steps: %v\n%s", err, out)
	}
	if out, err := runRanks(t, 2, zeroArgs(split, 2)); err != nil {
		t.Fatalf("mpirun -np 2, 2 steps: %v\n%s", err, out)
	}
	out, err := runRanks(t, 2, zeroArgs(split, 4, "--resume"))
	if err != nil {
		t.Fatalf("mpirun -np 2 --resume: %v\n%s", err, out)
	}
	if !strings.Contains(out, "data parallel     2 ranks") || !strings.Contains(out, "gradients reduce-scattered and weights all-gathered") {
		t.Errorf("the report does not say the run was data parallel with a sharded optimizer:\n%s", out)
	}
	if !sameExport(t, whole, split) {
		t.Errorf("zero mode, mpirun -np 2: 2 steps resumed to 4 export other weights than 4 steps in one go")
	}
	ca, cb := readFile(t, whole, "checkpoint.safetensors"), readFile(t, split, "checkpoint.safetensors")
	if len(ca) != len(cb) {
		t.Errorf("the checkpoints after 4 steps have %d and %d bytes", len(ca), len(cb))
	}
}
