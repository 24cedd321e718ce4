// Tests of --eval-data and conversation data through the command (issue
// 42), each as a child process: a held-out chat file evaluated beside
// training data of another format, a run on conversations, and the
// refusals (with --eval-fraction, a malformed file) naming the flag, the
// file, the record and the field.

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chatJSONL writes n short OpenAI-style conversations.
func chatJSONL(t *testing.T, name string, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		q := string(rune('a' + i%26))
		b.WriteString(`{"messages": [{"role": "user", "content": "` + q + `"}, {"role": "assistant", "content": "` + q + q + `"}]}` + "\n")
	}
	return tempFile(t, name, []byte(b.String()))
}

// chatRun is a run of the tiny preset long enough for a conversation.
func chatRun(out string) []string {
	return []string{"--model", "tiny", "--steps", "1", "--batch", "4", "--seq-len", "64", "--threads", "1",
		"--eval-every", "0", "--eval-generate", "2", "--eval-max-new", "4", "--checkpoint-every", "0", "--out", out}
}

func TestEvalData(t *testing.T) {
	evalFile := chatJSONL(t, "held-out.jsonl", 6)
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := execCmd(t, "", append(chatRun(out), "--data", "builtin:copy:200", "--eval-data", evalFile)...)
	if code != 0 {
		t.Fatalf("--eval-data: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// The whole of --data trains (no split), the file is the eval set.
	for _, want := range []string{"train=200 eval=0", "msg=\"eval data\" source=\"messages JSONL " + evalFile + " (6 records)\" eval=6",
		"exact_match_prompts=2"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the log does not say %q:\n%s", want, stderr)
		}
	}
	raw, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil || !strings.Contains(string(raw), `"eval_loss"`) || !strings.Contains(string(raw), `"eval_exact_match"`) {
		t.Errorf("metrics.jsonl has no eval loss and exact match (%v):\n%s", err, raw)
	}

	// Training on conversations, with the split.
	code, stdout, stderr = execCmd(t, "", append(chatRun(filepath.Join(t.TempDir(), "out")), "--data", chatJSONL(t, "train.jsonl", 40))...)
	if code != 0 || !strings.Contains(stderr, "train=38 eval=2") {
		t.Errorf("--data of conversations: exit %d, want 0 and 38 + 2 examples\n%s\n%s", code, stdout, stderr)
	}

	// Both held-out sets, a malformed file, an empty name: refused, naming
	// the flag (and the file, record, line and field).
	bad := tempFile(t, "bad.jsonl", []byte(`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}`+"\n"+
		`{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}`+"\n"))
	cfgFile := writeJSON(t, `{"eval_fraction": 0.2}`)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--eval-data", evalFile, "--config", cfgFile}, []string{"--eval-fraction", "0.2 contradicts --eval-data"}},
		{[]string{"--eval-data", evalFile, "--eval-fraction", "0.1"}, []string{"--eval-fraction", "contradicts --eval-data"}},
		{[]string{"--eval-data", evalFile, "--eval-fraction", "0"}, []string{"--eval-fraction", "contradicts --eval-data"}},
		{[]string{"--eval-data", bad}, []string{"--eval-data", bad, "record 1 (line 2)", "messages turn 1", `field "role" is "tool"`}},
		{[]string{"--eval-data", ""}, []string{"--eval-data", "is empty"}},
		{[]string{"--eval-data", filepath.Join(t.TempDir(), "missing.jsonl")}, []string{"--eval-data", "missing.jsonl"}},
	} {
		code, _, stderr := execCmd(t, "", append(chatRun(filepath.Join(t.TempDir(), "out")), tc.args...)...)
		if code != 1 {
			t.Errorf("%v: exit %d, want 1\n%s", tc.args, code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr does not say %q:\n%s", tc.args, w, stderr)
			}
		}
	}

	// -h names the flag and what it excludes.
	_, _, help := execCmd(t, "", "-h")
	if help = strings.Join(strings.Fields(help), " "); !strings.Contains(help, "--eval-data FILE the held-out FILE") ||
		!strings.Contains(help, "instead of a --eval-fraction share of --data (not both)") || !strings.Contains(help, "ShareGPT") {
		t.Errorf("-h does not describe --eval-data:\n%s", help)
	}
}
