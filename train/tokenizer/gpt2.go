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
//
// The library's generated pre-tokenizer leaves DEL (0x7f) out of the
// punctuation class that GPT-2's pattern puts it in, so the library skips
// every DEL without a word (found by FuzzEncode). Encode puts the skipped
// text back as byte tokens (DEL is id 221). No GPT-2 merge involves DEL (no
// other vocabulary entry holds the byte), so this is Hugging Face's result
// exactly, except where DEL is directly followed by an apostrophe
// contraction ("\x7f's"): there GPT-2 splits "\x7f'" + "s" and we give
// DEL + "'s". Either way the text round-trips.

package tokenizer

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

const (
	gpt2EOS   = 50256
	gpt2Vocab = 50257
)

type gpt2Tokenizer struct {
	codec  tiktoken.Codec
	byteID [256]int32 // the single-byte token of each byte
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
	t := &gpt2Tokenizer{codec: c}
	// Byte-level BPE has one token per byte: find them by decoding (they
	// are ids 0..255 in GPT-2, but the vocabulary is the authority).
	found := 0
	for i := range t.byteID {
		t.byteID[i] = -1
	}
	for id := uint(0); id < gpt2EOS && found < 256; id++ {
		s, err := c.Decode([]uint{id})
		if err == nil && len(s) == 1 && t.byteID[s[0]] < 0 {
			t.byteID[s[0]] = int32(id)
			found++
		}
	}
	if found != 256 {
		return nil, fmt.Errorf("vocabulary has single-byte tokens for only %d of 256 bytes", found)
	}
	return t, nil
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
	ids, pieces, err := t.codec.Encode(s)
	if err != nil {
		// Only a regexp failure (a match timeout, which is off by default)
		// gets here. Every single byte is itself a GPT-2 token, so encoding
		// byte by byte is still a faithful, if long, encoding.
		return t.appendBytes(nil, s)
	}
	// The pieces are consecutive substrings of the text the pre-tokenizer
	// saw (the input with each invalid byte read as U+FFFD); text it
	// skipped lies between them and becomes byte tokens.
	text := s
	if !utf8.ValidString(s) {
		text = string([]rune(s))
	}
	out := make([]int32, 0, len(ids))
	pos := 0
	for i, p := range pieces {
		if !strings.HasPrefix(text[pos:], p) {
			j := strings.Index(text[pos:], p)
			if j < 0 { // the library's pieces do not follow the text
				return t.appendBytes(nil, s)
			}
			out = t.appendBytes(out, text[pos:pos+j])
			pos += j
		}
		out = append(out, int32(ids[i]))
		pos += len(p)
	}
	return t.appendBytes(out, text[pos:])
}

// appendBytes appends the single-byte token of each byte of s.
func (t *gpt2Tokenizer) appendBytes(out []int32, s string) []int32 {
	for i := 0; i < len(s); i++ {
		out = append(out, t.byteID[s[i]])
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
