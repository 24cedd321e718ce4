// Tests of the tokenizers read from files against the encodings the
// tokenizers library and transformers gave for the same files
// (testdata/reference.json, by scripts/fixtures/make_tokenizers.py).

package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type refCase struct {
	Text       string  `json:"text"`
	IDs        []int32 `json:"ids"`
	IDsSpecial []int32 `json:"ids_special"`
	Decoded    string  `json:"decoded"`
}

type refTokenizer struct {
	BOS       *int32    `json:"bos_id"`
	EOS       int32     `json:"eos_id"`
	VocabSize int       `json:"vocab_size"`
	Cases     []refCase `json:"cases"`
}

func readReference(t *testing.T) map[string]refTokenizer {
	t.Helper()
	raw, err := os.ReadFile("testdata/reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Tokenizers map[string]refTokenizer `json:"tokenizers"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Tokenizers) != 7 {
		t.Fatalf("reference.json has %d tokenizers, want 7", len(ref.Tokenizers))
	}
	return ref.Tokenizers
}

func TestReferenceEncodings(t *testing.T) {
	for name, ref := range readReference(t) {
		t.Run(name, func(t *testing.T) {
			tok, err := Open(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			if tok.EOS() != ref.EOS || tok.VocabSize() != ref.VocabSize {
				t.Errorf("EOS %d, vocabulary %d; want %d, %d", tok.EOS(), tok.VocabSize(), ref.EOS, ref.VocabSize)
			}
			for _, c := range ref.Cases {
				got := tok.Encode(c.Text)
				if !slices.Equal(got, c.IDs) {
					t.Errorf("Encode(%q)\n got %v\nwant %v", c.Text, got, c.IDs)
					continue
				}
				// transformers' encode with special tokens: our BOS rule.
				if framed := append(Prefix(tok), got...); !slices.Equal(framed, c.IDsSpecial) {
					t.Errorf("Prefix+Encode(%q) = %v, transformers gave %v", c.Text, framed, c.IDsSpecial)
				}
				if dec := tok.Decode(got); dec != c.Decoded {
					t.Errorf("Decode(Encode(%q)) = %q, the library decodes %q", c.Text, dec, c.Decoded)
				}
			}
		})
	}
}

// Where the library gives the text back, so must we: decode(encode(x)) == x
// on the reference texts (the byte-level ones round-trip every text
// without BOS/EOS; the SentencePiece-style one every text but those with
// leading or doubled spaces that the normalizer's prepend makes ambiguous).
func TestFileRoundTrip(t *testing.T) {
	n := 0
	for name, ref := range readReference(t) {
		tok, err := Open(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range ref.Cases {
			if c.Decoded != c.Text {
				continue
			}
			n++
			if got := tok.Decode(tok.Encode(c.Text)); got != c.Text {
				t.Errorf("%s: Decode(Encode(%q)) = %q", name, c.Text, got)
			}
		}
	}
	if n < 30 {
		t.Errorf("only %d reference texts round-trip in the library; the fixtures lost their point", n)
	}
}

func TestSpecialRules(t *testing.T) {
	llama3, err := Open("testdata/llama3")
	if err != nil {
		t.Fatal(err)
	}
	// generation_config.json lists <|end_of_text|> and <|eot_id|>.
	if got := StopIDs(llama3); !slices.Equal(got, []int32{1, 4}) {
		t.Errorf("llama3 StopIDs = %v, want [1 4]", got)
	}
	if got := Prefix(llama3); !slices.Equal(got, []int32{0}) {
		t.Errorf("llama3 Prefix = %v, want [0] (the post-processor's template)", got)
	}
	bl, err := Open("testdata/bytelevel/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	if Prefix(bl) != nil || !slices.Equal(StopIDs(bl), []int32{0}) {
		t.Errorf("bytelevel: Prefix %v, StopIDs %v; want none, [0]", Prefix(bl), StopIDs(bl))
	}
	if Prefix(Byte()) != nil || !slices.Equal(StopIDs(Byte()), []int32{256}) {
		t.Error("byte: a prefix, or a stop id other than 256")
	}
}

// tokenizer_config.json as older Llama-2 files write it: special tokens
// as AddedToken objects; and a BOS rule naming no BOS is an error.
func TestTokenizerConfigForms(t *testing.T) {
	raw, err := os.ReadFile("testdata/llama2/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	write := func(cfg string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	tok, err := Open(write(`{"add_bos_token": true, "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
		"eos_token": {"__type": "AddedToken", "content": "</s>"}, "unk_token": null}`))
	if err != nil || tok.EOS() != 2 || !slices.Equal(Prefix(tok), []int32{1}) {
		t.Fatalf("object-form tokens: %v, EOS %v, prefix %v", err, tok, Prefix(tok))
	}
	// add_bos_token false overrides the template's BOS.
	if tok, err := Open(write(`{"add_bos_token": false, "eos_token": "</s>"}`)); err != nil || Prefix(tok) != nil {
		t.Errorf("add_bos_token false: %v, prefix %v", err, Prefix(tok))
	}
	dir := write(`{"eos_token": "<nonesuch>"}`)
	_, err = Open(dir)
	if err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") || !strings.Contains(err.Error(), "<nonesuch>") {
		t.Errorf("an eos_token that is no token: %v", err)
	}
}

func TestUnsupportedTokenizer(t *testing.T) {
	_, err := Open("testdata/unigram.json")
	if err == nil {
		t.Fatal("a Unigram tokenizer.json loaded")
	}
	for _, want := range []string{"unigram.json", "model.type", `"Unigram"`, "BPE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	dir := t.TempDir()
	bad := map[string]string{
		"wordpiece":  `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`,
		"normalizer": `{"normalizer": {"type": "BertNormalizer"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`,
		"pretok":     `{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`,
		"merge":      `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}`,
		"unk":        `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"}}`,
	}
	wantField := map[string]string{
		"wordpiece": `model.type "WordPiece"`, "normalizer": `normalizer.type "BertNormalizer"`,
		"pretok": `pre_tokenizer.pretokenizers[0].type "Whitespace"`, "merge": "model.merges[0]", "unk": "model.unk_token",
	}
	for name, text := range bad {
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(p)
		if err == nil || !strings.Contains(err.Error(), wantField[name]) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v, want one naming %s and %s", name, err, p, wantField[name])
		}
	}
	// No EOS anywhere: the tokenizer cannot end an example.
	p := filepath.Join(dir, "noeos.json")
	if err := os.WriteFile(p, []byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(p); err == nil || !strings.Contains(err.Error(), "end-of-sequence") {
		t.Errorf("no EOS: error %v", err)
	}
}

// Save writes a tokenizer that Open reads back and that encodes as the
// original: the builtin byte and GPT-2 tokenizers, and a file tokenizer.
func TestSaveLoadsBack(t *testing.T) {
	gpt2 := mustGPT2(t)
	bl, err := Open("testdata/llama2")
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"Hello world! It's 2024: 12345 naïve café 日本語 🦀👩‍👩‍👧", "  runs   of\tspaces \n\n\r\nend ", "The quick brown fox. " + strings.Repeat("x", 70)}
	for _, tok := range []Tokenizer{Byte(), gpt2, bl} {
		dir := t.TempDir()
		names, err := Save(tok, dir)
		if err != nil {
			t.Fatalf("%s: %v", tok.Name(), err)
		}
		if !slices.Contains(names, "tokenizer_config.json") {
			t.Errorf("%s: Save wrote %v, no tokenizer_config.json", tok.Name(), names)
		}
		back, err := Open(dir)
		if err != nil {
			t.Fatalf("%s: reading back: %v", tok.Name(), err)
		}
		if tok.Name() == "byte" {
			if back.Name() != "byte" {
				t.Errorf("the byte tokenizer's file reads back as %s", back.Name())
			}
			// Edited, it goes through the general reader: the same ids.
			p := filepath.Join(dir, "tokenizer.json")
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, append(raw, ' '), 0o644); err != nil {
				t.Fatal(err)
			}
			if back, err = Open(dir); err != nil || back.Name() != p {
				t.Fatalf("edited byte tokenizer.json: %v, %v", back, err)
			}
		}
		if back.EOS() != tok.EOS() || back.VocabSize() != tok.VocabSize() || !slices.Equal(Prefix(back), Prefix(tok)) {
			t.Errorf("%s: read back with EOS %d vocabulary %d prefix %v; want %d %d %v", tok.Name(),
				back.EOS(), back.VocabSize(), Prefix(back), tok.EOS(), tok.VocabSize(), Prefix(tok))
		}
		for _, s := range texts {
			want, got := tok.Encode(s), back.Encode(s)
			if !slices.Equal(got, want) {
				t.Errorf("%s: read back, Encode(%q) = %v, want %v", tok.Name(), s, got, want)
			}
			if back.Decode(got) != tok.Decode(want) {
				t.Errorf("%s: read back, Decode gives %q, want %q", tok.Name(), back.Decode(got), tok.Decode(want))
			}
		}
	}
}

// Long text without a pre-tokenizer is one word to the BPE model: the
// merge queue keeps it fast, and the ids are those of its parts' merges.
func BenchmarkLlama2Encode(b *testing.B) { benchmarkEncode(b, "testdata/llama2") }

func BenchmarkByteLevelFileEncode(b *testing.B) { benchmarkEncode(b, "testdata/llama3") }

// benchmarkEncode times the tokenizer in dir on a long mixed-script text.
func benchmarkEncode(b *testing.B, dir string) {
	tok, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; naïve café 123. ", 2000)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
}
