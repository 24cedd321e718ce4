// Tests that run the command as a child process, as a user or a script
// does: the exit status and outputs of a run stopped by SIGINT or
// SIGTERM, and every command line of README.md's examples, so that the
// README cannot drift from the program.
//
// Both skip under -short (child processes are slow under -race) and run
// in make test's race-free pass (gotest-norace).

package main

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/compare"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
)

// startChild starts the command with args in dir ("" for this one),
// writing its stdout and stderr into the buffers.
func startChild(t *testing.T, dir string, args []string, stdout, stderr *bytes.Buffer) *exec.Cmd {
	t.Helper()
	cmd := childCmd(dir, args, "")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// waitForStep waits until the child's metrics file at path has its first
// step's line (the run trains, so a signal now stops a run in progress);
// after 2 minutes without one it kills the child and fails t, naming what
// it waited for.
func waitForStep(t *testing.T, cmd *exec.Cmd, path, what string, stderr *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		b, _ := os.ReadFile(path)
		if bytes.Contains(b, []byte(`"train_loss"`)) {
			return
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no %s after 2 minutes:\n%s", what, stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// skipChildProcesses skips a test that runs the command as child
// processes under -short: they are slow under -race, and make test runs
// such tests in its race-free pass (gotest-norace).
func skipChildProcesses(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("child processes; runs in make test's race-free pass (gotest-norace)")
	}
}

// TestInterruptExitStatus stops a run with SIGINT and with SIGTERM once it
// trains: it must exit with 130 and 143, after a checkpoint that loads
// and the loss plot; the SIGTERM run then resumes to the end.
func TestInterruptExitStatus(t *testing.T) {
	skipChildProcesses(t)
	mc := killModelConfig(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := []string{"--model", killModel, "--data", "builtin:reverse:300", "--steps", "100000", "--batch", "4",
				"--seq-len", "24", "--eval-every", "0", "--eval-generate", "0", "--checkpoint-every", "0", "--threads", "1", "--out", out}
			var stdout, stderr bytes.Buffer
			cmd := startChild(t, "", args, &stdout, &stderr)
			waitForStep(t, cmd, filepath.Join(out, "metrics.jsonl"), "step", &stderr)
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			if got := cmd.ProcessState.ExitCode(); got != tc.code {
				t.Errorf("exit status %d after %v, want %d\nstdout:\n%s\nstderr:\n%s", got, tc.sig, tc.code, stdout.String(), stderr.String())
			}
			if want := fmt.Sprintf("(exit status %d)", tc.code); !strings.Contains(stderr.String(), want) {
				t.Errorf("stderr does not say %s:\n%s", want, stderr.String())
			}
			ck, err := checkpoint.Load(filepath.Join(out, checkpoint.FileName), mc, nil)
			if err != nil {
				t.Fatalf("the checkpoint of the interrupted run: %v", err)
			}
			if ck.Step < 1 || !strings.Contains(stdout.String(), fmt.Sprintf("Interrupted at step %d of 100000", ck.Step)) {
				t.Errorf("checkpoint at step %d; stdout:\n%s", ck.Step, stdout.String())
			}
			if st, err := os.Stat(filepath.Join(out, "loss.png")); err != nil || st.Size() == 0 {
				t.Errorf("no loss plot after %v: %v", tc.sig, err)
			}
			if tc.sig != syscall.SIGTERM {
				return
			}
			// It goes on where it stopped; a shorter run is allowed.
			stdout.Reset()
			stderr.Reset()
			args[slices.Index(args, "100000")] = strconv.Itoa(ck.Step + 2)
			cmd = startChild(t, "", append(args, "--resume"), &stdout, &stderr)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("resume: %v\n%s", err, stderr.String())
			}
			if want := fmt.Sprintf("2 steps in this run (%d to %d; resumed at step %d)", ck.Step+1, ck.Step+2, ck.Step); !strings.Contains(stdout.String(), want) {
				t.Errorf("the resumed run's summary does not say %q:\n%s", want, stdout.String())
			}
		})
	}
}

// TestCompareInterruptExitStatus: lsp-train compare stopped by SIGINT
// while it pretrains exits with 130 too.
func TestCompareInterruptExitStatus(t *testing.T) {
	skipChildProcesses(t)
	out := filepath.Join(t.TempDir(), "cmp")
	var stdout, stderr bytes.Buffer
	cmd := startChild(t, "", []string{"compare", "--out", out, "--threads", "1"}, &stdout, &stderr)
	waitForStep(t, cmd, filepath.Join(out, "pretrain", "metrics.jsonl"), "pretraining step", &stderr)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if got := cmd.ProcessState.ExitCode(); got != 130 || !strings.Contains(stderr.String(), "(exit status 130)") {
		t.Errorf("compare: exit status %d after SIGINT, want 130\nstderr:\n%s", got, stderr.String())
	}
}

// readmeNotRun are the README examples this test does not run, by their
// text, with the reason; their flags are still parsed and validated.
var readmeNotRun = map[string]string{
	"./bin/lsp-train compare --out runs/compare": "it pretrains tiny and fine-tunes (each row at three rates) and times thirteen rows: minutes even at 2 steps " +
		"(train/compare's TestCompare runs the job at reduced size in make test-compare, TestCompareLRGrid a part of it in make test)",
	"./bin/lsp-train plan --gpu cpu --calibration cpu.json --model gpt2 --batch 2 --seq-len 128 --dtype fp32": "it reads cpu.json, " +
		"which the go run line before it writes (bench/calibrate, not this command); TestPlanCPU plans from such a file",
}

// readmeCaps lower what makes an example slow, so that each runs in about
// a second; everything else runs as written. --epochs becomes --steps 2.
var readmeCaps = map[string]int{
	"steps": 2, "pretrain-steps": 2, "timing-steps": 1, "batch": 2, "grad-accum": 2, "calib-samples": 4,
	"eval-generate": 2, "max-new": 8,
}

// example is one command line of README.md.
type example struct {
	line int    // where it starts in README.md
	text string // as written, continuation lines joined, the comment cut
	args []string
}

// readmeExamples are the command lines in README.md's fenced blocks that
// run the command (./bin/lsp-train or lsp-train, also after "make && ").
func readmeExamples(t *testing.T) []example {
	t.Helper()
	lines := strings.Split(string(readFile(t, "../../README.md")), "\n")
	var exs []example
	fenced := false
	for i := 0; i < len(lines); i++ {
		s := strings.TrimSpace(lines[i])
		if strings.HasPrefix(s, "```") {
			fenced = !fenced
			continue
		}
		s = strings.TrimPrefix(s, "make && ") // the build: this test's binary is the build
		if !fenced || !(strings.HasPrefix(s, "./bin/lsp-train") || strings.HasPrefix(s, "lsp-train")) {
			continue
		}
		start := i
		for strings.HasSuffix(s, `\`) && i+1 < len(lines) {
			i++
			s = strings.TrimSuffix(s, `\`) + " " + strings.TrimSpace(lines[i])
		}
		words, err := shellWords(s)
		if err != nil {
			t.Fatalf("README.md:%d: %v", start+1, err)
		}
		if words[0] != "./bin/lsp-train" && words[0] != "lsp-train" {
			continue // ./bin/lsp-trainer, ...
		}
		exs = append(exs, example{line: start + 1, text: strings.Join(strings.Fields(strings.SplitN(s, " #", 2)[0]), " "), args: words[1:]})
	}
	return exs
}

// shellWords splits a command line as a POSIX shell would for the
// README's examples: words separated by blanks, single and double quotes,
// and a comment from an unquoted # at the start of a word.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		case c == '#' && !inWord:
			i = len(s)
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unclosed %c in %s", c, s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i, inWord = i+1+j, true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	if len(words) == 0 {
		return nil, fmt.Errorf("an empty command")
	}
	return words, nil
}

// commandFlags is the flag set of the command args run (a subcommand's
// when args names one), bound to a configuration that validate checks.
func commandFlags(args []string) (fs *flag.FlagSet, rest []string, validate func() error) {
	switch {
	case len(args) > 0 && args[0] == "sample":
		var o eval.SampleOptions
		fs = flag.NewFlagSet("sample", flag.ContinueOnError)
		bindSampleFlags(fs, &o, new(bool))
		return fs, args[1:], func() error { return nil }
	case len(args) > 0 && args[0] == "plan":
		o := defaultPlanOptions()
		fs = flag.NewFlagSet("plan", flag.ContinueOnError)
		bindPlanFlags(fs, &o)
		return fs, args[1:], func() error { _, err := o.parse(); return err }
	case len(args) > 0 && args[0] == "profile":
		c, mode := profileDefaults(), "all"
		fs = flag.NewFlagSet("profile", flag.ContinueOnError)
		bindProfileFlags(fs, &c, &mode)
		return fs, args[1:], c.Validate
	case len(args) > 0 && args[0] == "compare":
		c := compare.Defaults()
		fs = flag.NewFlagSet("compare", flag.ContinueOnError)
		bindCompareFlags(fs, &c)
		return fs, args[1:], c.Validate
	}
	c := train.Defaults()
	fs = flag.NewFlagSet("lsp-train", flag.ContinueOnError)
	fs.String("config", "", "")
	bindTrainFlags(fs, &c)
	return fs, args, c.Validate
}

// capped is args with readmeCaps applied: a capped flag above its cap (as
// given, or by default) is set to the cap, and --epochs is dropped so
// that --steps applies.
func capped(t *testing.T, args []string) []string {
	t.Helper()
	fs, flags, _ := commandFlags(args)
	sub := args[:len(args)-len(flags)]
	var out []string
	given := map[string]bool{}
	for i := 0; i < len(flags); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(flags[i], "-"), "=")
		f := fs.Lookup(name)
		if !strings.HasPrefix(flags[i], "-") || f == nil {
			out = append(out, flags[i])
			continue
		}
		if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !isBool && i+1 < len(flags) {
			i++
			value, hasValue = flags[i], true
		}
		given[name] = true
		if name == "epochs" && len(sub) == 0 {
			continue
		}
		if limit, ok := readmeCaps[name]; ok {
			if n, err := strconv.ParseFloat(value, 64); err == nil && n > float64(limit) {
				value = strconv.Itoa(limit)
			}
		}
		out = append(out, "--"+name)
		if hasValue {
			out = append(out, value)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(readmeCaps)) {
		f := fs.Lookup(name)
		if f == nil || given[name] {
			continue
		}
		if (len(sub) == 0 || sub[0] == "profile") && slices.Contains(fitFlags, name) && !given["fit"] {
			continue // a check setting needs --fit (checkFitFlags)
		}
		def, _ := strconv.Atoi(f.DefValue)
		if name == "steps" && len(sub) == 0 && def == 0 {
			def = train.DefaultSteps // neither --steps nor --epochs
		}
		if def > readmeCaps[name] {
			out = append(out, "--"+name, strconv.Itoa(readmeCaps[name]))
		}
	}
	return append(slices.Clone(sub), out...)
}

// TestREADMEExamples runs every command line of README.md's examples, in
// order, in one working directory (so that `sample -model out/hf` finds
// what the first example trained), with fixtures for the placeholder
// paths and readmeCaps applied; each must exit 0. The examples in
// readmeNotRun only have their flags parsed and validated.
func TestREADMEExamples(t *testing.T) {
	skipChildProcesses(t)
	work := t.TempDir()
	// A GPT-2 with a 512-token context (the examples' --seq-len) and the
	// byte vocabulary, and Alpaca records short enough for it.
	model := filepath.Join(t.TempDir(), "hf-gpt2")
	mc := gpt2.Config{V: 257, MaxT: 512, C: 32, L: 1, NH: 2, Eps: 1e-5}
	if err := gpt2.ExportHF(model, mc, gpt2.Init(mc, 7)); err != nil {
		t.Fatal(err)
	}
	var recs []map[string]string
	for _, w := range []string{"apple", "river", "stone", "cloud", "green", "light", "music", "paper", "table", "water"} {
		r := []rune(w)
		slices.Reverse(r)
		recs = append(recs, map[string]string{"instruction": "Spell the word backwards.", "input": w, "output": string(r)})
	}
	alpaca := tempJSON(t, "my.json", recs)
	fixtures := map[string]string{
		"path/to/hf-gpt2-dir": model,
		"runs/base/hf":        model, // a fine-tuned model in the README's story
		"my.json":             alpaca,
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	exs := readmeExamples(t)
	if len(exs) < 5 {
		t.Fatalf("only %d examples found in README.md", len(exs))
	}
	seen := map[string]bool{}
	ran := 0
	for _, ex := range exs {
		seen[ex.text] = true
		args := slices.Clone(ex.args)
		skip := ""
		for i, a := range args {
			if f, ok := fixtures[a]; ok {
				args[i] = f
				continue
			}
			// An input (--model, --data, --eval-data, --chat-template) that is a file of the repository
			// or of the shared data beside it, named from the repository's
			// root as a user there would, unless an earlier example wrote
			// it; outputs stay in the working directory.
			input := i > 0 && slices.Contains([]string{"--model", "-model", "--data", "-data", "--eval-data", "--chat-template", "-chat-template"}, args[i-1])
			if !input || filepath.IsAbs(a) {
				continue
			}
			if _, err := os.Stat(filepath.Join(work, a)); err == nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(repo, a)); err == nil {
				args[i] = filepath.Join(repo, a)
			} else if strings.HasPrefix(a, "../shared/data/") {
				skip = a + " is absent (the shared data is optional)"
			}
		}
		fs, flags, validate := commandFlags(args)
		if err := fs.Parse(flags); err != nil {
			t.Errorf("README.md:%d: %s: %v", ex.line, ex.text, err)
			continue
		}
		// A GPU example: validated where this build has cuda (the CPU-only
		// build refuses the device, as it should), never run, since the
		// tests have no GPU; scripts/sim-smoke.sh runs --device cuda on
		// the simulated one.
		if d := fs.Lookup("device"); d != nil && strings.HasPrefix(d.Value.String(), "cuda") {
			if hasCUDA() {
				if err := validate(); err != nil {
					t.Errorf("README.md:%d: %s: %v", ex.line, ex.text, err)
				}
			}
			t.Logf("README.md:%d: not run: %s: needs a GPU", ex.line, ex.text)
			continue
		}
		if err := validate(); err != nil {
			t.Errorf("README.md:%d: %s: %v", ex.line, ex.text, err)
			continue
		}
		if why, ok := readmeNotRun[ex.text]; ok {
			t.Logf("README.md:%d: not run: %s: %s", ex.line, ex.text, why)
			continue
		}
		if skip != "" {
			t.Logf("README.md:%d: skipped: %s", ex.line, skip)
			continue
		}
		args = capped(t, args)
		var stdout, stderr bytes.Buffer
		t0 := time.Now()
		if err := startChild(t, work, args, &stdout, &stderr).Wait(); err != nil {
			t.Errorf("README.md:%d: %s\nran as: lsp-train %s\n%v\nstdout:\n%s\nstderr:\n%s", ex.line, ex.text,
				strings.Join(args, " "), err, stdout.String(), stderr.String())
			continue
		}
		ran++
		t.Logf("README.md:%d: ran in %v: lsp-train %s", ex.line, time.Since(t0).Round(time.Millisecond), strings.Join(args, " "))
	}
	for text := range readmeNotRun {
		if !seen[text] {
			t.Errorf("readmeNotRun lists %q, which README.md no longer has", text)
		}
	}
	if ran == 0 {
		t.Error("no README example ran")
	}
}
