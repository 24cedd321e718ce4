// gpt2.go: the GPT-2 tokenizer (OpenAI's r50k_base byte-level BPE, the same
// merges and ids as Hugging Face's "gpt2"), through
// github.com/tiktoken-go/tokenizer, whose vocabulary is Go source compiled
// into the binary: no download, no cache directory, no network.
//
// Limits: the library never parses special tokens, which is what we want
// ("<|endoftext|>" in data stays text). Its vocabulary has ids 0..50255;
// 50256 (<|endoftext|>) is only ever produced by EOS(). Invalid UTF-8 in the
// input is read as U+FFFD by the pre-tokenizer regexp, so such text does not
// round-trip byte for byte (valid UTF-8 always does).

package tokenizer

import (
	"fmt"
	"sync"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

const (
	gpt2EOS   = 50256
	gpt2Vocab = 50257
)

type gpt2Tokenizer struct {
	codec tiktoken.Codec
}

// gpt2Once builds the codec once per process: compiling the split regexp and
// the 50k-entry vocabulary map takes tens of milliseconds, and the codec is
// safe for concurrent use (regexp2 pools its runners, Decode builds its
// reverse table under a sync.Once).
var gpt2Once = sync.OnceValues(func() (Tokenizer, error) {
	c, err := tiktoken.Get(tiktoken.R50kBase)
	if err != nil {
		return nil, err
	}
	return &gpt2Tokenizer{codec: c}, nil
})

// GPT2 returns the GPT-2 BPE tokenizer: EOS is 50256 (<|endoftext|>),
// VocabSize is 50257.
func GPT2() (Tokenizer, error) {
	t, err := gpt2Once()
	if err != nil {
		return nil, fmt.Errorf("tokenizer: gpt2: %w", err)
	}
	return t, nil
}

func (*gpt2Tokenizer) Name() string   { return "gpt2" }
func (*gpt2Tokenizer) EOS() int32     { return gpt2EOS }
func (*gpt2Tokenizer) VocabSize() int { return gpt2Vocab }

func (t *gpt2Tokenizer) Encode(s string) []int32 {
	ids, _, err := t.codec.Encode(s)
	if err != nil {
		// Only a regexp failure (a match timeout, which is off by default)
		// gets here. Every single byte is itself a GPT-2 token, so encoding
		// byte by byte is still a faithful, if long, encoding.
		return t.encodeBytes(s)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// encodeBytes encodes s one byte per token.
func (t *gpt2Tokenizer) encodeBytes(s string) []int32 {
	out := make([]int32, 0, len(s))
	for i := 0; i < len(s); i++ {
		ids, _, err := t.codec.Encode(s[i : i+1])
		if err != nil || len(ids) != 1 {
			continue
		}
		out = append(out, int32(ids[0]))
	}
	return out
}

func (t *gpt2Tokenizer) Decode(ids []int32) string {
	// The library fails the whole call on one unknown id, so filter first:
	// EOS and out-of-range ids decode to nothing by contract.
	keep := make([]uint, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < gpt2EOS {
			keep = append(keep, uint(id))
		}
	}
	s, err := t.codec.Decode(keep)
	if err == nil {
		return s
	}
	// Some id in range has no token (none does in r50k_base, but the
	// library is the authority): decode one at a time, skipping failures.
	var b []byte
	for _, id := range keep {
		if piece, err := t.codec.Decode([]uint{id}); err == nil {
			b = append(b, piece...)
		}
	}
	return string(b)
}
