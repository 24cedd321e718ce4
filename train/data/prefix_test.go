// A tokenizer that puts BOS before a text (Llama-2's add_bos_token) gets
// it before every example's prompt, counted in the prompt, and once at the
// start of a plain-text document; the byte tokenizer gets nothing.

package data

import (
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

func TestTokenizerPrefix(t *testing.T) {
	llama2, err := tokenizer.Open("../tokenizer/testdata/llama2")
	if err != nil {
		t.Fatal(err)
	}
	bos := tokenizer.Prefix(llama2)
	if len(bos) != 1 {
		t.Fatalf("the llama2 fixture's prefix is %v, want its BOS", bos)
	}
	rec := Record{Prompt: "Reverse: abc\n", Response: "cba"}
	ds, err := FromRecords([]Record{rec}, llama2, Options{SeqLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	ex := ds.Train[0]
	p, q := llama2.Encode(rec.Prompt), llama2.Encode(rec.Response)
	want := slices.Concat(bos, p, q, []int32{llama2.EOS()})
	if !slices.Equal(ex.Tokens, want) || ex.PromptLen != 1+len(p) {
		t.Errorf("example %v (prompt %d), want %v (prompt %d)", ex.Tokens, ex.PromptLen, want, 1+len(p))
	}

	text := writeFile(t, "doc.txt", "Hello world. The quick brown fox jumps over the lazy dog.")
	ds, err = Load(text, llama2, Options{SeqLen: 8})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Train[0].Tokens[0] != bos[0] || slices.Contains(ds.Train[1].Tokens[1:], bos[0]) {
		t.Errorf("plain text: BOS not once at the start: %v, %v", ds.Train[0].Tokens, ds.Train[1].Tokens)
	}

	ds, err = FromRecords([]Record{rec}, tokenizer.Byte(), Options{SeqLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	if got := ds.Train[0].Tokens[:ds.Train[0].PromptLen]; tokenizer.Byte().Decode(got) != rec.Prompt {
		t.Errorf("byte tokenizer: prompt ids %v are not the prompt's bytes", got)
	}
}
