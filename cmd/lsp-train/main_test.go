// Tests of the command: a short training run end to end, the config file,
// flag errors, byte sizes, help, and the sample subcommand.

package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
)

// runCmd runs the command with args and returns its exit code, stdout and
// stderr (which must be an *os.File, as for a terminal check).
func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	errf, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	var out bytes.Buffer
	code := run(args, &out, errf)
	stderr, err := os.ReadFile(errf.Name())
	if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), string(stderr)
}

func writeJSON(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTrainAndSample trains two steps of the tiny preset and samples from
// the export.
func TestTrainAndSample(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := runCmd(t, "--steps", "2", "--batch", "4", "--data", "builtin:reverse:200",
		"--out", dir, "--eval-generate", "4", "--threads", "1")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"2 steps", "final train loss", "eval loss", "eval exact match",
		filepath.Join(dir, "hf"), filepath.Join(dir, checkpoint.FileName),
		filepath.Join(dir, "metrics.jsonl"), filepath.Join(dir, "loss.png"),
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout does not mention %q:\n%s", want, stdout)
		}
	}
	for _, f := range []string{"hf/config.json", "hf/model.safetensors", checkpoint.FileName, "metrics.jsonl", "loss.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("output missing: %v", err)
		}
	}

	// Sampling from the output directory finds hf/ and prints a line.
	code, stdout, stderr = runCmd(t, "sample", "-model", dir, "-prompt", "reverse abc=", "-max-new", "6", "-threads", "1")
	if code != 0 || !strings.HasSuffix(stdout, "\n") || strings.Count(stdout, "\n") < 1 {
		t.Errorf("sample -model %s: exit %d, stdout %q, stderr %s", dir, code, stdout, stderr)
	}
}

func TestConfigFile(t *testing.T) {
	cfg := train.Defaults()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.String("config", "", "")
	bindTrainFlags(fs, &cfg)
	if err := fs.Parse([]string{"--batch", "4", "--lr", "0.01"}); err != nil {
		t.Fatal(err)
	}
	path := writeJSON(t, `{"steps": 1000000, "batch": 3, "lr": 3e-4, "seq_len": 20, "seed": 1234567,
		"data": "builtin:sort", "resume": true, "device-mem": "512MiB", "clip_mode": "global-prev", "warmup": 0,
		"mode": "zero", "dtype": "bfloat16", "grad_dtype": "bf16", "schedule": "sequential", "dense_params": "host", "device": "cpu"}`)
	if err := applyConfigFile(fs, path); err != nil {
		t.Fatal(err)
	}
	want := train.Defaults()
	want.Steps, want.Batch, want.LR, want.SeqLen, want.Seed = 1000000, 4, 0.01, 20, 1234567
	want.Data, want.Resume, want.DeviceMem, want.ClipMode, want.Warmup = "builtin:sort", true, 512<<20, "global-prev", 0
	want.Mode, want.DType, want.GradDType, want.Schedule, want.DenseParams = "zero", backend.BF16, backend.BF16, "sequential", "host"
	if cfg != want {
		t.Errorf("config after file and flags:\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestCommandErrors(t *testing.T) {
	tiny := train.Defaults()
	tiny.Batch = 4
	mc, _, err := train.ResolveModel(tiny.Model)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := train.PlanMemory(mc, tiny)
	if err != nil {
		t.Fatal(err)
	}
	needs := "needs " + strconv.FormatInt(plan.DeviceTotal(), 10) + " bytes"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"device-mem too small", []string{"--device-mem", "1KiB", "--batch", "4"}, []string{"--device-mem", needs, "1024"}},
		{"device-mem from the config file", []string{"--config", writeJSON(t, `{"device_mem": "1KiB", "batch": 4}`)}, []string{"--device-mem", needs}},
		// The file's batch 0 would fail validation; the command line's 4
		// wins, and the bytes needed are those of batch 4.
		{"flags override the config file", []string{"--config", writeJSON(t, `{"batch": 0, "device_mem": "1KiB"}`), "--batch", "4"}, []string{"--device-mem", needs}},
		{"unknown config key", []string{"--config", writeJSON(t, `{"steps": 5, "learning_rate": 0.1}`)}, []string{"--config", "learning_rate"}},
		{"config key that is not a value", []string{"--config", writeJSON(t, `{"steps": [5]}`)}, []string{"--config", "steps"}},
		{"config value of the wrong type", []string{"--config", writeJSON(t, `{"steps": "many"}`)}, []string{"--config", "steps", "many"}},
		{"config file missing", []string{"--config", filepath.Join(t.TempDir(), "nope.json")}, []string{"--config", "nope.json"}},
		{"config file not JSON", []string{"--config", writeJSON(t, `{"steps": 5,`)}, []string{"--config", "config.json"}},
		{"config names config", []string{"--config", writeJSON(t, `{"config": "x.json"}`)}, []string{"--config", `"config"`}},
		{"bad byte size", []string{"--device-mem", "lots"}, []string{"device-mem", "lots"}},
		{"bad mode", []string{"--mode", "offload"}, []string{"-mode", "offload", "native, zero or lsp"}},
		{"bad dtype", []string{"--dtype", "fp16"}, []string{"-dtype", "fp16", "fp32 or bf16"}},
		{"bad clip mode", []string{"--clip-mode", "global"}, []string{"-clip-mode", "global"}},
		{"bad schedule", []string{"--schedule", "eager"}, []string{"-schedule", "eager"}},
		{"bad dense params", []string{"--dense-params", "cpu"}, []string{"-dense-params", "cpu"}},
		{"bad grad dtype in the config file", []string{"--config", writeJSON(t, `{"grad_dtype": "fp8"}`)}, []string{"--config", "grad_dtype", "fp8"}},
		{"unknown device", []string{"--device", "tpu"}, []string{"-device", "tpu", "cpu or cuda"}},
		{"cuda not in this build", []string{"--device", "cuda"}, []string{"--device", "not available in this build"}},
		{"bad batch", []string{"--batch", "0"}, []string{"--batch"}},
		{"unknown flag", []string{"--learning-rate", "1"}, []string{"learning-rate"}},
		{"positional argument", []string{"train"}, []string{`"train"`}},
		{"sample without a prompt", []string{"sample", "-model", t.TempDir()}, []string{"--prompt"}},
		{"sample of a missing model", []string{"sample", "-model", filepath.Join(t.TempDir(), "gone"), "-prompt", "x"}, []string{"--model", "gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := append(slices.Clone(tc.args), "--out", out)
			if tc.args[0] == "sample" {
				args = tc.args
			}
			code, stdout, stderr := runCmd(t, args...)
			if code != 1 {
				t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, stderr)
				}
			}
			if _, err := os.Stat(filepath.Join(out, checkpoint.FileName)); err == nil {
				t.Errorf("a failed command left a checkpoint")
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"sample", "-h"}} {
		code, stdout, stderr := runCmd(t, args...)
		if code != 0 {
			t.Errorf("%v: exit %d, want 0; stderr:\n%s", args, code, stderr)
		}
		if !strings.Contains(stderr, "-model") || stdout != "" {
			t.Errorf("%v: usage not on stderr (stdout %q, stderr %q)", args, stdout, stderr)
		}
		if strings.Contains(stderr, "help requested") {
			t.Errorf("%v: help reported as an error: %s", args, stderr)
		}
	}
	_, _, stderr := runCmd(t, "-h")
	for _, f := range []string{"-device-mem", "-config", "-clip-mode", "-resume", "-eval-generate"} {
		if !strings.Contains(stderr, f) {
			t.Errorf("usage does not list %s", f)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"1000", 1000},
		{"0", 0},
		{"8GiB", 8 << 30},
		{"512MiB", 512 << 20},
		{"1.5G", 3 << 29},
		{"4KiB", 4096},
		{"2GB", 2e9},
		{"1KB", 1000},
		{"3M", 3 << 20},
		{"1TiB", 1 << 40},
		{"100B", 100},
		{" 16 MiB ", 16 << 20},
		{"1e6", 1000000},
	} {
		got, err := parseBytes(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "GiB", "lots", "-1", "-2MiB", "8 XiB", "NaN", "Inf", "1e30", "8388608TiB"} {
		if got, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", bad, got)
		}
	}
	// The flag form, as the command sees it.
	var b byteSize
	if err := b.Set("2KiB"); err != nil || b.String() != "2048" {
		t.Errorf("byteSize.Set(2KiB): %v, String %q", err, b.String())
	}
}

// TestReportInterrupted: an interrupted run says where the checkpoint is
// and how to continue.
func TestReportInterrupted(t *testing.T) {
	var out bytes.Buffer
	report(&out, train.Defaults(), &train.Result{Interrupted: true, Steps: 7, Checkpoint: "out/checkpoint.safetensors"})
	for _, w := range []string{"step 7", "out/checkpoint.safetensors", "--resume"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("report does not mention %q:\n%s", w, out.String())
		}
	}
}

// TestOutReuse: without --out the command reuses out/ (the README's first
// command works twice); a named non-empty --out is refused the second
// time, naming the directory and both ways on (--resume, --overwrite).
func TestOutReuse(t *testing.T) {
	model, err := filepath.Abs(killModel)
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	args := []string{"--model", model, "--steps", "1", "--batch", "4", "--seq-len", "24", "--data", "builtin:reverse:200",
		"--eval-generate", "0", "--threads", "1"}
	for i := range 2 {
		if code, stdout, stderr := runCmd(t, args...); code != 0 {
			t.Fatalf("run %d without --out: exit %d\n%s\n%s", i+1, code, stdout, stderr)
		}
	}
	named := append(args, "--out", "mine")
	if code, _, stderr := runCmd(t, named...); code != 0 {
		t.Fatalf("first run into --out mine: exit %d\n%s", code, stderr)
	}
	code, _, stderr := runCmd(t, named...)
	for _, want := range []string{"--out", "mine", "--resume", "--overwrite"} {
		if code == 0 || !strings.Contains(stderr, want) {
			t.Errorf("second run into --out mine: exit %d, stderr does not name %q:\n%s", code, want, stderr)
		}
	}
	if code, _, stderr := runCmd(t, append(named, "--overwrite")...); code != 0 {
		t.Errorf("--overwrite: exit %d\n%s", code, stderr)
	}
}
