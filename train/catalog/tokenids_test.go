// The exported config.json carries the bos, eos and pad ids of the
// tokenizer the model was trained with, so transformers' generate stops
// where lsp-train sample does.

package catalog

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// exportedIDs reads bos_token_id, eos_token_id (one id, or the first of
// a list, which must hold eos) and pad_token_id of dir/name, -1 for null.
func exportedIDs(t *testing.T, dir, name string, eos int32) (int32, int32, int32) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		BOS, PAD *int32
		EOS      json.RawMessage
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for key, v := range map[string]**int32{"bos_token_id": &c.BOS, "pad_token_id": &c.PAD} {
		if err := json.Unmarshal(m[key], v); m[key] != nil && err != nil {
			t.Fatalf("%s: %s: %v", name, key, err)
		}
	}
	id := func(p *int32) int32 {
		if p == nil {
			return -1
		}
		return *p
	}
	var one *int32
	var list []int32
	if json.Unmarshal(m["eos_token_id"], &one) != nil {
		if err := json.Unmarshal(m["eos_token_id"], &list); err != nil {
			t.Fatalf("%s: eos_token_id %s", name, m["eos_token_id"])
		}
		if slices.Contains(list, eos) {
			return id(c.BOS), eos, id(c.PAD)
		}
		return id(c.BOS), list[0], id(c.PAD)
	}
	return id(c.BOS), id(one), id(c.PAD)
}

// TestExportTokenIDs exports presets and checkpoints with their own or
// another tokenizer and compares the ids of config.json (and of
// generation_config.json, where written) with the tokenizer's, and with
// those of the tokenizer read back from the export. LSP_TOKEN_IDS_DIR=DIR
// keeps the exports under DIR for transformers to check
// (scripts/fixtures/check_token_ids.py).
func TestExportTokenIDs(t *testing.T) {
	type tc struct {
		name, model, src string
		tok              func(t *testing.T, src string) tokenizer.Tokenizer
	}
	// The model's own tokenizer, as a run resolves it: the byte one for
	// tiny and for llama-tiny-gqa, whose directory has no tokenizer files
	// (the README's example), else its directory's files.
	own := func(t *testing.T, src string) tokenizer.Tokenizer { return nil }
	cases := []tc{
		{"tiny preset", "tiny", "", own},
		{"llama-tiny-gqa (README)", "../testdata/llama-tiny-gqa", "", own},
		{"llama-tiny-gqa with --tokenizer gpt2", "../testdata/llama-tiny-gqa", "", func(t *testing.T, _ string) tokenizer.Tokenizer {
			tok, err := tokenizer.GPT2()
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}},
	}
	// A checkpoint directory holding its own tokenizer files: the fixture
	// tokenizers beside llama-tiny-gqa's config.json (the qwen2 one beside
	// qwen2-tiny-gqa's: no BOS, the pad token the EOS).
	for _, name := range []string{"llama2", "llama3", "smollm", "metaspace", "bytelevel", "qwen2"} {
		cases = append(cases, tc{"checkpoint with the " + name + " tokenizer", "", name, own})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			model := c.model
			if c.src != "" {
				model = t.TempDir()
				files, _ := filepath.Glob(filepath.Join("../tokenizer/testdata", c.src, "*"))
				cfg := "../testdata/llama-tiny-gqa/config.json"
				if c.src == "qwen2" {
					cfg = "../testdata/qwen2-tiny-gqa/config.json"
				}
				files = append(files, cfg)
				for _, f := range files {
					raw, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(model, filepath.Base(f)), raw, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			spec, src, err := Resolve(model)
			if err != nil {
				t.Fatal(err)
			}
			tok := c.tok(t, src)
			if tok == nil {
				if c.src != "" {
					tok, err = tokenizer.Open(src) // the vocabularies differ from the model's: not Tokenizer's check
				} else {
					tok, err = Tokenizer(spec, src, "")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			dir := filepath.Join(t.TempDir(), "hf")
			if keep := os.Getenv("LSP_TOKEN_IDS_DIR"); keep != "" {
				// For scripts/fixtures/check_token_ids.py (export-checks.md).
				dir = filepath.Join(keep, strings.NewReplacer(" ", "_", "(", "", ")", "", "--", "").Replace(c.name))
			}
			if err := Export(spec, dir, spec.Init(3), src, tok); err != nil {
				t.Fatal(err)
			}
			bos, eos, pad := tokenizer.SpecialIDs(tok)
			saved, err := tokenizer.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			sb, se, sp := tokenizer.SpecialIDs(saved)
			if sb != bos || se != eos || sp != pad {
				t.Errorf("the exported tokenizer has bos %d eos %d pad %d; the trained one %d %d %d", sb, se, sp, bos, eos, pad)
			}
			names := []string{"config.json"}
			if _, err := os.Stat(filepath.Join(dir, "generation_config.json")); err == nil {
				names = append(names, "generation_config.json")
			}
			for _, name := range names {
				b, e, p := exportedIDs(t, dir, name, eos)
				if b != bos || e != eos || (name == "config.json" && p != pad) {
					t.Errorf("%s: bos_token_id %d, eos_token_id %d, pad_token_id %d; the tokenizer's are %d, %d, %d (-1: none)",
						name, b, e, p, bos, eos, pad)
				}
			}
		})
	}
}
