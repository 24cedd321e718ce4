// Tests of the end of a run as a user meets it: the checkpoint and the
// export come before the final evaluation, an evaluation shows its
// progress, and SIGINT or SIGTERM during any evaluation stops it with the
// last finished step saved (the process sends itself the signal at an
// evaluation's batch: faults' LSP_SIGINT_AT, LSP_SIGTERM_AT).
//
// They skip under -short (child processes) and run in make test's
// race-free pass.

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
)

// evalStopArgs is a short run of the micro model whose evaluations have
// several batches of the loss (13 held-out rows, 4 a batch) and of
// generation.
func evalStopArgs(out string, steps, evalEvery int) []string {
	return []string{"--model", killModel, "--data", "builtin:reverse:300", "--steps", fmt.Sprint(steps), "--batch", "4",
		"--seq-len", "24", "--warmup", "1", "--eval-every", fmt.Sprint(evalEvery), "--eval-generate", "8",
		"--checkpoint-every", "0", "--threads", "1", "--out", out}
}

// runStoppedEnv runs the command with args, a signal armed by env (or
// none: ""), and returns its exit status, stdout and stderr.
func runStoppedEnv(t *testing.T, args []string, env string) (int, string, string) {
	t.Helper()
	cmd := childCmd("", args, env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// evalSteps are the steps of the eval records in dir's metrics.
func evalSteps(t *testing.T, dir string) []int {
	t.Helper()
	recs := readMetrics(t, dir)
	var steps []int
	for _, r := range recs {
		if r.EvalLoss != nil {
			steps = append(steps, r.Step)
			if r.Perplexity == nil {
				t.Errorf("the eval record of step %d has no perplexity", r.Step)
			}
		}
	}
	return steps
}

// TestSignalDuringFinalEval: a signal at the second batch of the final
// evaluation exits 130 (SIGINT) or 143 (SIGTERM) at once, with the
// checkpoint and the Hugging Face export of the last step written before
// the evaluation began, and no eval record; the same flags plus --resume
// then run only the final evaluation.
func TestSignalDuringFinalEval(t *testing.T) {
	skipChildProcesses(t)
	mc := killModelConfig(t)
	for _, tc := range []struct {
		env  string
		code int
	}{{faults.SigintEnv, 130}, {faults.SigtermEnv, 143}} {
		t.Run(fmt.Sprint(syscall.Signal(tc.code-128)), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := evalStopArgs(out, 3, 0)
			code, so, se := runStoppedEnv(t, args, tc.env+"=eval-batch:2")
			if code != tc.code {
				t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, so, se)
			}
			for _, want := range []string{"final eval: loss", "done=0", "eta="} {
				if !strings.Contains(se, want) {
					t.Errorf("stderr does not show the final evaluation's progress (%q):\n%s", want, se)
				}
			}
			if want := "Interrupted at step 3 of 3 (during the final evaluation)"; !strings.Contains(so, want) {
				t.Errorf("stdout does not say %q:\n%s", want, so)
			}
			ck, err := checkpoint.Load(filepath.Join(out, checkpoint.FileName), mc, nil)
			if err != nil || ck.Step != 3 {
				t.Fatalf("checkpoint: %v; want step 3\n%s", err, heldStep(ck))
			}
			if _, err := gpt2.ReadHFConfig(filepath.Join(out, "hf")); err != nil {
				t.Errorf("no export of the last step: %v", err)
			}
			if got := evalSteps(t, out); len(got) != 0 {
				t.Errorf("eval records at steps %v of a stopped evaluation, want none", got)
			}
			code, so, se = runStoppedEnv(t, append(args, "--resume"), "")
			if code != 0 {
				t.Fatalf("resume: exit status %d\n%s\n%s", code, so, se)
			}
			if got := evalSteps(t, out); len(got) != 1 || got[0] != 3 {
				t.Errorf("after the resume, eval records at steps %v, want [3]", got)
			}
			if !strings.Contains(so, "eval loss") || !strings.Contains(so, "perplexity") {
				t.Errorf("the resumed run's summary has no eval loss and perplexity:\n%s", so)
			}
		})
	}
}

// TestSignalDuringPeriodicEval: a signal during an evaluation between
// steps stops it there and exits 130 with the checkpoint of that step (the
// last finished), no export and no eval record of the step.
func TestSignalDuringPeriodicEval(t *testing.T) {
	skipChildProcesses(t)
	mc := killModelConfig(t)
	out := filepath.Join(t.TempDir(), "out")
	// Evaluations at steps 2 and 4, each of 4 batches of the loss (13
	// held-out rows) and 2 groups of 4 prompts: the 8th batch is the
	// second evaluation's second.
	code, so, se := runStoppedEnv(t, evalStopArgs(out, 6, 2), faults.SigintEnv+"=eval-batch:8")
	if code != 130 {
		t.Fatalf("exit status %d, want 130\nstdout:\n%s\nstderr:\n%s", code, so, se)
	}
	ck, err := checkpoint.Load(filepath.Join(out, checkpoint.FileName), mc, nil)
	if err != nil || ck.Step != 4 {
		t.Fatalf("checkpoint: %v; want step 4, the step the evaluation followed\n%s", err, heldStep(ck))
	}
	if _, err := os.Stat(filepath.Join(out, "hf")); err == nil {
		t.Errorf("an export of an interrupted run")
	}
	if got := evalSteps(t, out); len(got) != 1 || got[0] != 2 {
		t.Errorf("eval records at steps %v, want [2] (step 4's was stopped)", got)
	}
}

// TestEvalCaps: --eval-tokens caps the eval loss's rows (evenly spaced)
// and --eval-max-new leaves out the prompts whose response is longer,
// and the start-up log says so with the flags that lift the caps.
func TestEvalCaps(t *testing.T) {
	skipChildProcesses(t)
	out := filepath.Join(t.TempDir(), "out")
	args := append(evalStopArgs(out, 1, 0), "--eval-tokens", "48", "--eval-max-new", "4")
	code, so, se := runStoppedEnv(t, args, "")
	if code != 0 {
		t.Fatalf("exit status %d\n%s\n%s", code, so, se)
	}
	for _, want := range []string{"loss_rows=2 of=13", "--eval-tokens 0 reads them all", "longer than --eval-max-new 4 tokens"} {
		if !strings.Contains(se, want) {
			t.Errorf("the log does not say %q:\n%s", want, se)
		}
	}
}

// heldStep says which step a loaded checkpoint holds, if any.
func heldStep(ck *checkpoint.Checkpoint) string {
	if ck == nil {
		return "no checkpoint"
	}
	return fmt.Sprintf("the checkpoint holds step %d", ck.Step)
}
