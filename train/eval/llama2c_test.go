package eval

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSampleLlama2C: sample from a llama2.c .bin (its tokenizer.bin
// beside it) gives transformers' greedy ids on the HF twin of the
// weights, with the cache and without, the prompt encoded as run.c
// encodes it (BOS first) and generation stopping where transformers'
// does (EOS or BOS, as run.c).
func TestSampleLlama2C(t *testing.T) {
	dir := "../testdata/llama2c"
	raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Models map[string]struct {
			File   string `json:"file"`
			Greedy struct {
				Prompt    string  `json:"prompt_text"`
				PromptIDs []int32 `json:"prompt_ids"`
				MaxNew    int     `json:"max_new_tokens"`
				IDs       []int32 `json:"ids"`
			} `json:"greedy"`
		} `json:"models"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	for name, m := range ref.Models {
		for _, noCache := range []bool{false, true} {
			res, err := Sample(SampleOptions{Model: filepath.Join(dir, m.File), Prompt: m.Greedy.Prompt,
				MaxNew: m.Greedy.MaxNew, NoCache: noCache, Threads: 1})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if res.PromptTokens != len(m.Greedy.PromptIDs) {
				t.Errorf("%s: %d prompt tokens, want %d", name, res.PromptTokens, len(m.Greedy.PromptIDs))
			}
			if !slices.Equal(res.IDs, m.Greedy.IDs) {
				t.Errorf("%s (no-cache %v): ids %v, transformers %v", name, noCache, res.IDs, m.Greedy.IDs)
			}
		}
	}
	// Without a tokenizer.bin beside it, the model needs --tokenizer.
	tmp := t.TempDir()
	b, err := os.ReadFile(filepath.Join(dir, "tied.bin"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(tmp, "model.bin")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Sample(SampleOptions{Model: p, Prompt: "hi", MaxNew: 2}); err == nil {
		t.Error("a .bin without a tokenizer: no error")
	}
	if _, err := Sample(SampleOptions{Model: p, Tokenizer: filepath.Join(dir, "tokenizer.bin"), Prompt: "hi", MaxNew: 2}); err != nil {
		t.Errorf("with --tokenizer: %v", err)
	}
}
