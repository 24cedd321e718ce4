// save.go: writing a tokenizer into an exported model directory, so that
// every directory the trainer writes names its own tokenizer: the files a
// tokenizer was read from, byte for byte; the byte tokenizer as a
// tokenizer.json (its 256 bytes as byte-fallback tokens <0x00>..<0xFF>,
// ids 0..255, and <|endoftext|> as id 256); GPT-2's as vocab.json +
// merges.txt, rebuilt from the compiled-in ranks. Each comes with a
// tokenizer_config.json naming the EOS, so that transformers'
// AutoTokenizer and this package's FromDir both read the directory.
//
// Limit: read back, the byte tokenizer matches "<|endoftext|>" in text as
// its EOS (as transformers does), which the builtin one never does, and
// reads invalid UTF-8 as U+FFFD; valid text without that string encodes
// the same.

package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
)

// Save writes tok's files into dir and returns their names.
func Save(tok Tokenizer, dir string) ([]string, error) {
	files, err := filesOf(tok)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: saving %s: %w", tok.Name(), err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		err := atomicfile.WriteFile(filepath.Join(dir, name), 0o644, func(w io.Writer) error {
			_, err := w.Write(files[name])
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("tokenizer: saving %s: %w", tok.Name(), err)
		}
	}
	return names, nil
}

func filesOf(tok Tokenizer) (map[string][]byte, error) {
	switch t := tok.(type) {
	case *fileTokenizer:
		return t.files, nil
	case byteTokenizer:
		return byteFiles()
	case *gpt2Tokenizer:
		return t.files()
	case *scoreTokenizer:
		return t.files()
	}
	return nil, fmt.Errorf("no file form for a %T", tok)
}

// specialJSON is an added token as tokenizer.json writes it.
func specialJSON(id int, content string) map[string]any {
	return map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false,
		"rstrip": false, "normalized": false, "special": true}
}

const endOfText = "<|endoftext|>"

func byteFiles() (map[string][]byte, error) {
	vocab := make(map[string]int, 256)
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = b
	}
	tj := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   []any{specialJSON(byteEOS, endOfText)},
		"normalizer":     nil,
		"pre_tokenizer":  nil,
		"post_processor": nil,
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"}}},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil,
			"continuing_subword_prefix": nil, "end_of_word_suffix": nil, "fuse_unk": false,
			"byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": []any{}},
	}
	return withConfig("tokenizer.json", tj, map[string]any{
		"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": endOfText, "bos_token": nil,
		"add_bos_token": false, "add_eos_token": false, "clean_up_tokenization_spaces": false,
	})
}

// files rebuilds GPT-2's vocab.json and merges.txt from the ranks: each
// token of two or more bytes is the merge of the two parts that byte-pair
// merging with only the lower ranks leaves of it (the usual conversion of
// tiktoken ranks; for r50k it gives Hugging Face's gpt2 files).
func (t *gpt2Tokenizer) files() (map[string][]byte, error) {
	pieces := make([]string, gpt2EOS)
	rank := make(map[string]int, gpt2EOS)
	for id := range gpt2EOS {
		s, err := t.codec.Decode([]uint{uint(id)})
		if err != nil {
			return nil, fmt.Errorf("id %d: %w", id, err)
		}
		pieces[id] = s
		rank[s] = id
	}
	vocab := make(map[string]int, gpt2Vocab)
	for id, s := range pieces {
		vocab[toByteLevel(s)] = id
	}
	vocab[endOfText] = gpt2EOS
	var merges bytes.Buffer
	merges.WriteString("#version: 0.2\n")
	for id, s := range pieces {
		if len(s) < 2 {
			continue
		}
		parts := rankMerge(s, rank, id)
		if len(parts) != 2 {
			return nil, fmt.Errorf("token %d (%q) is not the merge of two lower-ranked tokens", id, s)
		}
		fmt.Fprintf(&merges, "%s %s\n", toByteLevel(parts[0]), toByteLevel(parts[1]))
	}
	vj, err := json.Marshal(vocab)
	if err != nil {
		return nil, err
	}
	files, err := withConfig("", nil, map[string]any{
		"tokenizer_class": "GPT2Tokenizer", "bos_token": endOfText, "eos_token": endOfText,
		"unk_token": endOfText, "add_prefix_space": false, "add_bos_token": false,
	})
	if err != nil {
		return nil, err
	}
	files["vocab.json"] = vj
	files["merges.txt"] = merges.Bytes()
	return files, nil
}

// rankMerge splits s into bytes and merges the adjacent pair of lowest
// rank below limit until none is left.
func rankMerge(s string, rank map[string]int, limit int) []string {
	parts := make([]string, len(s))
	for i := range len(s) {
		parts[i] = s[i : i+1]
	}
	for len(parts) > 1 {
		best, at := limit, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := rank[parts[i]+parts[i+1]]; ok && r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		parts[at] += parts[at+1]
		parts = slices.Delete(parts, at+1, at+2)
	}
	return parts
}

// withConfig returns the files of a tokenizer: name holding v as JSON
// (none when name is ""), and tokenizer_config.json holding cfg.
func withConfig(name string, v any, cfg map[string]any) (map[string][]byte, error) {
	files := map[string][]byte{}
	if name != "" {
		b, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			return nil, err
		}
		files[name] = append(b, '\n')
	}
	b, err := json.MarshalIndent(cfg, "", " ")
	if err != nil {
		return nil, err
	}
	files["tokenizer_config.json"] = append(b, '\n')
	return files, nil
}
