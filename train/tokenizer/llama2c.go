// llama2c.go: the tokenizer.bin of Karpathy's llama2.c: a SentencePiece
// BPE vocabulary written as scores and pieces, encoded as run.c's encode()
// does it, and written back out as an equivalent tokenizer.json.
//
// The file is max_token_length (int32), then for every token its score
// (float32), its length (int32) and its bytes; the token count is not
// stored (run.c takes it from the model), so it is what the file holds.
// llama2.c's tokenizer.py writes spaces as ' ' (not '▁'), BOS and EOS as
// "\n<s>\n" and "\n</s>\n", and the byte-fallback tokens <0x00>..<0xFF> at
// ids 3..258, which run.c's encode relies on (a byte b is id b+3).
//
// Encoding is run.c's: the dummy prefix " " before a non-empty text, each
// UTF-8 code point looked up whole or else as its bytes, then the
// adjacent pair whose concatenation is a token with the highest score is
// merged, the leftmost among equal scores, until no pair is a token (only
// scores above -1e10 count, as run.c starts its search there). A heap
// finds that pair, so a long text costs n log n rather than run.c's n².
// Unlike run.c, a NUL byte in the text is a byte like any other (C stops
// at it), and a piece the file holds twice is always its lowest id
// (run.c's binary search may find either).
//
// Limits of the tokenizer.json it saves (see llama2cFiles): SentencePiece's
// BPE model in tokenizers' form, merges ordered by score. It encodes as
// run.c does except (1) where two different splits of one token are both
// adjacent pairs at once and overlap, which run.c breaks by position and
// tokenizers by the merges' order, and (2) text spelling <unk>, <s> or
// </s>, which transformers reads as that special token and run.c as
// characters. A vocabulary with '▁' in a piece, or a piece that is not
// valid UTF-8, has no such file and is refused.

package tokenizer

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"
)

// llama2.c's fixed ids: <unk>, BOS, EOS, then the 256 byte tokens.
const (
	l2cUnk      = 0
	l2cBOS      = 1
	l2cEOS      = 2
	l2cByteBase = 3
)

// l2cMinScore is run.c's starting best score: a merge must score above it.
var l2cMinScore = float32(-1e10)

// scoreTokenizer is a llama2.c tokenizer.bin.
type scoreTokenizer struct {
	name   string
	pieces []string // by id
	scores []float32
	ids    map[string]int32 // piece to its lowest id
	space  int32            // the dummy prefix " "
}

// IsLlama2CTokenizer reports whether path names a llama2.c tokenizer
// file: one whose name ends in .bin.
func IsLlama2CTokenizer(path string) bool {
	return strings.HasSuffix(path, ".bin")
}

// LoadLlama2C reads a llama2.c tokenizer.bin.
func LoadLlama2C(path string) (Tokenizer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parseLlama2C(raw)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	t.name = path
	return t, nil
}

func parseLlama2C(raw []byte) (*scoreTokenizer, error) {
	r := bytes.NewReader(raw)
	var maxLen int32
	if err := binary.Read(r, binary.LittleEndian, &maxLen); err != nil {
		return nil, fmt.Errorf("max_token_length: %w", err)
	}
	if maxLen <= 0 {
		return nil, fmt.Errorf("max_token_length %d must be positive", maxLen)
	}
	t := &scoreTokenizer{ids: map[string]int32{}}
	for r.Len() > 0 {
		id := len(t.pieces)
		var h struct {
			Score float32
			Len   int32
		}
		if err := binary.Read(r, binary.LittleEndian, &h); err != nil {
			return nil, fmt.Errorf("token %d: truncated header: %w", id, err)
		}
		if h.Len < 0 || h.Len > maxLen || int(h.Len) > r.Len() {
			return nil, fmt.Errorf("token %d: length %d is outside 0..max_token_length %d or past the end of the file", id, h.Len, maxLen)
		}
		if math.IsNaN(float64(h.Score)) {
			return nil, fmt.Errorf("token %d: score is NaN", id)
		}
		b := make([]byte, h.Len)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("token %d: %w", id, err)
		}
		s := string(b)
		t.pieces = append(t.pieces, s)
		t.scores = append(t.scores, h.Score)
		if _, dup := t.ids[s]; !dup {
			t.ids[s] = int32(id)
		}
	}
	if len(t.pieces) < l2cByteBase+256 {
		return nil, fmt.Errorf("%d tokens: fewer than <unk>, <s>, </s> and the 256 byte tokens", len(t.pieces))
	}
	if len(t.pieces) > math.MaxInt32 {
		return nil, fmt.Errorf("%d tokens: too many", len(t.pieces))
	}
	for b := range 256 {
		if want := fmt.Sprintf("<0x%02X>", b); t.pieces[l2cByteBase+b] != want {
			return nil, fmt.Errorf("token %d is %q, not the byte token %s that run.c's byte fallback takes it for", l2cByteBase+b, t.pieces[l2cByteBase+b], want)
		}
	}
	sp, ok := t.ids[" "]
	if !ok {
		return nil, errors.New(`no " " token for the dummy prefix`)
	}
	t.space = sp
	return t, nil
}

func (t *scoreTokenizer) Name() string   { return t.name }
func (t *scoreTokenizer) EOS() int32     { return l2cEOS }
func (t *scoreTokenizer) VocabSize() int { return len(t.pieces) }

// l2cPair is a merge candidate: the symbols at left and its right
// neighbour, which together are token id of score score.
type l2cPair struct {
	left, right int   // symbol indexes
	lid, rid    int32 // their ids when the pair was found
	id          int32
	score       float32
}

type l2cHeap []l2cPair

func (h l2cHeap) Len() int { return len(h) }
func (h l2cHeap) Less(i, j int) bool {
	if h[i].score != h[j].score {
		return h[i].score > h[j].score
	}
	return h[i].left < h[j].left // run.c keeps the first of equal scores
}
func (h l2cHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *l2cHeap) Push(x any)   { *h = append(*h, x.(l2cPair)) }
func (h *l2cHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// symbols are run.c's ids of s before any merge: the space run.c puts
// first, then each UTF-8 code point's id, or its bytes' fallback ids when
// the vocabulary lacks it.
func (t *scoreTokenizer) symbols(s string) []int32 {
	ids := []int32{t.space}
	for i := 0; i < len(s); {
		j := i + 1
		for j < len(s) && s[j]&0xC0 == 0x80 && j-i < 4 {
			j++
		}
		if id, ok := t.ids[s[i:j]]; ok {
			ids = append(ids, id)
		} else {
			for k := i; k < j; k++ {
				ids = append(ids, l2cByteBase+int32(s[k]))
			}
		}
		i = j
	}
	return ids
}

// Encode returns run.c's ids of s, without BOS (Prefix gives it).
func (t *scoreTokenizer) Encode(s string) []int32 {
	if s == "" {
		return nil
	}
	ids := t.symbols(s)
	// Symbols in a linked list; symbol i's place in the text never
	// changes relative to the others, so its index orders them.
	n := len(ids)
	prev, next := make([]int, n), make([]int, n)
	for i := range ids {
		prev[i], next[i] = i-1, i+1
	}
	next[n-1] = -1
	h := &l2cHeap{}
	consider := func(l int) {
		if l < 0 || next[l] < 0 {
			return
		}
		r := next[l]
		id, ok := t.ids[t.pieces[ids[l]]+t.pieces[ids[r]]]
		if ok && t.scores[id] > l2cMinScore {
			heap.Push(h, l2cPair{left: l, right: r, lid: ids[l], rid: ids[r], id: id, score: t.scores[id]})
		}
	}
	for i := 0; i+1 < n; i++ {
		consider(i)
	}
	alive := n
	for h.Len() > 0 {
		p := heap.Pop(h).(l2cPair)
		if ids[p.left] != p.lid || next[p.left] != p.right || ids[p.right] != p.rid {
			continue // a neighbour merged since
		}
		ids[p.left] = p.id
		ids[p.right] = -1
		nr := next[p.right]
		next[p.left] = nr
		if nr >= 0 {
			prev[nr] = p.left
		}
		alive--
		consider(prev[p.left])
		consider(p.left)
	}
	out := make([]int32, 0, alive)
	for i := 0; i >= 0; i = next[i] {
		out = append(out, ids[i])
	}
	return out
}

// Decode concatenates the pieces, byte tokens as their bytes, and drops
// one leading space (the dummy prefix's), as transformers' decoder for
// SentencePiece vocabularies does. BOS, EOS and ids outside the
// vocabulary decode to nothing.
func (t *scoreTokenizer) Decode(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id < 0 || int(id) >= len(t.pieces) || id == l2cBOS || id == l2cEOS:
		case id >= l2cByteBase && id < l2cByteBase+256:
			b.WriteByte(byte(id - l2cByteBase))
		default:
			b.WriteString(t.pieces[id])
		}
	}
	return strings.TrimPrefix(b.String(), " ")
}

// l2cSpecial is the name of special token id in a tokenizer.json:
// llama2.c writes <s> as "\n<s>\n".
func (t *scoreTokenizer) l2cSpecial(id int32) string {
	return strings.Trim(t.pieces[id], "\n")
}

// files writes t as a tokenizer.json that transformers and FromDir read
// (SentencePiece BPE in tokenizers' form: '▁' for spaces, merges of every
// pair of pieces that concatenate to a piece, highest score first), a
// tokenizer_config.json putting BOS first, and a generation_config.json
// whose stop ids are EOS and BOS, where run.c stops.
func (t *scoreTokenizer) files() (map[string][]byte, error) {
	const meta = "▁"
	vocab := make(map[string]int, len(t.pieces))
	names := make([]string, len(t.pieces))
	for id, p := range t.pieces {
		switch {
		case id <= l2cEOS:
			p = t.l2cSpecial(int32(id))
		case strings.Contains(p, meta):
			return nil, fmt.Errorf("token %d %q holds %q, which tokenizer.json uses for a space: no exact tokenizer.json", id, p, meta)
		case !utf8.ValidString(p):
			return nil, fmt.Errorf("token %d %q is not valid UTF-8: no tokenizer.json", id, p)
		}
		p = strings.ReplaceAll(p, " ", meta)
		if _, dup := vocab[p]; dup {
			continue // the lowest id, as encoding looks it up
		}
		vocab[p] = id
		names[id] = p
	}
	type merge struct {
		a, b  int32
		id    int32
		score float32
	}
	var merges []merge
	for id, p := range t.pieces {
		if id < l2cByteBase+256 || t.ids[p] != int32(id) || !(t.scores[id] > l2cMinScore) {
			continue
		}
		for cut := 1; cut < len(p); cut++ {
			a, okA := t.ids[p[:cut]]
			b, okB := t.ids[p[cut:]]
			if okA && okB && a > l2cEOS && b > l2cEOS {
				merges = append(merges, merge{a, b, int32(id), t.scores[id]})
			}
		}
	}
	sort.SliceStable(merges, func(i, j int) bool {
		if merges[i].score != merges[j].score {
			return merges[i].score > merges[j].score
		}
		return merges[i].id < merges[j].id
	})
	mj := make([]any, len(merges))
	for i, m := range merges {
		mj[i] = []string{names[m.a], names[m.b]}
	}
	added := []any{specialJSON(l2cUnk, names[l2cUnk]), specialJSON(l2cBOS, names[l2cBOS]), specialJSON(l2cEOS, names[l2cEOS])}
	bos, eos, unk := names[l2cBOS], names[l2cEOS], names[l2cUnk]
	seq := func(id string) map[string]any {
		return map[string]any{"Sequence": map[string]any{"id": id, "type_id": 0}}
	}
	bosTok := map[string]any{"SpecialToken": map[string]any{"id": bos, "type_id": 0}}
	tj := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": added,
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": meta},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": meta}}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{bosTok, seq("A")},
			"pair":           []any{bosTok, seq("A"), bosTok, seq("B")},
			"special_tokens": map[string]any{bos: map[string]any{"id": bos, "ids": []int{l2cBOS}, "tokens": []string{bos}}}},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": meta}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": unk,
			"continuing_subword_prefix": nil, "end_of_word_suffix": nil, "fuse_unk": true,
			"byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": mj},
	}
	files, err := withConfig("tokenizer.json", tj, map[string]any{
		"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "unk_token": unk,
		"add_bos_token": true, "add_eos_token": false, "clean_up_tokenization_spaces": false,
	})
	if err != nil {
		return nil, err
	}
	gc, err := json.MarshalIndent(map[string]any{"bos_token_id": l2cBOS, "eos_token_id": []int{l2cEOS, l2cBOS}}, "", " ")
	if err != nil {
		return nil, err
	}
	files["generation_config.json"] = append(gc, '\n')
	return files, nil
}

// llama2cDir is the directory of a llama2.c tokenizer's file.
func (t *scoreTokenizer) dir() string { return filepath.Dir(t.name) }
