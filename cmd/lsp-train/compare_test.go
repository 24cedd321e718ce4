// Tests of the compare subcommand's argument handling: every bad value is
// refused before anything runs, naming its flag; -h prints the usage.

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCompareCommandErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"d above tiny's bound", []string{"--d", "64"}, []string{"--d:", "64", "min(m, n)/4"}},
		{"d too small", []string{"--d", "2", "--r", "1"}, []string{"--d:"}},
		{"r above d/4", []string{"--d", "16", "--r", "8"}, []string{"--r:", "d/4 = 4"}},
		{"same task twice", []string{"--task", "builtin:sort"}, []string{"--task:", "--pretrain-task"}},
		{"task not builtin", []string{"--task", "data.txt"}, []string{"--task:", "data.txt"}},
		{"bad pretrain task", []string{"--pretrain-task", "builtin:nope"}, []string{"--pretrain-task:", "nope"}},
		{"steps 0", []string{"--steps", "0"}, []string{"--steps:"}},
		{"pretrain steps 0", []string{"--pretrain-steps", "0"}, []string{"--pretrain-steps:"}},
		{"timing steps 0", []string{"--timing-steps", "0"}, []string{"--timing-steps:"}},
		{"negative threads", []string{"--threads", "-2"}, []string{"--threads:"}},
		{"bad bandwidth", []string{"--link-bandwidth", "fast"}, []string{"link-bandwidth", "fast"}},
		{"unknown flag", []string{"--mode", "lsp"}, []string{"mode"}},
		{"positional argument", []string{"now"}, []string{`"now"`}},
		{"two errors at once", []string{"--steps", "0", "--r", "9"}, []string{"--steps:", "--r:"}},
		{"report without a finished job", []string{"--report"}, []string{"--out:", "compare.json"}},
		{"unknown row", []string{"--rows", "native,lsp-sparse"}, []string{"--rows:", "lsp-sparse", "lsp-svd-em"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "cmp")
			code, stdout, stderr := runCmd(t, append([]string{"compare", "--out", out}, tc.args...)...)
			if code != 1 || stdout != "" {
				t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			if !strings.HasPrefix(stderr, "lsp-train compare:") && !strings.Contains(stderr, "Usage: lsp-train compare") {
				t.Errorf("stderr does not say which command failed:\n%s", stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, stderr)
				}
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("a refused compare created %s", out)
			}
		})
	}
}

func TestCompareHelp(t *testing.T) {
	code, stdout, stderr := runCmd(t, "compare", "-h")
	if code != 0 || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want 0 and the usage on stderr", code, stdout)
	}
	for _, f := range []string{"Usage: lsp-train compare", "lsp-recovery", "-steps", "-pretrain-steps", "-task",
		"-pretrain-task", "-d", "-r", "-link-bandwidth", "-timing-steps", "-threads", "-seed", "-out"} {
		if !strings.Contains(stderr, f) {
			t.Errorf("usage does not mention %s:\n%s", f, stderr)
		}
	}
}
