// Package tokenizer turns text into token ids and back for the trainer.
//
// Two tokenizers are built in: "byte" (each UTF-8 byte is its own id, plus
// one end of sequence id) for tiny models and synthetic tasks, and "gpt2"
// (the r50k byte-level BPE of GPT-2, with its vocabulary compiled into the
// binary, so it works offline). Neither parses special tokens: text that
// spells "<|endoftext|>" is encoded as ordinary characters.
//
// The others are read from a checkpoint's files (file.go): tokenizer.json
// with a BPE model, or GPT-2's vocab.json + merges.txt, with the BOS/EOS
// rules of tokenizer_config.json and generation_config.json. Those match
// their added and special tokens in the text, as transformers does. Save
// writes any of them back as files (save.go).
package tokenizer

import (
	"fmt"
	"slices"
	"strings"
)

// Tokenizer encodes text to token ids and decodes ids back to text.
// Implementations are safe for concurrent use.
type Tokenizer interface {
	// Name is the name ByName accepts ("byte" or "gpt2"), or the path of
	// the file a tokenizer was read from.
	Name() string
	// Encode returns the ids of s, without BOS (see Prefix). The builtin
	// tokenizers never return EOS(); one read from files does where s
	// spells its EOS token.
	Encode(s string) []int32
	// Decode returns the text of ids. EOS (and BOS) and ids outside the
	// vocabulary decode to nothing; it never panics. The result can be
	// invalid UTF-8 when ids cut a multi-byte character.
	Decode(ids []int32) string
	// EOS is the end-of-sequence id appended after every example.
	EOS() int32
	// VocabSize is the number of ids, EOS included: every id is < VocabSize.
	VocabSize() int
}

// names lists the tokenizers ByName knows, in the order errors show them.
var names = []string{"byte", "gpt2"}

// Names returns the names ByName accepts.
func Names() []string { return append([]string(nil), names...) }

// ByName returns the tokenizer called name ("byte" or "gpt2").
func ByName(name string) (Tokenizer, error) {
	switch name {
	case "byte":
		return Byte(), nil
	case "gpt2":
		return GPT2()
	}
	return nil, fmt.Errorf("tokenizer: unknown tokenizer %q (valid: %s)", name, strings.Join(names, ", "))
}

// Prefix returns the ids a text's ids follow when the model sees them:
// the BOS of a tokenizer whose configuration adds one (Llama's
// add_bos_token), else none. Training and sampling both put it first.
func Prefix(tok Tokenizer) []int32 {
	switch t := tok.(type) {
	case *fileTokenizer:
		if t.addBOS {
			return []int32{t.bos}
		}
	case *scoreTokenizer:
		return []int32{l2cBOS} // run.c's encode with bos=1, as its generate calls it
	}
	return nil
}

// StopIDs returns the ids that end generation: EOS, and the other ids of
// generation_config.json's eos_token_id list (Llama-3's <|eot_id|>); for
// a llama2.c tokenizer EOS and BOS, where run.c's generate stops (its
// stories models end a text with BOS).
func StopIDs(tok Tokenizer) []int32 {
	switch t := tok.(type) {
	case *fileTokenizer:
		return slices.Clone(t.stop)
	case *scoreTokenizer:
		return []int32{l2cEOS, l2cBOS}
	}
	return []int32{tok.EOS()}
}

// SpecialIDs returns the BOS, EOS and pad ids of tok as transformers'
// tokenizer of its saved files reports them (bos_token_id, eos_token_id,
// pad_token_id), -1 for none, so that an export's config.json can carry
// the same ids: the byte tokenizer has only an EOS, GPT-2's BOS is its
// EOS, a llama2.c tokenizer's are 1 and 2, and one read from files has
// those its configuration names.
func SpecialIDs(tok Tokenizer) (bos, eos, pad int32) {
	switch t := tok.(type) {
	case *fileTokenizer:
		return t.bos, t.eos, t.pad
	case *scoreTokenizer:
		return l2cBOS, l2cEOS, -1
	case *gpt2Tokenizer:
		return t.EOS(), t.EOS(), -1
	}
	return -1, tok.EOS(), -1
}

// Dir returns the directory the tokenizer's files were read from, "" for a
// builtin one.
func Dir(tok Tokenizer) string {
	switch t := tok.(type) {
	case *fileTokenizer:
		return t.dir
	case *scoreTokenizer:
		return t.dir()
	}
	return ""
}
