// Fuzzing of the tokenizer.json reader, on the file a user's checkpoint
// brings: any bytes either fail with an error or give a tokenizer whose
// ids lie in its vocabulary and whose Decode takes any ids; none panics.
// And on the text a user trains on: the byte-level fixture gives every
// text back (unless it spells one of its added tokens, which are matched).

package tokenizer

import (
	"os"
	"strings"
	"testing"
)

var fuzzProbe = []string{"Hello <s> wörld</s> 12 345 🦀 \n\n  x<|endoftext|>", "", "\xff<0x41>▁a"}

func FuzzTokenizerJSON(f *testing.F) {
	for _, p := range []string{"testdata/bytelevel/tokenizer.json", "testdata/llama3/tokenizer.json", "testdata/llama2/tokenizer.json", "testdata/unigram.json"} {
		raw, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]], "byte_fallback": true},
		"added_tokens": [{"id": 3, "content": "<x>", "lstrip": true, "rstrip": true, "single_word": true, "normalized": true}],
		"normalizer": {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": "▁"},
		"pre_tokenizer": {"type": "Split", "pattern": {"String": "▁"}, "behavior": "MergedWithNext", "invert": true},
		"decoder": {"type": "Metaspace"}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		tok, err := parseTokenizerJSON(raw)
		if err != nil {
			return
		}
		for _, s := range fuzzProbe {
			ids := tok.Encode(s)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("Encode(%q) gave id %d outside the vocabulary of %d", s, id, tok.VocabSize())
				}
			}
			tok.Decode(ids)
			tok.Decode([]int32{-1, 0, 1, int32(tok.VocabSize()), 1 << 30})
		}
	})
}

func FuzzFileEncode(f *testing.F) {
	for _, s := range textSeeds {
		f.Add(s)
	}
	tok, err := Open("testdata/bytelevel")
	if err != nil {
		f.Fatal(err)
	}
	ft := tok.(*fileTokenizer)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		for _, id := range ids {
			if id < 0 || int(id) >= tok.VocabSize() {
				t.Fatalf("Encode(%q) gave id %d", s, id)
			}
		}
		for _, a := range ft.raw.tokens {
			if strings.Contains(s, a.Content) {
				return
			}
		}
		if got, want := tok.Decode(ids), string([]rune(s)); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, got, want)
		}
	})
}
