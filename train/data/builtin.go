// builtin.go: synthetic instruction tasks for smoke tests and demos that need
// no data files: reverse, sort or copy a short lowercase string, or add two
// numbers. Prompts are compact ("reverse abc=") so a byte tokenizer keeps
// sequences under 32 tokens. Generation is deterministic for (task, n, seed)
// and every prompt is distinct, so no split can put one prompt in both train
// and eval. Limit: "add" has 10^6 distinct prompts; asking for more fails.

package data

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// DefaultBuiltinTask is the task of the path "builtin": the default job's
// (builtin:sort), whose examples all fit the default --seq-len of 24 with
// a byte tokenizer, where reverse's longest (26 tokens) do not.
const DefaultBuiltinTask = "sort"

// DefaultBuiltinN is the number of records Load generates for a "builtin"
// path that does not give one ("builtin:add:5000" does).
const DefaultBuiltinN = 10000

// builtinGen draws one record of a task.
type builtinGen func(r *rng) Record

var builtinTasks = map[string]builtinGen{
	"reverse": func(r *rng) Record {
		s := letters(r)
		b := []byte(s)
		slices.Reverse(b)
		return Record{Prompt: "reverse " + s + "=", Response: string(b)}
	},
	"sort": func(r *rng) Record {
		s := letters(r)
		b := []byte(s)
		slices.Sort(b)
		return Record{Prompt: "sort " + s + "=", Response: string(b)}
	},
	"copy": func(r *rng) Record {
		s := letters(r)
		return Record{Prompt: "copy " + s + "=", Response: s}
	},
	"add": func(r *rng) Record {
		a, b := number(r), number(r)
		return Record{Prompt: strconv.Itoa(a) + "+" + strconv.Itoa(b) + "=", Response: strconv.Itoa(a + b)}
	},
}

// letters draws 3..8 lowercase letters.
func letters(r *rng) string {
	b := make([]byte, 3+r.intn(6))
	for i := range b {
		b[i] = 'a' + byte(r.intn(26))
	}
	return string(b)
}

// number draws a digit count in 1..3 uniformly, then a number with that many
// digits (0..9, 10..99, 100..999), so short sums are as common as long ones.
func number(r *rng) int {
	switch r.intn(3) {
	case 0:
		return r.intn(10)
	case 1:
		return 10 + r.intn(90)
	default:
		return 100 + r.intn(900)
	}
}

// Name returns the data path as a summary names it: "builtin" spelled
// out as the task it trains ("builtin:sort"), any other path unchanged.
func Name(path string) string {
	if path == "builtin" {
		return "builtin:" + DefaultBuiltinTask
	}
	return path
}

// BuiltinTasks returns the names of the synthetic tasks, sorted.
func BuiltinTasks() []string {
	names := make([]string, 0, len(builtinTasks))
	for name := range builtinTasks {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Builtin generates n records of a synthetic task with distinct prompts,
// deterministically for (task, n, seed): the first k records of a call with
// n > k are the records of the call with k.
func Builtin(task string, n int, seed uint64) ([]Record, error) {
	gen, ok := builtinTasks[task]
	if !ok {
		return nil, fmt.Errorf("data: unknown builtin task %q (valid: %s)", task, strings.Join(BuiltinTasks(), ", "))
	}
	if n < 1 {
		return nil, fmt.Errorf("data: builtin %s: record count %d, want at least 1", task, n)
	}
	r := newRNG(seed, streamOf("builtin:"+task))
	seen := make(map[string]struct{}, n)
	recs := make([]Record, 0, n)
	// Duplicates are redrawn; the budget only bites when n nears the
	// number of distinct prompts, where drawing becomes hopeless.
	for tries := 0; len(recs) < n; tries++ {
		if tries >= 50*n+1000 {
			return nil, fmt.Errorf("data: builtin %s: found only %d distinct prompts of the %d asked for", task, len(recs), n)
		}
		rec := gen(r)
		if _, dup := seen[rec.Prompt]; dup {
			continue
		}
		seen[rec.Prompt] = struct{}{}
		recs = append(recs, rec)
	}
	return recs, nil
}
