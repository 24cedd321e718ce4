// file.go: tokenizers read from Hugging Face files: tokenizer.json (a BPE
// model, byte-level as GPT-2, Llama-3, Qwen and SmolLM have it, or
// SentencePiece-style as Llama-2 and TinyLlama have it), or GPT-2's
// vocab.json + merges.txt; and beside them tokenizer_config.json and
// generation_config.json for the BOS and EOS rules.
//
// Encoding follows the library's order: added tokens are cut out of the
// raw text first (those marked normalized are cut out of the normalized
// text), each remaining piece is normalized, pre-tokenized and merged by
// the BPE model. Added tokens are matched as transformers matches them, so
// text that spells a special token ("</s>") gets its id.
//
// Limits: BPE models only (WordPiece, WordLevel and Unigram are refused
// with the field named); no truncation or padding (the trainer cuts
// sequences itself); BPE dropout is refused; chat_template is not read.

package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// fileTokenizer is a tokenizer read from files.
type fileTokenizer struct {
	name   string // the file it was read from
	dir    string // the directory of its files
	files  map[string][]byte
	model  *bpeModel
	norm   []normalizer
	pre    []preTokenizer
	dec    []decoder
	raw    addedSet // not normalized: matched on the input
	normed addedSet // matched on the normalized text
	byID   map[int32]string
	tokens []string // the model's tokens by id ("" where none)
	vocab  int

	bos, eos int32 // -1: none
	pad      int32 // -1: none; only exported (SpecialIDs), never used in training
	addBOS   bool
	stop     []int32
}

// addedSet is added tokens, longest first, and the bytes they start with
// (a position starting with no such byte needs no comparison).
type addedSet struct {
	tokens []addedToken
	first  [256]bool
}

func (s *addedSet) add(a addedToken) {
	s.tokens = append(s.tokens, a)
	s.first[a.Content[0]] = true
	// Longest first, so that the first match at a position is the longest.
	slices.SortStableFunc(s.tokens, func(a, b addedToken) int { return len(b.Content) - len(a.Content) })
}

type addedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// FromDir reads the tokenizer of a checkpoint directory: tokenizer.json,
// else vocab.json + merges.txt, with the BOS/EOS rules of the config files
// beside them, else llama2.c's tokenizer.bin. found is false, with no error, when dir has neither; a
// directory with only SentencePiece's tokenizer.model is an error.
func FromDir(dir string) (tok Tokenizer, found bool, err error) {
	p := filepath.Join(dir, "tokenizer.json")
	if exists(p) {
		t, err := Load(p)
		return t, true, err
	}
	if exists(filepath.Join(dir, "vocab.json")) && exists(filepath.Join(dir, "merges.txt")) {
		t, err := loadVocabMerges(dir)
		return t, true, err
	}
	if p := filepath.Join(dir, "tokenizer.bin"); exists(p) {
		t, err := LoadLlama2C(p)
		return t, true, err
	}
	if p := filepath.Join(dir, "tokenizer.model"); exists(p) {
		return nil, true, fmt.Errorf("tokenizer: %s: SentencePiece model files are not read; save the tokenizer as tokenizer.json (transformers: AutoTokenizer.from_pretrained(dir).save_pretrained(dir)) or give --tokenizer", p)
	}
	return nil, false, nil
}

// Open returns the tokenizer that --tokenizer names: a builtin ("byte",
// "gpt2"), a directory (as FromDir), a tokenizer.json file, a vocab.json
// with merges.txt beside it, or a llama2.c tokenizer (a .bin file).
func Open(arg string) (Tokenizer, error) {
	if slices.Contains(names, arg) {
		return ByName(arg)
	}
	st, err := os.Stat(arg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w (give a tokenizer.json, a vocab.json, a directory holding one, a llama2.c tokenizer .bin, or %s)", err, strings.Join(names, ", "))
	}
	if st.IsDir() {
		tok, found, err := FromDir(arg)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("tokenizer: %s holds no tokenizer.json, vocab.json + merges.txt or tokenizer.bin", arg)
		}
		return tok, nil
	}
	if filepath.Base(arg) == "vocab.json" {
		return loadVocabMerges(filepath.Dir(arg))
	}
	if IsLlama2CTokenizer(arg) {
		return LoadLlama2C(arg)
	}
	return Load(arg)
}

// tokenizerJSON is the part of tokenizer.json the loader reads.
type tokenizerJSON struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type bpeJSON struct {
	Type                    *string          `json:"type"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  json.RawMessage  `json:"merges"`
}

// Load reads a tokenizer.json, and the BOS/EOS rules of the config files
// in its directory. The tokenizer.json that Save writes for the byte
// tokenizer, unchanged, gives the byte tokenizer itself, so that a model
// exported and trained again keeps it exactly (invalid UTF-8 and all).
func Load(path string) (Tokenizer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if files, err := byteFiles(); err == nil && bytes.Equal(raw, files["tokenizer.json"]) {
		return Byte(), nil
	}
	t, err := parseTokenizerJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	t.name, t.dir = path, filepath.Dir(path)
	t.files = map[string][]byte{"tokenizer.json": raw}
	if err := t.readConfigs(); err != nil {
		return nil, err
	}
	return t, nil
}

// parseTokenizerJSON builds the tokenizer a tokenizer.json describes,
// without its BOS/EOS rules; errors name the field.
func parseTokenizerJSON(raw []byte) (*fileTokenizer, error) {
	var j tokenizerJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	if isNull(j.Model) {
		return nil, errors.New("model: missing")
	}
	var mt struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(j.Model, &mt); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if mt.Type != nil && *mt.Type != "BPE" {
		return nil, fmt.Errorf("model.type %q is not supported (supported: BPE)", *mt.Type)
	}
	var m bpeJSON
	if err := json.Unmarshal(j.Model, &m); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	switch {
	case m.Type == nil && m.Merges == nil:
		return nil, errors.New("model.type: missing, and no model.merges of a BPE model")
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("model.dropout %g: BPE dropout is not supported", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("model.continuing_subword_prefix %q is not supported", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("model.end_of_word_suffix %q is not supported", *m.EndOfWordSuffix)
	case len(m.Vocab) == 0:
		return nil, errors.New("model.vocab: empty")
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	unk := ""
	if m.UnkToken != nil {
		unk = *m.UnkToken
	}
	t := &fileTokenizer{bos: -1, eos: -1, pad: -1}
	if t.model, err = newBPE(m.Vocab, merges, unk, m.FuseUnk, m.ByteFallback, m.IgnoreMerges); err != nil {
		return nil, err
	}
	if t.norm, err = parseNormalizer(j.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	var pre preResult
	if err := parsePreTokenizer(j.PreTokenizer, "pre_tokenizer", &pre); err != nil {
		return nil, err
	}
	t.pre = pre.steps
	if t.dec, err = parseDecoder(j.Decoder, "decoder"); err != nil {
		return nil, err
	}
	if err := t.setVocab(m.Vocab, j.AddedTokens); err != nil {
		return nil, err
	}
	if t.addBOS, err = templatePrefix(j.PostProcessor, t); err != nil {
		return nil, err
	}
	return t, nil
}

// parseMerges reads model.merges in either form: "a b" strings (older
// files) or ["a", "b"] pairs (tokenizers 0.20 and later).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("model.merges: %w", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err == nil {
			parts := strings.Split(s, " ")
			if len(parts) != 2 {
				return nil, fmt.Errorf("model.merges[%d] %q: not two tokens separated by a space", i, s)
			}
			out[i] = [2]string{parts[0], parts[1]}
			continue
		}
		var pair []string
		if err := json.Unmarshal(it, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("model.merges[%d]: neither \"a b\" nor [\"a\", \"b\"]", i)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

// setVocab records the model's tokens and the added ones, and the
// vocabulary size: one more than the largest id.
func (t *fileTokenizer) setVocab(vocab map[string]int32, added []addedToken) error {
	maxID := int32(-1)
	for tok, id := range vocab {
		if id < 0 {
			return fmt.Errorf("model.vocab[%q]: negative id %d", tok, id)
		}
		maxID = max(maxID, id)
	}
	t.byID = map[int32]string{}
	t.raw, t.normed = addedSet{}, addedSet{}
	for i, a := range added {
		if a.Content == "" || a.ID < 0 {
			return fmt.Errorf("added_tokens[%d]: empty content or negative id", i)
		}
		maxID = max(maxID, a.ID)
		t.byID[a.ID] = a.Content
		if a.Normalized && len(t.norm) > 0 {
			t.normed.add(a)
		} else {
			t.raw.add(a)
		}
	}
	// Ids are dense in every real vocabulary; a far larger id is a broken
	// file, and would size the id table after it.
	if n := len(vocab) + len(added); int(maxID) >= 2*n+1024 {
		return fmt.Errorf("token id %d is far beyond the %d tokens: ids are not dense", maxID, n)
	}
	t.vocab = int(maxID) + 1
	t.tokens = make([]string, t.vocab)
	for tok, id := range vocab {
		t.tokens[id] = tok
	}
	return nil
}

// templatePrefix reads a TemplateProcessing post-processor (alone or in a
// Sequence): whether it puts special tokens before the text, as Llama's
// "<s> $A" does; the BOS rule when tokenizer_config.json does not say.
func templatePrefix(raw json.RawMessage, t *fileTokenizer) (bool, error) {
	if isNull(raw) {
		return false, nil
	}
	var p struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct{} `json:"Sequence"`
		} `json:"single"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return false, fmt.Errorf("post_processor: %w", err)
	}
	switch p.Type {
	case "Sequence":
		for _, r := range p.Processors {
			if ok, err := templatePrefix(r, t); ok || err != nil {
				return ok, err
			}
		}
	case "TemplateProcessing":
		if len(p.Single) > 0 && p.Single[0].SpecialToken != nil {
			id, ok := t.lookup(p.Single[0].SpecialToken.ID)
			if !ok {
				return false, fmt.Errorf("post_processor.single: %q is not a token", p.Single[0].SpecialToken.ID)
			}
			t.bos = id
			return true, nil
		}
	}
	return false, nil
}

// lookup returns the id of a token: an added token or one of the model.
func (t *fileTokenizer) lookup(s string) (int32, bool) {
	for _, l := range []addedSet{t.raw, t.normed} {
		for _, a := range l.tokens {
			if a.Content == s {
				return a.ID, true
			}
		}
	}
	id, ok := t.model.vocab[s]
	return id, ok
}

// tokenValue is a special token in tokenizer_config.json: a string, or an
// AddedToken object with its content.
type tokenValue struct {
	s   string
	set bool
}

func (v *tokenValue) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		return nil
	}
	if err := json.Unmarshal(b, &v.s); err == nil {
		v.set = true
		return nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	v.s, v.set = o.Content, true
	return nil
}

// idList is generation_config.json's eos_token_id: one id or a list.
type idList []int32

func (l *idList) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		return nil
	}
	var one int32
	if err := json.Unmarshal(b, &one); err == nil {
		*l = idList{one}
		return nil
	}
	var many []int32
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*l = many
	return nil
}

// readConfigs applies tokenizer_config.json, generation_config.json and
// special_tokens_map.json of t.dir where present. The EOS is
// tokenizer_config's eos_token, else special_tokens_map's, else the first of
// generation_config's eos_token_id, else config.json's eos_token_id; the
// BOS likewise; BOS is put before a text when add_bos_token says so, or
// without it when the post-processor's template does. add_eos_token is not
// read: the trainer ends every example with EOS whatever it says, and a
// prompt to continue must not end with one.
func (t *fileTokenizer) readConfigs() error {
	var tc struct {
		AddBOS *bool      `json:"add_bos_token"`
		BOS    tokenValue `json:"bos_token"`
		EOS    tokenValue `json:"eos_token"`
		PAD    tokenValue `json:"pad_token"`
	}
	var gc struct {
		BOS *int32 `json:"bos_token_id"`
		EOS idList `json:"eos_token_id"`
	}
	var sm, mc struct {
		BOS tokenValue `json:"bos_token"`
		EOS tokenValue `json:"eos_token"`
		PAD tokenValue `json:"pad_token"`
		// config.json's
		BOSID *int32 `json:"bos_token_id"`
		EOSID idList `json:"eos_token_id"`
	}
	for _, f := range []struct {
		name string
		v    any
	}{{"tokenizer_config.json", &tc}, {"generation_config.json", &gc}, {"special_tokens_map.json", &sm}, {"config.json", &mc}} {
		p := filepath.Join(t.dir, f.name)
		raw, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("tokenizer: %w", err)
		}
		if err := json.Unmarshal(raw, f.v); err != nil {
			return fmt.Errorf("tokenizer: %s: %w", p, err)
		}
		if f.name != "config.json" {
			t.files[f.name] = raw
		}
	}
	named := func(v tokenValue, file, field string) (int32, bool, error) {
		if !v.set {
			return -1, false, nil
		}
		id, ok := t.lookup(v.s)
		if !ok {
			return -1, false, fmt.Errorf("tokenizer: %s: %s %q is not a token of %s", filepath.Join(t.dir, file), field, v.s, t.name)
		}
		return id, true, nil
	}
	pick := func(which string, fromTC, fromSM tokenValue, gen, cfg []int32) (int32, error) {
		if id, ok, err := named(fromTC, "tokenizer_config.json", which+"_token"); ok || err != nil {
			return id, err
		}
		if id, ok, err := named(fromSM, "special_tokens_map.json", which+"_token"); ok || err != nil {
			return id, err
		}
		for _, ids := range [][]int32{gen, cfg} {
			if len(ids) > 0 {
				return ids[0], nil
			}
		}
		return -1, nil
	}
	var genBOS, cfgBOS []int32
	if gc.BOS != nil {
		genBOS = []int32{*gc.BOS}
	}
	if mc.BOSID != nil {
		cfgBOS = []int32{*mc.BOSID}
	}
	bos, err := pick("bos", tc.BOS, sm.BOS, genBOS, cfgBOS)
	if err != nil {
		return err
	}
	if bos >= 0 {
		t.bos = bos
	}
	// The pad token is transformers' tokenizer's (tokenizer_config.json,
	// else special_tokens_map.json; not config.json, which its tokenizer
	// does not read), for the export's config to agree with it. One that
	// is not a token (transformers would add it) counts as none.
	if pad, err := pick("pad", tc.PAD, sm.PAD, nil, nil); err == nil {
		t.pad = pad
	}
	if t.eos, err = pick("eos", tc.EOS, sm.EOS, gc.EOS, mc.EOSID); err != nil {
		return err
	}
	if t.eos < 0 {
		if id, ok := t.lookup("<|endoftext|>"); ok && t.files["vocab.json"] != nil {
			t.eos = id // GPT2Tokenizer's default eos_token
		}
	}
	if t.eos < 0 {
		return fmt.Errorf("tokenizer: %s: no end-of-sequence token: none of tokenizer_config.json eos_token, generation_config.json eos_token_id or config.json eos_token_id in %s", t.name, t.dir)
	}
	if tc.AddBOS != nil {
		t.addBOS = *tc.AddBOS
	}
	if t.addBOS && t.bos < 0 {
		return fmt.Errorf("tokenizer: %s: add_bos_token is true but no bos_token is named", filepath.Join(t.dir, "tokenizer_config.json"))
	}
	for _, id := range []int32{t.eos} {
		if int(id) >= t.vocab || id < 0 {
			return fmt.Errorf("tokenizer: %s: end-of-sequence id %d is outside the vocabulary of %d", t.name, id, t.vocab)
		}
	}
	t.stop = []int32{t.eos}
	for _, id := range gc.EOS {
		if id >= 0 && int(id) < t.vocab && !slices.Contains(t.stop, id) {
			t.stop = append(t.stop, id)
		}
	}
	return nil
}

// loadVocabMerges reads GPT-2's vocab.json + merges.txt in dir: byte-level
// BPE with GPT-2's split regex; <|endoftext|> (or the special tokens the
// config files name) are matched as added tokens, as GPT2Tokenizer does.
func loadVocabMerges(dir string) (Tokenizer, error) {
	vp, mp := filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt")
	vraw, err := os.ReadFile(vp)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	mraw, err := os.ReadFile(mp)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var vocab map[string]int32
	if err := json.Unmarshal(vraw, &vocab); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", vp, err)
	}
	if len(vocab) == 0 {
		return nil, fmt.Errorf("tokenizer: %s: empty vocabulary", vp)
	}
	var merges [][2]string
	for i, line := range strings.Split(string(mraw), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" || (i == 0 && strings.HasPrefix(line, "#version")) {
			continue
		}
		a, b, ok := strings.Cut(line, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("tokenizer: %s:%d: %q is not two tokens separated by a space", mp, i+1, line)
		}
		merges = append(merges, [2]string{a, b})
	}
	t := &fileTokenizer{name: vp, dir: dir, bos: -1, eos: -1, pad: -1,
		files: map[string][]byte{"vocab.json": vraw, "merges.txt": mraw}}
	if t.model, err = newBPE(vocab, merges, "", false, false, false); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", mp, err)
	}
	var pre preResult
	if err := parsePreTokenizer(json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false}`), "pre_tokenizer", &pre); err != nil {
		return nil, err
	}
	t.pre = pre.steps
	t.dec = []decoder{decodeByteLevel}
	if err := t.setVocab(vocab, nil); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", vp, err)
	}
	if err := t.readConfigs(); err != nil {
		return nil, err
	}
	// The named special tokens (and GPT-2's <|endoftext|>) are matched
	// whole, as added tokens.
	var specials []addedToken
	for _, id := range []int32{t.bos, t.eos} {
		if id >= 0 && !slices.ContainsFunc(specials, func(a addedToken) bool { return a.ID == id }) {
			specials = append(specials, addedToken{ID: id, Content: t.tokens[id], Special: true})
		}
	}
	if err := t.setVocab(vocab, specials); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", vp, err)
	}
	return t, nil
}

func (t *fileTokenizer) Name() string   { return t.name }
func (t *fileTokenizer) EOS() int32     { return t.eos }
func (t *fileTokenizer) VocabSize() int { return t.vocab }

// segment is a piece of the input: text to tokenize, or an added token.
type segment struct {
	text  string
	id    int32 // -1: text
	start bool  // the text begins the input
}

func (t *fileTokenizer) Encode(s string) []int32 {
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // each invalid byte reads as U+FFFD, as Python's text does
	}
	var out []int32
	for _, seg := range splitAdded([]segment{{text: s, id: -1, start: true}}, t.raw) {
		if seg.id >= 0 {
			out = append(out, seg.id)
			continue
		}
		text := seg.text
		for _, n := range t.norm {
			text = n(text)
		}
		for _, sub := range splitAdded([]segment{{text: text, id: -1, start: seg.start}}, t.normed) {
			if sub.id >= 0 {
				out = append(out, sub.id)
				continue
			}
			pieces := []string{sub.text}
			for _, p := range t.pre {
				pieces = p(pieces, sub.start)
			}
			for _, p := range pieces {
				out = t.model.encode(p, out)
			}
		}
	}
	return out
}

// splitAdded cuts the added tokens out of the text segments: at each
// position the longest token that matches (leftmost-longest, as the
// library's Aho-Corasick search), with lstrip/rstrip taking the spaces
// beside it and single_word requiring a word boundary on each side.
func splitAdded(segs []segment, added addedSet) []segment {
	if len(added.tokens) == 0 {
		return segs
	}
	var out []segment
	for _, seg := range segs {
		if seg.id >= 0 {
			out = append(out, seg)
			continue
		}
		s := seg.text
		last := 0
		for i := 0; i < len(s); {
			if !added.first[s[i]] {
				i++
				continue
			}
			a, ok := matchAdded(s, i, added.tokens)
			if !ok {
				i++
				continue
			}
			lo, hi := i, i+len(a.Content)
			if a.LStrip {
				for lo > last {
					r, n := utf8.DecodeLastRuneInString(s[last:lo])
					if !unicode.IsSpace(r) {
						break
					}
					lo -= n
				}
			}
			if a.RStrip {
				for hi < len(s) {
					r, n := utf8.DecodeRuneInString(s[hi:])
					if !unicode.IsSpace(r) {
						break
					}
					hi += n
				}
			}
			if lo > last {
				out = append(out, segment{text: s[last:lo], id: -1, start: seg.start && last == 0})
			}
			out = append(out, segment{id: a.ID})
			last, i = hi, hi
		}
		if last < len(s) {
			out = append(out, segment{text: s[last:], id: -1, start: seg.start && last == 0})
		}
	}
	return out
}

func matchAdded(s string, i int, added []addedToken) (addedToken, bool) {
	for _, a := range added {
		if !strings.HasPrefix(s[i:], a.Content) {
			continue
		}
		if a.SingleWord {
			before, _ := utf8.DecodeLastRuneInString(s[:i])
			after, _ := utf8.DecodeRuneInString(s[i+len(a.Content):])
			if (i > 0 && isWordChar(before)) || (i+len(a.Content) < len(s) && isWordChar(after)) {
				continue
			}
		}
		return a, true
	}
	return addedToken{}, false
}

func isWordChar(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func (t *fileTokenizer) Decode(ids []int32) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if id < 0 || int(id) >= t.vocab || id == t.eos || id == t.bos {
			continue
		}
		if s, ok := t.byID[id]; ok {
			toks = append(toks, s)
		} else if s := t.tokens[id]; s != "" {
			toks = append(toks, s)
		}
	}
	for _, d := range t.dec {
		toks = d(toks)
	}
	return strings.Join(toks, "")
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
