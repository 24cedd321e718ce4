// Tests for the byte and GPT-2 tokenizers: known GPT-2 ids, round trips
// (unicode included), the end-of-text string staying text, and Decode's
// tolerance of EOS and out-of-range ids.

package tokenizer

import (
	"slices"
	"strings"
	"sync"
	"testing"
)

func mustGPT2(t *testing.T) Tokenizer {
	t.Helper()
	tok, err := GPT2()
	if err != nil {
		t.Fatalf("GPT2: %v", err)
	}
	return tok
}

func TestGPT2KnownEncodings(t *testing.T) {
	tok := mustGPT2(t)
	tests := []struct {
		in   string
		want []int32
	}{
		{"", nil},
		{"Hello world", []int32{15496, 995}},
		{"hello\n", []int32{31373, 198}},
		{" the", []int32{262}},
		{"The end", []int32{464, 886}},
		{"don't", []int32{9099, 470}},
		{"GPT-2", []int32{38, 11571, 12, 17}},
		// The special token's text is ordinary text, never id 50256.
		{"<|endoftext|>", []int32{27, 91, 437, 1659, 5239, 91, 29}},
	}
	for _, tc := range tests {
		got := tok.Encode(tc.in)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestEndOfTextIsNotEOS(t *testing.T) {
	gpt2 := mustGPT2(t)
	for _, tok := range []Tokenizer{Byte(), gpt2} {
		s := "a<|endoftext|>b <|endoftext|>"
		ids := tok.Encode(s)
		if slices.Contains(ids, tok.EOS()) {
			t.Errorf("%s: Encode(%q) = %v contains EOS %d", tok.Name(), s, ids, tok.EOS())
		}
		if got := tok.Decode(ids); got != s {
			t.Errorf("%s: round trip of %q gave %q", tok.Name(), s, got)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	gpt2 := mustGPT2(t)
	texts := []string{
		"",
		"Hello world",
		"  leading and trailing spaces  ",
		"tabs\tand\nnewlines\r\n\n\n",
		"naïve café — déjà vu",
		"日本語のテキスト、中文文本。",
		"emoji: 🦀🚀 👩‍👩‍👧 flags 🇫🇷",
		"numbers 1234567890 3.14159 -42",
		"don't won't they'll I'm we've she'd",
		strings.Repeat("abc ", 300),
		strings.Repeat("x", 500), // long piece: the library's heap merge path
	}
	for _, tok := range []Tokenizer{Byte(), gpt2} {
		for _, s := range texts {
			ids := tok.Encode(s)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() || id == tok.EOS() {
					t.Fatalf("%s: Encode(%q) gave id %d (vocab %d, EOS %d)", tok.Name(), s, id, tok.VocabSize(), tok.EOS())
				}
			}
			if got := tok.Decode(ids); got != s {
				t.Errorf("%s: round trip of %q gave %q", tok.Name(), s, got)
			}
		}
	}
}

func TestGPT2InvalidUTF8(t *testing.T) {
	tok := mustGPT2(t)
	// The pre-tokenizer reads each invalid byte as U+FFFD; ids stay valid.
	tests := []struct{ in, want string }{
		{"a\xffb", "a\uFFFDb"},
		{"\xc3", "\uFFFD"},
		{"é\xe2\x82!", "é\uFFFD\uFFFD!"},
	}
	for _, tc := range tests {
		ids := tok.Encode(tc.in)
		for _, id := range ids {
			if id < 0 || id >= tok.EOS() {
				t.Fatalf("Encode(%q) gave id %d", tc.in, id)
			}
		}
		if got := tok.Decode(ids); got != tc.want {
			t.Errorf("Decode(Encode(%q)) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestByteTokenizer(t *testing.T) {
	tok := Byte()
	if tok.Name() != "byte" || tok.EOS() != 256 || tok.VocabSize() != 257 {
		t.Fatalf("byte: name %q EOS %d vocab %d", tok.Name(), tok.EOS(), tok.VocabSize())
	}
	if got, want := tok.Encode("Aé"), []int32{65, 0xc3, 0xa9}; !slices.Equal(got, want) {
		t.Errorf("Encode(Aé) = %v, want %v", got, want)
	}
	// Invalid UTF-8 survives: bytes are bytes.
	bad := string([]byte{0xff, 'a', 0xc3})
	if got := tok.Decode(tok.Encode(bad)); got != bad {
		t.Errorf("invalid UTF-8 round trip gave %q", got)
	}
}

func TestDecodeSkipsEOSAndUnknown(t *testing.T) {
	gpt2 := mustGPT2(t)
	tests := []struct {
		tok  Tokenizer
		ids  []int32
		want string
	}{
		{Byte(), []int32{104, 256, 105, -1, 257, 1 << 30}, "hi"},
		{Byte(), nil, ""},
		{gpt2, []int32{15496, 50256, 995, -7, 50257, 1 << 30}, "Hello world"},
		{gpt2, []int32{50256}, ""},
	}
	for _, tc := range tests {
		if got := tc.tok.Decode(tc.ids); got != tc.want {
			t.Errorf("%s: Decode(%v) = %q, want %q", tc.tok.Name(), tc.ids, got, tc.want)
		}
	}
}

func TestGPT2Constants(t *testing.T) {
	tok := mustGPT2(t)
	if tok.Name() != "gpt2" || tok.EOS() != 50256 || tok.VocabSize() != 50257 {
		t.Fatalf("gpt2: name %q EOS %d vocab %d", tok.Name(), tok.EOS(), tok.VocabSize())
	}
	// Every non-EOS id decodes to a non-empty piece: the vocabulary is dense.
	for id := int32(0); id < tok.EOS(); id += 97 {
		if tok.Decode([]int32{id}) == "" {
			t.Fatalf("id %d decodes to nothing", id)
		}
	}
}

func TestByName(t *testing.T) {
	for _, name := range Names() {
		tok, err := ByName(name)
		if err != nil {
			t.Fatalf("ByName(%q): %v", name, err)
		}
		if tok.Name() != name {
			t.Errorf("ByName(%q).Name() = %q", name, tok.Name())
		}
	}
	_, err := ByName("sentencepiece")
	if err == nil {
		t.Fatal("ByName(sentencepiece) succeeded")
	}
	for _, want := range []string{"sentencepiece", "byte", "gpt2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestGPT2Concurrent(t *testing.T) {
	tok := mustGPT2(t)
	want := tok.Encode("The quick brown fox jumps over the lazy dog.")
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				got := tok.Encode("The quick brown fox jumps over the lazy dog.")
				if !slices.Equal(got, want) {
					t.Errorf("concurrent Encode = %v, want %v", got, want)
					return
				}
				tok.Decode(got)
			}
		}()
	}
	wg.Wait()
}

func BenchmarkGPT2Encode(b *testing.B) {
	tok, err := GPT2()
	if err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; naïve café 123. ", 200)
	b.SetBytes(int64(len(text)))
	n := 0
	for b.Loop() {
		n = len(tok.Encode(text))
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// DEL (0x7f) is punctuation to GPT-2's pre-tokenizer and a token of its own
// (221); the library skips it, and Encode puts it back (FuzzEncode found the
// loss). No merge involves DEL, so these are GPT-2's own ids.
func TestGPT2KeepsDEL(t *testing.T) {
	tok := mustGPT2(t)
	tests := []struct {
		in   string
		want []int32
	}{
		{"\x7f", []int32{221}},
		{"a\x7fb", []int32{64, 221, 65}},
		{"!\x7f!", []int32{0, 221, 0}},
		{" \x7f", []int32{220, 221}},
		{"\x7f\x7f", []int32{221, 221}},
	}
	for _, tc := range tests {
		got := tok.Encode(tc.in)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.in, got, tc.want)
		}
		if back := tok.Decode(got); back != tc.in {
			t.Errorf("Decode(Encode(%q)) = %q", tc.in, back)
		}
	}
}
