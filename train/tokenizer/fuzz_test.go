// Fuzzing of the tokenizers on the text of user files. Neither tokenizer
// reads a file (the GPT-2 vocabulary and merges are compiled into the
// binary), so what a user controls is the text and, through generation or a
// corrupt token file, the ids: Encode must give ids of the vocabulary and
// never EOS, Decode(Encode(s)) must give s back (valid UTF-8; each invalid
// byte reads as U+FFFD for GPT-2, the byte itself for the byte tokenizer),
// and Decode must take any ids without panicking.

package tokenizer

import (
	"encoding/binary"
	"testing"
)

var textSeeds = []string{
	"",
	"Hello, world!",
	"<|endoftext|>",
	" \t\n\r\n  ",
	"héllo wörld — ✓ 😀 日本語",
	"a\xffb",
	"é\xe2\x82!",
	"'s 've 're 'll 'd 't",
	"   leading spaces and trailing   ",
	"1234567890 3.14159 -0",
	"\x00\x01\x1f",
	"\ufeffBOM",
}

func FuzzEncode(f *testing.F) {
	for _, s := range textSeeds {
		f.Add(s)
	}
	gpt2, err := GPT2()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range []Tokenizer{Byte(), gpt2} {
			ids := tok.Encode(s)
			for _, id := range ids {
				if id < 0 || id >= tok.EOS() || int(id) >= tok.VocabSize() {
					t.Fatalf("%s: Encode(%q) gave id %d (EOS %d, vocabulary %d)", tok.Name(), s, id, tok.EOS(), tok.VocabSize())
				}
			}
			want := s
			if tok.Name() == "gpt2" {
				want = string([]rune(s)) // each invalid byte becomes U+FFFD
			}
			if got := tok.Decode(ids); got != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q, want %q", tok.Name(), s, got, want)
			}
		}
	})
}

func FuzzDecode(f *testing.F) {
	le := func(ids ...int32) []byte {
		b := make([]byte, 4*len(ids))
		for i, id := range ids {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
		}
		return b
	}
	f.Add(le())
	f.Add(le(15496, 11, 995, 0))
	f.Add(le(50256, 50257, -1, 1<<31-1, 256, 255))
	f.Add(le(40, 3021, 18433))
	gpt2, err := GPT2()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ids := make([]int32, len(b)/4)
		for i := range ids {
			ids[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
		for _, tok := range []Tokenizer{Byte(), gpt2} {
			s := tok.Decode(ids)
			// Dropping EOS and out-of-range ids first changes nothing.
			var kept []int32
			for _, id := range ids {
				if id >= 0 && id < tok.EOS() {
					kept = append(kept, id)
				}
			}
			if again := tok.Decode(kept); again != s {
				t.Fatalf("%s: Decode(%v) = %q, but %q without EOS and unknown ids", tok.Name(), ids, s, again)
			}
		}
	})
}
