// Tests of what a new user trips over on the command line (issue 36):
// each runs the command as a child process, as a user's shell does, and
// checks its exit status and what it says.

package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
)

// execCmd runs the command with args in dir ("" for this one) as a child
// process and returns its exit status, stdout and stderr.
func execCmd(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("child processes: not under -short")
	}
	var stdout, stderr bytes.Buffer
	cmd := startChild(t, dir, args, &stdout, &stderr)
	err := cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

// smallRun is a run of the committed micro model that takes a fraction
// of a second.
func smallRun(t *testing.T) []string {
	t.Helper()
	model, err := filepath.Abs(killModel)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--model", model, "--steps", "1", "--batch", "4", "--seq-len", "24", "--data", "builtin:reverse:200",
		"--eval-generate", "0", "--threads", "1"}
}

// TestLowLR: --lr below the old fixed --min-lr default (3e-4) runs on its
// own, --min-lr defaulting to a tenth of it; -h says so, once.
func TestLowLR(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := execCmd(t, "", append(smallRun(t), "--lr", "3e-5", "--out", out)...)
	if code != 0 {
		t.Fatalf("--lr 3e-5 alone: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// The default run's --min-lr stays 3e-4 exactly (not 0.1 x 3e-3,
	// one ulp above), as its recorded settings and schedule have it.
	for lr, want := range map[float64]float64{3e-3: 3e-4, 6e-4: 6e-5, 3e-5: 3e-6} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		c := train.Defaults()
		bindTrainFlags(fs, &c)
		c.LR = lr
		if defaultMinLR(fs, &c); c.MinLR != want {
			t.Errorf("--lr %g: default --min-lr %v, want %v", lr, c.MinLR, want)
		}
	}
	_, _, help := execCmd(t, "", "-h")
	if !regexp.MustCompile(`--min-lr X\n\s+learning rate at the last step \(default 0.1 x --lr\)\n`).MatchString(help) {
		t.Errorf("-h does not give --min-lr's default as a share of --lr:\n%s", help)
	}
}

// TestStepsZero: --steps 0 is refused, naming --steps, not run as 600
// steps; also from the config file.
func TestStepsZero(t *testing.T) {
	// The micro model without --steps: before the fix, 600 quick steps.
	small := slices.Delete(smallRun(t), 2, 4) // "--steps", "1"
	for _, args := range [][]string{{"--steps", "0"}, {"--config", writeJSON(t, `{"steps": 0}`)}} {
		code, stdout, stderr := execCmd(t, "", append(append(slices.Clone(small), args...), "--out", filepath.Join(t.TempDir(), "out"))...)
		if code != 1 || !strings.Contains(stderr, "lsp-train: --steps: must be at least 1, got 0") || strings.Contains(stderr, "msg=train") {
			t.Errorf("%v: exit %d, want 1 and an error naming --steps\n%s\n%s", args, code, stdout, stderr)
		}
	}
}

// TestResumeArgument: a path after --resume is answered with how to
// resume (--out DIR --resume), and --resume where --out holds no
// checkpoint names the file it looked for, before reading the model.
func TestResumeArgument(t *testing.T) {
	code, _, stderr := execCmd(t, "", "--resume", "out/checkpoint.safetensors")
	if code != 1 || !strings.Contains(stderr, `unexpected argument "out/checkpoint.safetensors" after --resume`) ||
		!strings.Contains(stderr, "--out DIR --resume") {
		t.Errorf("--resume PATH: exit %d, want 1 and how to resume:\n%s", code, stderr)
	}
	// Any other switch given a value.
	code, _, stderr = execCmd(t, "", "--truncate", "yes")
	if code != 1 || !strings.Contains(stderr, `unexpected argument "yes" after --truncate, which takes no value`) {
		t.Errorf("--truncate yes: exit %d:\n%s", code, stderr)
	}

	out := filepath.Join(t.TempDir(), "empty")
	code, _, stderr = execCmd(t, "", append(smallRun(t), "--resume", "--out", out)...)
	want := "lsp-train: --resume: no checkpoint to continue: " + filepath.Join(out, "checkpoint.safetensors") + " does not exist"
	if code != 1 || !strings.Contains(stderr, want) || strings.Contains(stderr, "no such file") {
		t.Errorf("--resume without a checkpoint: exit %d, want 1 and %q:\n%s", code, want, stderr)
	}
}

// TestFlagErrors: every error naming a flag spells it --flag; a mistyped
// flag gets the closest flags, a swap of two letters counting as one
// edit, all of them when several are as close.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--modle", "lsp"}, "flag provided but not defined: --modle (did you mean --mode or --model?)"},
		{[]string{"--setps", "3"}, "(did you mean --steps?)"},
		{[]string{"--mode", "fast"}, `invalid value "fast" for flag --mode:`},
		{[]string{"--steps"}, "flag needs an argument: --steps;"},
		{[]string{"--fit=maybe"}, "for --fit:"},
		{[]string{"sample", "-promtp", "x"}, "flag provided but not defined: --promtp (did you mean --prompt?)"},
	} {
		code, stdout, stderr := execCmd(t, "", tc.args...)
		if code != 1 || stdout != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q; want 1 and %q in:\n%s", tc.args, code, stdout, tc.want, stderr)
		}
		// -h keeps its one dash, as every program spells it.
		if m := regexp.MustCompile(`(^|[ :(])-[a-z]`).FindString(strings.ReplaceAll(stderr, " -h ", " ")); m != "" {
			t.Errorf("%v: a flag spelled with one dash (%q):\n%s", tc.args, m, stderr)
		}
	}
}

// TestByteSizeUnits: units in any case; "gb" is 10^9 bytes as "GB" is,
// and a bad size says what is accepted.
func TestByteSizeUnits(t *testing.T) {
	for in, want := range map[string]int64{"8gb": 8e9, "8GB": 8e9, "8gib": 8 << 30, "8g": 8 << 30, "512mib": 512 << 20, "2Kb": 2000, "100b": 100} {
		got, err := parseBytes(in)
		if err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	// As the command sees it: --device-mem 1kb is too small for the
	// model (the size was read), --device-mem 8xb is not a size.
	code, _, stderr := execCmd(t, "", "--device-mem", "1kb", "--out", filepath.Join(t.TempDir(), "out"))
	if code != 1 || !strings.Contains(stderr, "--device-mem") || strings.Contains(stderr, "not a byte size") {
		t.Errorf("--device-mem 1kb: exit %d, want the plan refused:\n%s", code, stderr)
	}
	code, _, stderr = execCmd(t, "", "--device-mem", "8xb")
	if code != 1 || !strings.Contains(stderr, `"8xb" is not a byte size`) || !strings.Contains(stderr, "KB, MB, GB, TB powers of 1000") {
		t.Errorf("--device-mem 8xb: exit %d, want the units accepted:\n%s", code, stderr)
	}
}

// TestVersionAndHelp: --version prints the version and the Go release;
// lsp-train help is -h, lsp-train help plan is plan's.
func TestVersionAndHelp(t *testing.T) {
	code, stdout, stderr := execCmd(t, "", "--version")
	if code != 0 || !regexp.MustCompile(`^lsp-train \S.* go1\.\d+`).MatchString(stdout) {
		t.Errorf("--version: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{{[]string{"help"}, "Usage: lsp-train [flags]"}, {[]string{"help", "plan"}, "Usage: lsp-train plan"}} {
		code, stdout, stderr := execCmd(t, "", tc.args...)
		if code != 0 || stdout != "" || !strings.HasPrefix(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, want 0 and %q first on stderr:\n%s", tc.args, code, stdout, tc.want, stderr)
		}
	}
}

// TestOneDefault: a flag whose usage states its default (--dtype's
// depends on --device) shows no second one from its value.
func TestOneDefault(t *testing.T) {
	_, _, help := execCmd(t, "", "-h")
	for _, name := range []string{"dtype", "dense-params"} {
		i := strings.Index(help, "\n  --"+name+" ")
		if i < 0 {
			t.Fatalf("-h has no --%s", name)
		}
		entry := help[i+1:]
		entry = entry[:strings.Index(entry[1:], "\n  --")+1]
		if n := strings.Count(entry, "(default"); n != 1 {
			t.Errorf("--%s shows %d defaults, want 1:\n%s", name, n, entry)
		}
	}
}

// TestConfigNotObject: a --config file holding an array (or any JSON
// but an object) is refused naming the file and what it must be.
func TestConfigNotObject(t *testing.T) {
	path := writeJSON(t, `[{"steps": 200}]`)
	code, _, stderr := execCmd(t, "", "--config", path)
	want := "lsp-train: --config " + path + `: must be a JSON object of flag settings, such as {"steps": 200}, not an array`
	if code != 1 || !strings.Contains(stderr, want) || strings.Contains(stderr, "Go value") {
		t.Errorf("--config of an array: exit %d, want %q:\n%s", code, want, stderr)
	}
	_ = os.Remove(path)
}

// TestDefaultOut: the plain command replaces out/ only when a run without
// --out marked it, and says so in plain words, never naming --overwrite,
// which was not given; an out/ holding the user's own files, or the
// outputs of a run given --out out, is refused as any non-empty --out.
func TestDefaultOut(t *testing.T) {
	args := smallRun(t)
	work := t.TempDir()
	out := filepath.Join(work, "out")
	for i := range 2 {
		code, stdout, stderr := execCmd(t, work, args...)
		if code != 0 {
			t.Fatalf("run %d without --out: exit %d\n%s\n%s", i+1, code, stdout, stderr)
		}
		said := strings.Contains(stderr, "out holds the outputs of an earlier run with the default --out: replacing them (give --out DIR to keep them)")
		if said != (i == 1) || strings.Contains(stderr, "--overwrite") {
			t.Errorf("run %d without --out: the log says it replaces out/: %v, want %v, and never --overwrite:\n%s", i+1, said, i == 1, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(out, ".lsp-train-default-out")); err != nil {
		t.Errorf("a run without --out left no marker (train.DefaultOutMarker, as the README names it): %v", err)
	}

	// The user's own files in out/.
	work = t.TempDir()
	notes := filepath.Join(work, "out", "notes.txt")
	if err := os.MkdirAll(filepath.Dir(notes), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notes, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := execCmd(t, work, args...)
	if code != 1 || !strings.Contains(stderr, "lsp-train: --out: out is not empty (notes.txt)") || !strings.Contains(stderr, "--overwrite") {
		t.Errorf("out/ of the user's files: exit %d, want 1 and a refusal naming --overwrite:\n%s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(work, "out", checkpoint.FileName)); err == nil {
		t.Errorf("the refused run wrote into the user's out/")
	}

	// A run given --out out explicitly: its outputs are not the plain
	// command's to replace.
	work = t.TempDir()
	if code, _, stderr := execCmd(t, work, append(args, "--out", "out")...); code != 0 {
		t.Fatalf("--out out: exit %d\n%s", code, stderr)
	}
	code, _, stderr = execCmd(t, work, args...)
	if code != 1 || !strings.Contains(stderr, "lsp-train: --out: out is not empty") {
		t.Errorf("after a run given --out out, a run without --out: exit %d, want 1 and a refusal:\n%s", code, stderr)
	}
}

// TestSampleEmptyPrompt: sample --prompt "" generates from the
// beginning-of-sequence token (a llama2.c model's BOS, one prompt token),
// as llama2.c's run does; no --prompt at all is still an error.
func TestSampleEmptyPrompt(t *testing.T) {
	bin, err := filepath.Abs("../../train/testdata/llama2c/untied.bin")
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := execCmd(t, "", "sample", "--model", bin, "--prompt", "", "--max-new", "4", "--ids", "--threads", "1")
	if code != 0 || !strings.Contains(stderr, "1 prompt tokens") || strings.TrimSpace(stdout) == "" {
		t.Errorf("sample --prompt \"\": exit %d, want 0, 1 prompt token (BOS) and ids\nstdout %q\nstderr %s", code, stdout, stderr)
	}
	code, _, stderr = execCmd(t, "", "sample", "--model", bin)
	if code != 1 || !strings.Contains(stderr, "--prompt is required") {
		t.Errorf("sample without --prompt: exit %d, want 1 and --prompt required:\n%s", code, stderr)
	}
}

// TestSampleLlama2CErrors: a truncated llama2.c .bin and a version-1
// export are reported by sample as training reports them, not as a bad
// safetensors header.
func TestSampleLlama2CErrors(t *testing.T) {
	raw := readFile(t, "../../train/testdata/llama2c/untied.bin")
	truncated := tempFile(t, "truncated.bin", raw[:len(raw)-100])
	// export.py --version 1: the magic "ak42", the version, then its own
	// header, padded to 256 bytes.
	v1 := make([]byte, 256)
	copy(v1, []byte{0x32, 0x34, 0x6b, 0x61, 1, 0, 0, 0})
	version1 := tempFile(t, "v1.bin", v1)
	for _, tc := range []struct{ path, want string }{
		{truncated, "bytes, but the header"},
		{version1, "is a version 1 export"},
	} {
		_, _, trainErr := execCmd(t, "", "--model", tc.path, "--out", filepath.Join(t.TempDir(), "out"))
		code, _, sampleErr := execCmd(t, "", "sample", "--model", tc.path, "--prompt", "x")
		trainMsg, _ := strings.CutPrefix(strings.TrimSpace(trainErr), "lsp-train: ")
		if !strings.Contains(trainMsg, tc.want) {
			t.Fatalf("training on %s: want %q in:\n%s", tc.path, tc.want, trainErr)
		}
		if code != 1 || strings.TrimSpace(sampleErr) != "lsp-train sample: "+trainMsg {
			t.Errorf("sample of %s: exit %d, want 1 and training's error %q:\n%s", tc.path, code, trainMsg, sampleErr)
		}
	}
}

// TestPresetSaysRandom: a run of a preset (GPT-2's and LLaMA's) logs
// that its weights are a random initialisation, not pretrained ones; a
// run of a Hugging Face directory does not; and the README's first
// example naming a preset says how to get real weights.
func TestPresetSaysRandom(t *testing.T) {
	const line = `msg="random initialisation (a preset, not pretrained weights)"`
	for _, model := range []string{"tiny", "llama-tiny"} {
		code, stdout, stderr := execCmd(t, "", "--model", model, "--steps", "1", "--batch", "2", "--seq-len", "16",
			"--data", "builtin:reverse:60", "--eval-generate", "0", "--threads", "1", "--out", filepath.Join(t.TempDir(), "out"))
		if code != 0 || !strings.Contains(stderr, line) {
			t.Errorf("--model %s: exit %d, want 0 and %s in the log:\n%s\n%s", model, code, line, stdout, stderr)
		}
	}
	code, _, stderr := execCmd(t, "", append(smallRun(t), "--out", filepath.Join(t.TempDir(), "out"))...)
	if code != 0 || strings.Contains(stderr, "random initialisation") {
		t.Errorf("a Hugging Face directory: exit %d, and the log must not call its weights random:\n%s", code, stderr)
	}

	readme := string(readFile(t, "../../README.md"))
	first := regexp.MustCompile(`--model (` + strings.Join(catalog.Presets(), "|") + `)\b`).FindStringIndex(readme)
	if first == nil {
		t.Fatal("no README example names a preset")
	}
	// The note follows that example's block, before the next heading.
	after := readme[first[0]:]
	if i := strings.Index(after, "\n#"); i > 0 {
		after = after[:i]
	}
	after = strings.Join(strings.Fields(after), " ") // the words, however the lines wrap
	for _, want := range []string{"random initialisation (a preset, not pretrained weights)", "Hugging Face directory", "`config.json`", "`model.safetensors`", "`tokenizer.json`"} {
		if !strings.Contains(after, want) {
			t.Errorf("README after its first example naming a preset (%q) does not say %q", readme[first[0]:first[1]], want)
		}
	}
}

// TestCheckAtStart: the check before step 1 is a switch that is off by
// default and turned on by giving it (it was --start-random, on by
// default, off only as --start-random=false); the old flag says what
// replaced it.
func TestCheckAtStart(t *testing.T) {
	checksAtStep0 := func(args ...string) int {
		t.Helper()
		out := filepath.Join(t.TempDir(), "out")
		code, stdout, stderr := execCmd(t, "", append(append(smallRun(t), "--out", out, "--mode", "lsp", "--fit", "--d", "8", "--r", "2",
			"--calib-samples", "4", "--fit-iters", "2"), args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s\n%s", args, code, stdout, stderr)
		}
		recs := readMetrics(t, out)
		n := 0
		for _, r := range recs {
			if r.Event == "projector-check" && r.Step == 0 {
				n++
			}
		}
		return n
	}
	if n := checksAtStep0(); n != 0 {
		t.Errorf("without --check-at-start: %d check records before step 1, want none", n)
	}
	if n := checksAtStep0("--check-at-start"); n == 0 {
		t.Errorf("--check-at-start: no check records before step 1")
	}
	_, _, help := execCmd(t, "", "-h")
	if !strings.Contains(help, "\n  --check-at-start\n") || strings.Contains(help, "start-random") {
		t.Errorf("-h: want --check-at-start, a switch with no default shown, and no --start-random:\n%s", help)
	}
	code, _, stderr := execCmd(t, "", "--start-random=false")
	if code != 1 || !strings.Contains(stderr, "--start-random=false is --check-at-start") {
		t.Errorf("--start-random=false: exit %d, want 1 and what replaced it:\n%s", code, stderr)
	}
}
