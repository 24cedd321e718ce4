package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

const l2cDir = "../testdata/llama2c"

type l2cReference struct {
	Tokenizer struct {
		VocabSize int `json:"vocab_size"`
		Encode    []struct {
			Text string  `json:"text"`
			BOS  bool    `json:"bos"`
			IDs  []int32 `json:"ids"`
		} `json:"encode"`
	} `json:"tokenizer"`
}

func readL2CReference(t *testing.T) l2cReference {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(l2cDir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref l2cReference
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

// encodeWithPrefix is what training and sampling feed a model.
func encodeWithPrefix(tok Tokenizer, s string, bos bool) []int32 {
	ids := tok.Encode(s)
	if bos {
		ids = append(Prefix(tok), ids...)
	}
	return ids
}

// TestLlama2CEncode: ids equal the fixture script's re-implementation of
// run.c's encode(), and decoding gives the text back.
func TestLlama2CEncode(t *testing.T) {
	ref := readL2CReference(t)
	tok, err := Open(filepath.Join(l2cDir, "tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != ref.Tokenizer.VocabSize || tok.EOS() != 2 {
		t.Fatalf("vocab %d eos %d, want %d and 2", tok.VocabSize(), tok.EOS(), ref.Tokenizer.VocabSize)
	}
	if got := StopIDs(tok); !slices.Equal(got, []int32{2, 1}) {
		t.Errorf("StopIDs = %v, want [2 1]", got)
	}
	for _, c := range ref.Tokenizer.Encode {
		if got := encodeWithPrefix(tok, c.Text, c.BOS); !slices.Equal(got, c.IDs) {
			t.Errorf("encode(%q, bos=%v) = %v, want %v", c.Text, c.BOS, got, c.IDs)
		}
		if got := tok.Decode(tok.Encode(c.Text)); got != c.Text {
			t.Errorf("decode(encode(%q)) = %q", c.Text, got)
		}
	}
}

// naiveL2C is run.c's merge loop as it is written (quadratic): the oracle
// for the heap the tokenizer uses.
func naiveL2C(t *scoreTokenizer, s string) []int32 {
	if s == "" {
		return nil
	}
	ids := t.symbols(s)
	for {
		best, at, bestID := l2cMinScore, -1, int32(0)
		for i := 0; i+1 < len(ids); i++ {
			if id, ok := t.ids[t.pieces[ids[i]]+t.pieces[ids[i+1]]]; ok && t.scores[id] > best {
				best, at, bestID = t.scores[id], i, id
			}
		}
		if at < 0 {
			return ids
		}
		ids[at] = bestID
		ids = slices.Delete(ids, at+1, at+2)
	}
}

// TestLlama2CMergeOrder: the heap merges as run.c's loop does on random
// text made of the vocabulary's pieces, with equal scores included (a
// vocabulary whose pieces all score the same, where only position
// decides).
func TestLlama2CMergeOrder(t *testing.T) {
	tok, err := LoadLlama2C(filepath.Join(l2cDir, "tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	st := tok.(*scoreTokenizer)
	flat := &scoreTokenizer{pieces: st.pieces, ids: st.ids, space: st.space, scores: make([]float32, len(st.scores))}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := st.pieces[259:]
	for _, tk := range []*scoreTokenizer{st, flat} {
		for range 300 {
			var b strings.Builder
			for range rng.IntN(30) {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
				if rng.IntN(8) == 0 {
					b.WriteString("é\x00🙂")
				}
			}
			s := b.String()
			if got, want := tk.Encode(s), naiveL2C(tk, s); !slices.Equal(got, want) {
				t.Fatalf("encode(%q) = %v, run.c's loop gives %v", s, got, want)
			}
		}
	}
}

// TestLlama2CSaveJSON: the tokenizer.json Save writes, read back by Open,
// encodes the reference texts to the same ids (BOS included), decodes
// them the same, and stops at the same ids.
func TestLlama2CSaveJSON(t *testing.T) {
	ref := readL2CReference(t)
	tok, err := Open(filepath.Join(l2cDir, "tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names, err := Save(tok, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
		t.Errorf("saved %v", names)
	}
	back, found, err := FromDir(dir)
	if err != nil || !found {
		t.Fatalf("FromDir: %v (found %v)", err, found)
	}
	if back.VocabSize() != tok.VocabSize() || back.EOS() != tok.EOS() || !slices.Equal(StopIDs(back), StopIDs(tok)) {
		t.Errorf("read back: vocab %d eos %d stop %v", back.VocabSize(), back.EOS(), StopIDs(back))
	}
	for _, c := range ref.Tokenizer.Encode {
		if got := encodeWithPrefix(back, c.Text, c.BOS); !slices.Equal(got, c.IDs) {
			t.Errorf("tokenizer.json: encode(%q, bos=%v) = %v, want %v", c.Text, c.BOS, got, c.IDs)
		}
		if got, want := back.Decode(c.IDs), tok.Decode(c.IDs); got != want {
			t.Errorf("tokenizer.json: decode(%v) = %q, tokenizer.bin gives %q", c.IDs, got, want)
		}
	}
}

// TestLlama2CBadFiles: broken files are errors naming what is wrong.
func TestLlama2CBadFiles(t *testing.T) {
	good, err := os.ReadFile(filepath.Join(l2cDir, "tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	byteTok := 4 + 3*8 + len("<unk>") + len("\n<s>\n") + len("\n</s>\n") // the header of token 3
	swapped := slices.Clone(good)
	copy(swapped[byteTok+8:], "<0x7F>") // token 3 claims to be byte 0x7F
	for _, c := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"empty", nil, "max_token_length"},
		{"truncated", good[:len(good)-3], "past the end"},
		{"few tokens", good[:byteTok], "fewer than"},
		{"byte order", swapped, "not the byte token <0x00>"},
	} {
		p := filepath.Join(t.TempDir(), "tok.bin")
		if err := os.WriteFile(p, c.raw, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v, want one naming %s and %q", c.name, err, p, c.want)
		}
	}
}

// FuzzLlama2CEncode: on any text the heap merges as run.c's loop does,
// and valid UTF-8 decodes back to itself; on any file bytes the parser
// returns an error or a tokenizer, never panics.
func FuzzLlama2CEncode(f *testing.F) {
	raw, err := os.ReadFile(filepath.Join(l2cDir, "tokenizer.bin"))
	if err != nil {
		f.Fatal(err)
	}
	tok, err := parseLlama2C(raw)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"", "hello there", "Thé! 🙂 \xff\xfe", "  a  b\n\x00"} {
		f.Add(s, raw[:min(len(raw), 40)])
	}
	f.Fuzz(func(t *testing.T, s string, file []byte) {
		if got, want := tok.Encode(s), naiveL2C(tok, s); !slices.Equal(got, want) {
			t.Fatalf("encode(%q) = %v, run.c's loop gives %v", s, got, want)
		}
		if utf8.ValidString(s) {
			if got := tok.Decode(tok.Encode(s)); got != s {
				t.Fatalf("decode(encode(%q)) = %q", s, got)
			}
		}
		_, _ = parseLlama2C(file)
	})
}

// TestLlama2CFromDir: a directory holding only a tokenizer.bin is read as
// llama2.c's tokenizer, by FromDir and by --tokenizer DIR.
func TestLlama2CFromDir(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(l2cDir, "tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.bin"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := encodeWithPrefix(tok, "hello there", true); !slices.Equal(got, []int32{1, 297, 281, 290}) {
		t.Errorf("encode = %v", got)
	}
}
