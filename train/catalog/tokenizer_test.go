// The tokenizer rule (--tokenizer, else the checkpoint directory's files,
// else the family's builtin), and exports that carry the tokenizer a model
// was trained with.

package catalog

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// tokFixture copies the files of train/tokenizer/testdata/name into a new
// directory (which a test may add model files to) and returns it.
func tokFixture(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("..", "tokenizer", "testdata", name)
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// llamaVocab is the llama-tiny preset with a vocabulary of v ids.
func llamaVocab(t *testing.T, v int) llama.Config {
	t.Helper()
	c, err := llama.Preset("llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.Vocab = v
	return c
}

const sampleText = "Hello world! It's 2024: naïve café 日本語 🦀  two  spaces\n\nend"

func TestTokenizerRule(t *testing.T) {
	llama2 := tokFixture(t, "llama2")
	gpt2files := tokFixture(t, "gpt2files")
	spec := llamaVocab(t, 600)
	ref, err := tokenizer.Open(filepath.Join("..", "tokenizer", "testdata", "llama2"))
	if err != nil {
		t.Fatal(err)
	}

	// The directory's tokenizer.json decides, BOS rule included.
	tok, err := Tokenizer(spec, llama2, "")
	if err != nil {
		t.Fatal(err)
	}
	if tok.Name() != filepath.Join(llama2, "tokenizer.json") || !slices.Equal(tok.Encode(sampleText), ref.Encode(sampleText)) ||
		!slices.Equal(tokenizer.Prefix(tok), []int32{1}) || tok.EOS() != 2 {
		t.Errorf("Tokenizer(llama2 dir) = %s, EOS %d, prefix %v", tok.Name(), tok.EOS(), tokenizer.Prefix(tok))
	}
	// vocab.json + merges.txt when there is no tokenizer.json.
	if tok, err := Tokenizer(spec, gpt2files, ""); err != nil || tok.Name() != filepath.Join(gpt2files, "vocab.json") {
		t.Errorf("Tokenizer(gpt2files dir) = %v, %v", tok, err)
	}
	// --tokenizer wins over the directory: a builtin name, a file, a dir.
	if tok, err := Tokenizer(spec, llama2, "byte"); err != nil || tok.Name() != "byte" {
		t.Errorf("override byte: %v, %v", tok, err)
	}
	if tok, err := Tokenizer(spec, llama2, filepath.Join(gpt2files, "vocab.json")); err != nil || tok.Name() != filepath.Join(gpt2files, "vocab.json") {
		t.Errorf("override vocab.json: %v, %v", tok, err)
	}
	if tok, err := Tokenizer(spec, "", llama2); err != nil || tok.Name() != filepath.Join(llama2, "tokenizer.json") {
		t.Errorf("override dir on a preset: %v, %v", tok, err)
	}
	_, err = Tokenizer(spec, "", filepath.Join(llama2, "nonesuch.json"))
	wantErr(t, err, "nonesuch.json")

	// Without tokenizer files: the family's builtin for the preset.
	if tok, err := Tokenizer(llamaVocab(t, 257), t.TempDir(), ""); err != nil || tok.Name() != "byte" {
		t.Errorf("llama dir without tokenizer files: %v, %v; want byte", tok, err)
	}
	// A model whose vocabulary is smaller than the tokenizer's is refused
	// here, for training and sampling alike, not deep in generation.
	_, err = Tokenizer(llamaVocab(t, 320), llama2, "")
	wantErr(t, err, "vocab_size 320", "560")
	// A GPT-2 of another vocabulary and no tokenizer files: the builtin
	// guess does not fit, and the error says what would.
	odd := micro
	odd.V = 420
	_, err = Tokenizer(odd, t.TempDir(), "")
	wantErr(t, err, "vocab_size 420", "gpt2", "--tokenizer")
	if tok, err := Tokenizer(odd, t.TempDir(), gpt2files); err != nil || tok.VocabSize() != 420 {
		t.Errorf("a GPT-2 of vocabulary 420 with --tokenizer of 420 ids: %v, %v", tok, err)
	}
	// SentencePiece's tokenizer.model alone is named, not guessed around.
	spOnly := t.TempDir()
	p := filepath.Join(spOnly, "tokenizer.model")
	if err := os.WriteFile(p, []byte("\x0a\x05"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Tokenizer(spec, spOnly, "")
	wantErr(t, err, p, "tokenizer.json", "--tokenizer")
	// A broken tokenizer.json is an error naming it, never a fallback.
	bad := tokFixture(t, "llama2")
	if err := os.WriteFile(filepath.Join(bad, "tokenizer.json"), []byte(`{"model": {"type": "Unigram"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Tokenizer(spec, bad, "")
	wantErr(t, err, filepath.Join(bad, "tokenizer.json"), "Unigram")
}

// Every export names its tokenizer: a preset's byte tokenizer as a
// tokenizer.json that reads back to the same ids, a checkpoint's own
// files byte for byte, and an override's files instead of the source's.
func TestExportWritesTokenizer(t *testing.T) {
	// A preset trained with the byte tokenizer.
	dir := filepath.Join(t.TempDir(), "hf")
	if err := Export(micro, dir, micro.Init(1), "", tokenizer.Byte()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("a byte preset's export lacks %s", name)
		}
	}
	back, err := Tokenizer(micro, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := back.Encode(sampleText), tokenizer.Byte().Encode(sampleText); !slices.Equal(got, want) || back.EOS() != 256 || back.Name() != "byte" {
		t.Errorf("the exported byte tokenizer encodes %v (EOS %d), want %v (EOS 256)", got, back.EOS(), want)
	}

	// A checkpoint's own tokenizer: its files, as they were.
	spec := llamaVocab(t, 600)
	src := tokFixture(t, "llama2")
	tok, err := Tokenizer(spec, src, "")
	if err != nil {
		t.Fatal(err)
	}
	out := exportTo(t, spec, spec.Init(1), src, tok)
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		a, _ := os.ReadFile(filepath.Join(src, name))
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || string(a) != string(b) {
			t.Errorf("%s in the export differs from the source's (%v)", name, err)
		}
	}
	again, err := Tokenizer(spec, out, "")
	if err != nil || !slices.Equal(again.Encode(sampleText), tok.Encode(sampleText)) {
		t.Errorf("the export's tokenizer: %v, or other ids", err)
	}

	// --tokenizer on a checkpoint with files of its own: the export holds
	// the tokenizer trained with, not the source's.
	over, err := Tokenizer(spec, src, filepath.Join("..", "tokenizer", "testdata", "bytelevel"))
	if err != nil {
		t.Fatal(err)
	}
	out2 := exportTo(t, spec, spec.Init(1), src, over)
	if _, err := os.Stat(filepath.Join(out2, "generation_config.json")); err == nil {
		t.Error("the export carries the source's generation_config.json, not the override tokenizer's files")
	}
	read, err := Tokenizer(spec, out2, "")
	if err != nil || !slices.Equal(read.Encode(sampleText), over.Encode(sampleText)) {
		t.Errorf("the export's tokenizer is not the override: %v", err)
	}
}
