// Tests of the command: a short training run end to end, the config file,
// flag errors, byte sizes, help, and the sample subcommand.

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/metrics"
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

// writeJSON writes text as a config.json and returns its path.
func writeJSON(t *testing.T, text string) string {
	t.Helper()
	return tempFile(t, "config.json", []byte(text))
}

// tempFile writes data into a file named name in a fresh temporary
// directory and returns its path.
func tempFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// tempJSON writes v as JSON into a file named name in a fresh temporary
// directory (an input file of the command) and returns its path.
func tempJSON(t *testing.T, name string, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return tempFile(t, name, raw)
}

// readMetrics returns the records of the metrics.jsonl in dir, failing
// t at once when it does not parse.
func readMetrics(t *testing.T, dir string) []metrics.Record {
	t.Helper()
	recs, err := metrics.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// readFile returns the contents of the file at the joined path elements,
// failing t at once when it cannot be read.
func readFile(t *testing.T, elem ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(elem...))
	if err != nil {
		t.Fatal(err)
	}
	return b
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
		": 2 steps.", "final train loss", "eval loss", "eval exact match", "tokens/s", "setup", "evaluation",
		"checkpoints", "export and plot", "wall time",
		filepath.Join(dir, "hf"), filepath.Join(dir, checkpoint.FileName),
		filepath.Join(dir, "metrics.jsonl"), filepath.Join(dir, "loss.png"),
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout does not mention %q:\n%s", want, stdout)
		}
	}
	for _, f := range []string{"hf/config.json", "hf/model.safetensors", "hf/tokenizer.json", "hf/tokenizer_config.json",
		checkpoint.FileName, "metrics.jsonl", "loss.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("output missing: %v", err)
		}
	}

	// The exported config writes the float32 epsilon as Python does.
	if raw, err := os.ReadFile(filepath.Join(dir, "hf", "config.json")); err != nil || !strings.Contains(string(raw), `"layer_norm_epsilon": 1e-05,`) {
		t.Errorf("hf/config.json does not hold layer_norm_epsilon 1e-05 (%v):\n%s", err, raw)
	}
	// The progress lines hold losses with four decimals.
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "msg=train") && !regexp.MustCompile(` loss=\d+\.\d{4} `).MatchString(line) {
			t.Errorf("a progress line's loss is not written with four decimals: %s", line)
		}
	}

	// Sampling from the output directory finds hf/ and prints a line.
	code, stdout, stderr = runCmd(t, "sample", "-model", dir, "-prompt", "reverse abc=", "-max-new", "6", "-threads", "1")
	if code != 0 || !strings.HasSuffix(stdout, "\n") || strings.Count(stdout, "\n") < 1 {
		t.Errorf("sample -model %s: exit %d, stdout %q, stderr %s", dir, code, stdout, stderr)
	}
	if !regexp.MustCompile(`^12 prompt tokens, \d+ new in [0-9.]+s: [0-9.]+ tokens/s \(KV cache, cpu\)\n$`).MatchString(stderr) {
		t.Errorf("sample's stderr %q is not the speed line", stderr)
	}
	// The exported tokenizer is the one sampling reads; -tokenizer
	// overrides it with the same ids here, and a missing file is named.
	code, again, stderr := runCmd(t, "sample", "-model", dir, "-tokenizer", "byte", "-prompt", "reverse abc=", "-max-new", "6", "-threads", "1")
	if code != 0 || again != stdout {
		t.Errorf("sample -tokenizer byte: exit %d, stdout %q (want %q), stderr %s", code, again, stdout, stderr)
	}
	missing := filepath.Join(t.TempDir(), "tokenizer.json")
	code, _, stderr = runCmd(t, "sample", "-model", dir, "-tokenizer", missing, "-prompt", "x", "-threads", "1")
	if code == 0 || !strings.Contains(stderr, "tokenizer") || !strings.Contains(stderr, missing) {
		t.Errorf("sample -tokenizer %s: exit %d, stderr %s", missing, code, stderr)
	}
	// -ids prints the new token ids, the same with and without the cache.
	var ids []string
	for _, extra := range [][]string{nil, {"-no-cache"}} {
		args := append([]string{"sample", "-model", dir, "-prompt", "abc", "-max-new", "12", "-threads", "1", "-ids"}, extra...)
		code, stdout, stderr = runCmd(t, args...)
		if code != 0 || !regexp.MustCompile(`^(\d+( \d+)*)?\n$`).MatchString(stdout) {
			t.Fatalf("%v: exit %d, stdout %q, stderr %s", args, code, stdout, stderr)
		}
		ids = append(ids, stdout)
	}
	if ids[0] != ids[1] {
		t.Errorf("sample -ids: %q with the KV cache, %q without", ids[0], ids[1])
	}
	// The run's checkpoint holds the same weights as its export: sampling
	// from the checkpoint file, or from the directory once hf/ is gone,
	// gives the same ids.
	if err := os.RemoveAll(filepath.Join(dir, "hf")); err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{filepath.Join(dir, checkpoint.FileName), dir} {
		code, stdout, stderr = runCmd(t, "sample", "-model", model, "-prompt", "abc", "-max-new", "12", "-threads", "1", "-ids")
		if code != 0 || stdout != ids[0] {
			t.Errorf("sample -model %s: exit %d, ids %q, want %q as from hf/; stderr %s", model, code, stdout, ids[0], stderr)
		}
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
	plan, err := train.MemoryOf(mc, tiny)
	if err != nil {
		t.Fatal(err)
	}
	needs := "needs " + strconv.FormatInt(plan.DeviceTotal(), 10) + " bytes"
	alpaca, err := filepath.Abs("../../train/data/testdata/alpaca-sample.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
		not  []string // what the error (stderr's lines from "lsp-train") must not hold
	}{
		{"device-mem too small", []string{"--device-mem", "1KiB", "--batch", "4"}, []string{"--device-mem", needs, "1024", "device memory (", "activations"},
			// The host side is not device memory.
			[]string{"host", "staging"}},
		{"device-mem from the config file", []string{"--config", writeJSON(t, `{"device_mem": "1KiB", "batch": 4}`)}, []string{"--device-mem", needs}, nil},
		// The file's batch 0 would fail validation; the command line's 4
		// wins, and the bytes needed are those of batch 4.
		{"flags override the config file", []string{"--config", writeJSON(t, `{"batch": 0, "device_mem": "1KiB"}`), "--batch", "4"}, []string{"--device-mem", needs}, nil},
		{"a check setting without --fit", []string{"--mode", "lsp", "--check-every", "5", "--refit", "sum"}, []string{"--check-every, --refit", "--fit"}, nil},
		{"bad projector kind", []string{"--mode", "lsp", "--projector", "dense"}, []string{"-projector", `"dense"`, "sparse, svd or gaussian"}, nil},
		{"a fit setting with svd projectors", []string{"--mode", "lsp", "--projector", "svd", "--check-every", "5", "--refit", "sum"}, []string{"--refit: only the fit", "--projector svd"}, []string{"--check-every, --refit"}},
		{"svd projectors with --fit", []string{"--mode", "lsp", "--projector", "svd", "--fit"}, []string{"--fit", "--projector svd"}, nil},
		{"gaussian projectors with --fit", []string{"--mode", "lsp", "--projector", "gaussian", "--fit"}, []string{"--projector gaussian", "--fit"}, nil},
		{"unknown config key", []string{"--config", writeJSON(t, `{"steps": 5, "learning_rate": 0.1}`)}, []string{"--config", "learning_rate"}, nil},
		{"config key that is not a value", []string{"--config", writeJSON(t, `{"steps": [5]}`)}, []string{"--config", "steps"}, nil},
		{"config value of the wrong type", []string{"--config", writeJSON(t, `{"steps": "many"}`)}, []string{"--config", "steps", "many"}, nil},
		{"config file missing", []string{"--config", filepath.Join(t.TempDir(), "nope.json")}, []string{"--config", "nope.json"}, nil},
		{"config file not JSON", []string{"--config", writeJSON(t, `{"steps": 5,`)}, []string{"--config", "config.json"}, nil},
		{"config names config", []string{"--config", writeJSON(t, `{"config": "x.json"}`)}, []string{"--config", `"config"`}, nil},
		{"bad byte size", []string{"--device-mem", "lots"}, []string{"device-mem", "lots"}, nil},
		{"bad mode", []string{"--mode", "offload"}, []string{"-mode", "offload", "native, zero, lsp, lora or galore"}, nil},
		{"bad dtype", []string{"--dtype", "fp16"}, []string{"-dtype", "fp16", "fp32 or bf16"}, nil},
		{"bad clip mode", []string{"--clip-mode", "global"}, []string{"-clip-mode", "global"}, nil},
		{"bad schedule", []string{"--schedule", "eager"}, []string{"-schedule", "eager"}, nil},
		{"bad collectives", []string{"--collectives", "gloo"}, []string{"-collectives", "gloo", "auto, host or nccl"}, nil},
		{"nccl on the CPU", []string{"--collectives", "nccl", "--device", "cpu"}, []string{"--collectives", "nccl sums on CUDA devices"}, nil},
		{"bad dense params", []string{"--dense-params", "cpu"}, []string{"-dense-params", "cpu"}, nil},
		{"lora target the model lacks", []string{"--mode", "lora", "--lora-targets", "q_proj"}, []string{"--lora-targets", "no module q_proj", "c_attn, c_proj, c_fc"}, nil},
		{"lora rank 0", []string{"--mode", "lora", "--lora-r", "0"}, []string{"--lora-r", "at least 1"}, nil},
		{"lora dropout", []string{"--mode", "lora", "--lora-dropout", "0.1"}, []string{"--lora-dropout", "only 0"}, nil},
		{"base dtype outside lora", []string{"--mode", "lsp", "--base-dtype", "nf4"}, []string{"--base-dtype", "--mode lora", "stay in --dtype"}, nil},
		{"unknown base dtype", []string{"--mode", "lora", "--base-dtype", "fp4"}, []string{"--base-dtype", `"fp4"`, "nf4 or int8"}, nil},
		{"adapter outside lora", []string{"--adapter", t.TempDir()}, []string{"--adapter", "--mode lora"}, nil},
		{"adapter dir without a config", []string{"--mode", "lora", "--adapter", t.TempDir()}, []string{"--adapter", "adapter_config.json"}, nil},
		{"bad grad dtype in the config file", []string{"--config", writeJSON(t, `{"grad_dtype": "fp8"}`)}, []string{"--config", "grad_dtype", "fp8"}, nil},
		{"unknown device", []string{"--device", "tpu"}, []string{"-device", "tpu", "cpu or cuda"}, nil},
		{"cuda not in this build", []string{"--device", "cuda"}, []string{"--device", "not available in this build"}, nil},
		{"bad batch", []string{"--batch", "0"}, []string{"--batch"}, nil},
		{"steps and epochs", []string{"--steps", "5", "--epochs", "1"}, []string{"--epochs", "contradicts --steps 5"}, nil},
		{"steps in the config file, epochs on the command line", []string{"--config", writeJSON(t, `{"steps": 5}`), "--epochs", "2"},
			[]string{"--epochs", "contradicts --steps 5"}, nil},
		// tiny's 64-token context holds no Alpaca record: name a preset
		// that holds 90% of them (all 4; mini's 256 tokens hold 2).
		{"alpaca into tiny", []string{"--data", alpaca}, []string{"--data: " + alpaca, "all 4 examples dropped", "--model gpt2", "--seq-len 397 keeps at least 90%"}, []string{"--data: data:"}},
		{"missing data file", []string{"--data", "nope.json"}, []string{"--data: open nope.json"}, []string{"--data: data:"}},
		{"sample top-p 0", []string{"sample", "-prompt", "x", "-top-p", "0"}, []string{"--top-p", "(0, 1]"}, nil},
		{"sample top-p above 1", []string{"sample", "-prompt", "x", "-top-p", "1.5"}, []string{"--top-p", "(0, 1]"}, nil},
		{"sample negative temperature", []string{"sample", "-prompt", "x", "-temperature", "-1"}, []string{"--temperature"}, nil},
		{"sample negative top-k", []string{"sample", "-prompt", "x", "-top-k", "-1"}, []string{"--top-k"}, nil},
		{"sample zero repetition penalty", []string{"sample", "-prompt", "x", "-repetition-penalty", "0"}, []string{"--repetition-penalty"}, nil},
		{"unknown flag", []string{"--learning-rate", "1"}, []string{"learning-rate"}, nil},
		{"positional argument", []string{"train"}, []string{`"train"`}, nil},
		{"sample without a prompt", []string{"sample", "-model", t.TempDir()}, []string{"--prompt"}, nil},
		{"sample of a missing model", []string{"sample", "-model", filepath.Join(t.TempDir(), "gone"), "-prompt", "x"}, []string{"--model", "gone"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "cuda not in this build" && device.Check(device.CUDA) == nil {
				t.Skip("this build has the CUDA backend (-tags cuda or cudasim)")
			}
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
			msg := stderr[max(0, strings.Index(stderr, "lsp-train")):]
			for _, w := range append(tc.not, "Usage:") {
				if strings.Contains(msg, w) {
					t.Errorf("the error mentions %q:\n%s", w, msg)
				}
			}
			if _, err := os.Stat(filepath.Join(out, checkpoint.FileName)); err == nil {
				t.Errorf("a failed command left a checkpoint")
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"sample", "-h"}, {"compare", "-h"}} {
		code, stdout, stderr := runCmd(t, args...)
		if code != 0 {
			t.Errorf("%v: exit %d, want 0; stderr:\n%s", args, code, stderr)
		}
		if !strings.Contains(stderr, "Usage: lsp-train") || stdout != "" {
			t.Errorf("%v: usage not on stderr (stdout %q, stderr %q)", args, stdout, stderr)
		}
		if strings.Contains(stderr, "help requested") {
			t.Errorf("%v: help reported as an error: %s", args, stderr)
		}
		// Placeholders a person can read: none of the flag package's
		// type names, no example standing in for a name.
		if m := regexp.MustCompile(`(?m)^  --\S+ (value|int|float|string|uint)$`).FindString(stderr); m != "" {
			t.Errorf("%v: a placeholder that names a Go type: %q", args, m)
		}
	}
	_, _, stderr := runCmd(t, "-h")

	// The groups, in order, each holding its flags.
	at := func(s string) int {
		i := strings.Index(stderr, s)
		if i < 0 {
			t.Errorf("usage does not hold %q", s)
		}
		return i
	}
	prev := -1
	for _, g := range trainGroupOrder {
		i := at("\n" + g + ":\n")
		if i < prev {
			t.Errorf("group %q out of order", g)
		}
		prev = i
	}
	for _, fg := range trainFlagGroups {
		start, end := at("\n"+fg.group+":\n"), len(stderr)
		if k := slices.Index(trainGroupOrder, fg.group); k+1 < len(trainGroupOrder) {
			end = at("\n" + trainGroupOrder[k+1] + ":\n")
		}
		loc := regexp.MustCompile(`\n  --` + regexp.QuoteMeta(fg.flag) + `[ \n]`).FindStringIndex(stderr)
		if loc == nil || loc[0] < start || loc[0] > end {
			t.Errorf("--%s is not listed under %s", fg.flag, fg.group)
		}
	}
	// Every flag is in a group once: a new flag joins one in trainFlagGroups.
	cfg := train.Defaults()
	fs := flag.NewFlagSet("lsp-train", flag.ContinueOnError)
	fs.String("config", "", "")
	bindTrainFlags(fs, &cfg)
	seen := map[string]int{}
	for _, fg := range trainFlagGroups {
		seen[fg.flag]++
		if fs.Lookup(fg.flag) == nil {
			t.Errorf("trainFlagGroups names --%s, which is not a flag", fg.flag)
		}
		if !slices.Contains(trainGroupOrder, fg.group) {
			t.Errorf("--%s is in group %q, which -h does not show", fg.flag, fg.group)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if seen[f.Name] != 1 {
			t.Errorf("--%s is in %d groups of trainFlagGroups (flags.go), want 1", f.Name, seen[f.Name])
		}
	})
	if strings.Contains(stderr, "\nOther:\n") {
		t.Errorf("usage has flags outside the groups:\n%s", stderr)
	}

	// Readable placeholders, the subcommands with their flags, the exit
	// statuses.
	for _, want := range []string{
		"--config FILE\n", "--device-mem SIZE\n", "--link-bandwidth SIZE\n", "--out DIR\n", "--steps N\n",
		"--lr X\n", "--mode MODE\n", "--resume\n",
		"  sample ", "[--prompt TEXT]", "[--top-p X]", "  compare ", "[--pretrain-steps N]", "[--link-bandwidth SIZE]",
		"130", "143",
	} {
		at(want)
	}
}

// TestMistypedFlag: a flag that does not exist, or a bad value, is
// answered with one line naming it, the flag meant when one is close, and
// -h; not with the whole usage.
func TestMistypedFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--step", "3"}, []string{"-step", "did you mean --steps?", "lsp-train -h"}},
		{[]string{"--seqlen", "3"}, []string{"-seqlen", "did you mean --seq-len?", "lsp-train -h"}},
		{[]string{"--learning-rate", "1"}, []string{"-learning-rate", "lsp-train -h"}},
		{[]string{"--mode", "fast"}, []string{"-mode", "fast", "lsp-train -h"}},
		{[]string{"--steps"}, []string{"-steps", "lsp-train -h"}},
		{[]string{"sample", "--promt", "x"}, []string{"lsp-train sample:", "did you mean --prompt?", "lsp-train sample -h"}},
		{[]string{"compare", "--step", "2"}, []string{"lsp-train compare:", "did you mean --steps?", "lsp-train compare -h"}},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != 1 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q; want 1 and nothing", tc.args, code, stdout)
		}
		if n := strings.Count(stderr, "\n"); n != 1 {
			t.Errorf("%v: %d lines on stderr, want 1:\n%s", tc.args, n, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr does not hold %q: %s", tc.args, w, stderr)
			}
		}
	}
}

// TestEpochs: --epochs alone sets the run's length (it used to be ignored
// for --steps' default of 600), and neither flag runs 600 steps.
func TestEpochs(t *testing.T) {
	model, err := filepath.Abs(killModel)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	// builtin:reverse:40 at --seq-len 24 keeps 31 training rows: 7 steps
	// of 4 an epoch.
	code, stdout, stderr := runCmd(t, "--model", model, "--data", "builtin:reverse:40", "--epochs", "1", "--batch", "4",
		"--seq-len", "24", "--eval-generate", "0", "--threads", "1", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, ": 7 steps.") || !strings.Contains(stderr, "steps_per_epoch=7") {
		t.Errorf("--epochs 1 did not train one epoch of 7 steps:\n%s\n%s", stdout, stderr)
	}
}

// TestResumeCommand: a resume with a changed --lr is refused with one
// line naming it and both values; one with a longer run and another eval
// cadence is allowed, logs each change, and its summary counts the steps
// of this process, names where it resumed, and shows the progress
// display's tokens/s.
func TestResumeCommand(t *testing.T) {
	model, err := filepath.Abs(killModel)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	args := []string{"--model", model, "--data", "builtin:reverse:200", "--batch", "4", "--seq-len", "24",
		"--eval-generate", "2", "--threads", "1", "--out", dir}
	if code, stdout, stderr := runCmd(t, append(args, "--steps", "2")...); code != 0 {
		t.Fatalf("first run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, _, stderr := runCmd(t, append(args, "--steps", "2", "--resume", "--lr", "0.001")...)
	if code != 1 || !strings.Contains(stderr, "\n  --lr: checkpoint has 0.003, command line has 0.001\n") || strings.Contains(stderr, "--batch") {
		t.Errorf("resume with another --lr: exit %d, want 1 and one line naming --lr:\n%s", code, stderr)
	}

	code, stdout, stderr := runCmd(t, append(args, "--steps", "5", "--eval-every", "2", "--resume")...)
	if code != 0 {
		t.Fatalf("resume: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"flag=--steps checkpoint=2 now=5", "flag=--eval-every checkpoint=100 now=2"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the log does not hold %q:\n%s", want, stderr)
		}
	}
	if !strings.Contains(stdout, ": 3 steps in this run (3 to 5; resumed at step 2).") {
		t.Errorf("the summary does not count this run's steps:\n%s", stdout)
	}
	// One tokens/s: the last progress line's is the summary's.
	var last string
	for _, m := range regexp.MustCompile(`msg=train step=\d+ total=5 loss=\S+ lr=\S+ tok_s=(\d+)`).FindAllStringSubmatch(stderr, -1) {
		last = m[1]
	}
	if last == "" || !strings.Contains(stdout, ", "+last+" tokens/s") {
		t.Errorf("the progress display ended at %s tokens/s, the summary says otherwise:\n%s", last, stdout)
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
	report(&out, train.Defaults(), &train.Result{Interrupted: true, Steps: 7, StepsRun: 3, ResumedAt: 4, Total: 600,
		Checkpoint: "out/checkpoint.safetensors", Plot: "out/loss.png"})
	for _, w := range []string{"step 7 of 600", "3 steps in this run (5 to 7; resumed at step 4)", "out/checkpoint.safetensors", "out/loss.png", "--resume"} {
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
