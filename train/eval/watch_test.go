package eval

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// TestWatch: Loss and ExactMatch report each batch (or group of B
// prompts) to Progress, from 0 to the total; a context cancelled after
// the second stops them there with its error, and a watched evaluation
// gives the unwatched figures.
func TestWatch(t *testing.T) {
	mc := microConfig(16, 1)
	be, m := cpuModel(t, mc, gpt2.Init(mc, 1), 2, 8)
	s := be.DefaultStream()
	tok := tokenizer.Byte()
	var exs []data.Example
	var recs []data.Record
	for _, p := range []string{"ab=", "cd=", "ef=", "gh=", "ij="} { // 3 batches of 2
		exs = append(exs, data.Example{Tokens: tok.Encode(p + "x"), PromptLen: len(p)})
		recs = append(recs, data.Record{Prompt: p, Response: "x"})
	}
	plain, err := Loss(be, s, m, exs, Watch{})
	if err != nil || math.IsNaN(plain) {
		t.Fatalf("Loss = %v, %v", plain, err)
	}
	var seen []int
	follow := Watch{Progress: func(done, total int) {
		if total != 3 {
			t.Errorf("total %d, want 3 batches", total)
		}
		seen = append(seen, done)
	}}
	if l, err := Loss(be, s, m, exs, follow); err != nil || l != plain {
		t.Errorf("watched Loss = %v, %v; want %v", l, err, plain)
	}
	if len(seen) != 4 || seen[0] != 0 || seen[3] != 3 {
		t.Errorf("Loss progress %v, want 0 1 2 3", seen)
	}
	em, err := ExactMatch(be, s, m, tok, recs, Watch{})
	if err != nil {
		t.Fatal(err)
	}
	seen = nil
	if e, err := ExactMatch(be, s, m, tok, recs, follow); err != nil || e != em {
		t.Errorf("watched ExactMatch = %v, %v; want %v", e, err, em)
	}
	if len(seen) != 4 {
		t.Errorf("ExactMatch progress %v, want 0 1 2 3", seen)
	}

	for name, run := range map[string]func(Watch) error{
		"Loss":       func(w Watch) error { _, err := Loss(be, s, m, exs, w); return err },
		"ExactMatch": func(w Watch) error { _, err := ExactMatch(be, s, m, tok, recs, w); return err },
	} {
		ctx, cancel := context.WithCancel(context.Background())
		last := -1
		err := run(Watch{Ctx: ctx, Progress: func(done, total int) {
			last = done
			if done == 2 {
				cancel()
			}
		}})
		cancel()
		if !errors.Is(err, context.Canceled) || last != 2 {
			t.Errorf("%s cancelled after 2 batches: err %v, last progress %d; want context.Canceled at 2", name, err, last)
		}
	}
}
