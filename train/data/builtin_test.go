// Tests for the synthetic tasks: correct answers, determinism for a seed,
// distinct prompts, and argument errors.

package data

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestBuiltinAnswers(t *testing.T) {
	check := map[string]func(t *testing.T, r Record){
		"reverse": lettersTask("reverse ", slices.Reverse[[]byte]),
		"sort":    lettersTask("sort ", slices.Sort[[]byte]),
		"copy":    lettersTask("copy ", func([]byte) {}),
		"add": func(t *testing.T, r Record) {
			a, b, ok := strings.Cut(strings.TrimSuffix(r.Prompt, "="), "+")
			x, err1 := strconv.Atoi(a)
			y, err2 := strconv.Atoi(b)
			if !ok || err1 != nil || err2 != nil || x < 0 || x > 999 || y < 0 || y > 999 || !strings.HasSuffix(r.Prompt, "=") {
				t.Fatalf("bad add prompt %q", r.Prompt)
			}
			if r.Response != strconv.Itoa(x+y) {
				t.Errorf("%q -> %q", r.Prompt, r.Response)
			}
		},
	}
	if got := BuiltinTasks(); !slices.Equal(got, []string{"add", "copy", "reverse", "sort"}) {
		t.Fatalf("BuiltinTasks() = %v", got)
	}
	for _, task := range BuiltinTasks() {
		recs, err := Builtin(task, 500, 3)
		if err != nil {
			t.Fatalf("Builtin(%s): %v", task, err)
		}
		if len(recs) != 500 {
			t.Fatalf("Builtin(%s) gave %d records", task, len(recs))
		}
		seen := map[string]bool{}
		for _, r := range recs {
			if seen[r.Prompt] {
				t.Fatalf("%s: duplicate prompt %q", task, r.Prompt)
			}
			seen[r.Prompt] = true
			check[task](t, r)
		}
	}
}

// lettersTask checks a record of the task whose prompts are "<verb>
// <letters>=": the response is the letters after op.
func lettersTask(verb string, op func([]byte)) func(*testing.T, Record) {
	return func(t *testing.T, r Record) {
		b := []byte(cutPrompt(t, r.Prompt, verb))
		op(b)
		if r.Response != string(b) {
			t.Errorf("%q -> %q", r.Prompt, r.Response)
		}
	}
}

// cutPrompt returns the letters of "<verb> <letters>=", checking the shape.
func cutPrompt(t *testing.T, p, verb string) string {
	t.Helper()
	s, ok := strings.CutPrefix(p, verb)
	if !ok || !strings.HasSuffix(s, "=") {
		t.Fatalf("bad prompt %q", p)
	}
	s = strings.TrimSuffix(s, "=")
	if len(s) < 3 || len(s) > 8 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz") != "" {
		t.Fatalf("bad letters %q in %q", s, p)
	}
	return s
}

func TestBuiltinDeterministic(t *testing.T) {
	for _, task := range BuiltinTasks() {
		a, _ := Builtin(task, 300, 42)
		b, _ := Builtin(task, 300, 42)
		if !slices.Equal(a, b) {
			t.Errorf("%s: two calls with seed 42 differ", task)
		}
		short, _ := Builtin(task, 100, 42)
		if !slices.Equal(short, a[:100]) {
			t.Errorf("%s: the first 100 of 300 differ from a call for 100", task)
		}
		c, _ := Builtin(task, 300, 43)
		if slices.Equal(a, c) {
			t.Errorf("%s: seeds 42 and 43 give the same records", task)
		}
	}
	// Tasks draw from separate streams: the same seed gives unrelated strings.
	r, _ := Builtin("reverse", 5, 1)
	c, _ := Builtin("copy", 5, 1)
	if strings.TrimPrefix(r[0].Prompt, "reverse ") == strings.TrimPrefix(c[0].Prompt, "copy ") {
		t.Errorf("reverse and copy share their draws: %q %q", r[0].Prompt, c[0].Prompt)
	}
}

func TestBuiltinErrors(t *testing.T) {
	tests := []struct {
		task string
		n    int
		want string
	}{
		{"rot13", 10, "add, copy, reverse, sort"},
		{"add", 0, "at least 1"},
		{"sort", -5, "at least 1"},
	}
	for _, tc := range tests {
		_, err := Builtin(tc.task, tc.n, 1)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Builtin(%q, %d) error %v, want it to mention %q", tc.task, tc.n, err, tc.want)
		}
	}
}
