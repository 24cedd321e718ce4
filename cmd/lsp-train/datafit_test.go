// Tests of what the command says when --data's examples do not fit
// --seq-len: the warning with the share dropped and the --seq-len that
// keeps 90% of them, the refusal when fewer than 10% are left without
// --truncate, and the all-dropped error suggesting the same --seq-len.

package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fitData writes an Alpaca file of 20 records whose outputs grow by 5
// bytes each, so that with mini's byte tokenizer their lengths spread
// evenly over about 100 tokens, all within mini's context of 256.
func fitData(t *testing.T) string {
	t.Helper()
	var recs []map[string]string
	for i := range 20 {
		recs = append(recs, map[string]string{"instruction": fmt.Sprintf("Say x%02d.", i), "input": "", "output": strings.Repeat("x", 5*i+1)})
	}
	return tempJSON(t, "fit.json", recs)
}

// TestDataFit runs the command on fitData with a --seq-len that keeps
// one record, one that keeps none, and the --seq-len both errors suggest.
func TestDataFit(t *testing.T) {
	path := fitData(t)
	run := func(args ...string) (int, string) {
		t.Helper()
		args = append([]string{"--model", "mini", "--data", path, "--steps", "1", "--batch", "2", "--eval-generate", "1",
			"--threads", "1", "--out", filepath.Join(t.TempDir(), "out")}, args...)
		code, stdout, stderr := runCmd(t, args...)
		return code, stdout + stderr
	}
	suggested := regexp.MustCompile(`--seq-len (\d+) keeps 90% of them`)

	// The shortest record is about 150 tokens (the template's 140 bytes,
	// the instruction, one output byte and the EOS): --seq-len 150 keeps
	// it alone, 5% of them, and the run refuses.
	code, out := run("--seq-len", "150")
	if code != 1 || !strings.Contains(out, "--seq-len: 19 of 20 examples (95%)") || !strings.Contains(out, "only 1 (5%)") ||
		!strings.Contains(out, "--truncate") {
		t.Fatalf("--seq-len 150: exit %d, want 1 and an error naming the 95%% dropped and --truncate:\n%s", code, out)
	}
	m := suggested.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("--seq-len 150: no --seq-len suggested:\n%s", out)
	}
	seqLen := m[1]

	// When every record is dropped, the error suggests the same length.
	code, out = run("--seq-len", "100")
	if m := suggested.FindStringSubmatch(out); code != 1 || !strings.Contains(out, "all 20 examples dropped") || m == nil || m[1] != seqLen {
		t.Errorf("--seq-len 100: exit %d, want 1 and the all-dropped error suggesting --seq-len %s:\n%s", code, seqLen, out)
	}

	// --truncate trains on the cut records, warning.
	code, out = run("--seq-len", "150", "--truncate")
	if code != 0 || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "19 cut to fit") {
		t.Errorf("--seq-len 150 --truncate: exit %d, want 0 and a warning of the records cut:\n%s", code, out)
	}

	// The suggested length keeps 18 of the 20 and drops 2, saying so,
	// and that the eval set is too small to mean much.
	code, out = run("--seq-len", seqLen)
	for _, w := range []string{"level=WARN", "2 of 20 examples (10%)", "are longer than --seq-len " + seqLen, "eval set holds only 1 example"} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("--seq-len %s: exit %d, want 0 and %q:\n%s", seqLen, code, w, out)
		}
	}
}

// TestBuiltinData: --data builtin trains the default job's task, sort,
// whose examples all fit the default --seq-len, and the summary names the
// task; a builtin task that does not fit says why examples were dropped.
func TestBuiltinData(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := runCmd(t, "--data", "builtin", "--steps", "1", "--batch", "4", "--eval-generate", "1",
		"--threads", "1", "--out", out)
	if code != 0 || !strings.Contains(stderr, `source="builtin:sort `) || strings.Contains(stderr, "level=WARN") ||
		!strings.Contains(stdout, "Trained tiny on builtin:sort: 1 step.") || !strings.Contains(stdout, "-prompt 'sort hello='") {
		t.Errorf("--data builtin: exit %d, want 0, builtin:sort loaded and named, nothing dropped:\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// reverse's longest prompts (3 + 8 letters longer than sort's) do
	// not fit --seq-len 24.
	out = filepath.Join(t.TempDir(), "out")
	code, stdout, stderr = runCmd(t, "--data", "builtin:reverse:300", "--steps", "1", "--batch", "4", "--eval-generate", "1",
		"--threads", "1", "--out", out)
	if code != 0 || !regexp.MustCompile(`level=WARN msg="\d+ of 300 examples \([0-9.]+%\) of --data builtin:reverse:300 are longer than --seq-len 24 \+ 1 tokens and dropped; --seq-len 25 keeps 90% of them`).MatchString(stderr) {
		t.Errorf("--data builtin:reverse:300: exit %d, want 0 and a warning of the examples dropped for --seq-len:\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestExportTokenIDsCommand trains the README's llama-tiny-gqa example
// (no tokenizer files: the byte tokenizer, EOS 256) for a step and checks
// that the export's config.json names the tokenizer's EOS, not the
// checkpoint's 2, and no BOS or pad, which the byte tokenizer has not.
func TestExportTokenIDsCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := runCmd(t, "--model", "../../train/testdata/llama-tiny-gqa", "--steps", "1", "--batch", "2",
		"--eval-generate", "1", "--threads", "1", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	raw := readFile(t, out, "hf", "config.json")
	var c struct {
		BOS *int32 `json:"bos_token_id"`
		EOS *int32 `json:"eos_token_id"`
		PAD *int32 `json:"pad_token_id"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if c.EOS == nil || *c.EOS != 256 || c.BOS != nil || c.PAD != nil {
		t.Errorf("hf/config.json: bos_token_id %v, eos_token_id %v, pad_token_id %v; want null, 256 (the byte tokenizer's EOS), null:\n%s",
			show(c.BOS), show(c.EOS), show(c.PAD), raw)
	}
}

func show(p *int32) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// TestLSPDefaultD: the default job in lsp mode uses a d that compresses
// tiny's matrices (32, a quarter of their 128-wide side) and the log
// gives each matrix shape's d and r; a --d above the side is said to be
// capped there, compressing nothing.
func TestLSPDefaultD(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want, not []string
	}{
		{nil, []string{`msg="lsp projectors" matrices="128x384 d=32 r=16 (qkv, x4); 128x128 d=32 r=16 (proj, x4); 128x512 d=32 r=16 (fc, x4); 512x128 d=32 r=16 (fcproj, x4)" s_of_gradient=2.1%`},
			[]string{"capped", "d=512"}},
		{[]string{"--d", "512"}, []string{"128x128 d=128 r=16 (proj, x4) capped at the matrix's side from --d 512: the subspace is the whole side, which compresses nothing", "s_of_gradient=33.3%"}, nil},
	} {
		args := append([]string{"--mode", "lsp", "--steps", "1", "--batch", "4", "--eval-generate", "1", "--threads", "1",
			"--out", filepath.Join(t.TempDir(), "out")}, tc.args...)
		code, stdout, stderr := runCmd(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", tc.args, code, stdout, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: the log lacks %q:\n%s", tc.args, w, stderr)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(stderr, w) {
				t.Errorf("%v: the log says %q:\n%s", tc.args, w, stderr)
			}
		}
	}
}
