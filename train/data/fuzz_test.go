// Fuzzing of the readers of user data files: Alpaca JSON/JSONL and plain
// text. Every input either loads, the same way twice, into examples that
// respect the options (lengths, token range, prompt lengths, a train/eval
// split with no prompt on both sides), or is refused with an error naming
// the file; and loading allocates no more than a bounded multiple of the
// file's size. The seeds (testdata/*.json*, testdata/sample.txt, the cases
// below and testdata/fuzz/FuzzXxx) run in every `go test`; `make fuzz`
// mutates them. The sample files are written for this project, in the
// layout of the public Alpaca data (../shared/data is never read here).

package data

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/internal/alloc"

	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Allocation bound: allocSlack bytes plus allocPerByte per input byte. An
// Alpaca record is rendered into a prompt template of about 130 bytes,
// whatever its size (a 32-byte JSONL line becomes ~130 bytes of prompt,
// 4 bytes per token id, and the record and example around it), so the
// per-byte factor is larger than for a binary format. It is still a
// constant: nothing in a file can make the loader allocate out of
// proportion to the file.
const (
	allocSlack   = 1 << 20
	allocPerByte = 256
)

// fuzzOptions are the loader options of the fuzz targets: a short sequence
// so that truncation and dropping both happen, and an eval split.
var fuzzOptions = Options{SeqLen: 48, Truncate: true, EvalFraction: 0.25, Seed: 7}

func readSeed(f *testing.F, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		f.Fatal(err)
	}
	return b
}

func FuzzAlpaca(f *testing.F) {
	f.Add(readSeed(f, "alpaca-sample.json"))
	f.Add(readSeed(f, "alpaca-sample.jsonl"))
	f.Add(readSeed(f, "chat-sample.jsonl"))
	f.Add(readSeed(f, "sharegpt-sample.json"))
	for _, s := range []string{
		"",
		" \n\t",
		"[]",
		"[{\"instruction\":\"a\",\"output\":\"b\"}]",
		"\xef\xbb\xbf[{\"Instruction\":\"a\",\"INPUT\":\"x\",\"output\":\"\"}]",
		"{\"instruction\":\"a\",\"output\":\"b\"}\r\n\r\n{\"instruction\":\"c\",\"input\":null,\"output\":\"d\",\"extra\":[1,{}]}",
		"[{\"instruction\":\"a\",\"output\":\"b\"},]",
		"[{\"instruction\":\"a\",\"output\":\"b\"}] x",
		"[{\"instruction\":5,\"output\":\"b\"}]",
		"[{\"instruction\":\" \",\"output\":\"b\"}]",
		"[{\"instruction\":\"a\"}]",
		"[null, 1, \"s\", []]",
		"{\"instruction\":\"a\",\"output\":\"b\"} {\"instruction\":\"c\",\"output\":\"d\"}",
		"{\"instruction\":\"a\",\"output\":\"b\"}\n{oops}\n",
		"[{\"instruction\":\"a\",\"output\":\"b\"},\n{\"instruction\":\"a\"",
		"[{\"instruction\":\"\\ud800\\u00e9\",\"output\":\"\xff\xfe\"}]",
		"[{\"instruction\":\"the same prompt\",\"output\":\"1\"},{\"instruction\":\"the same prompt\",\"output\":\"2\"},{\"instruction\":\"other\",\"output\":\"3\"}]",
		"{\"instruction\":\"" + strings.Repeat("long ", 40) + "\",\"output\":\"x\"}",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}\n{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
		"[{\"conversations\":[{\"from\":\"human\",\"value\":\"a\"},{\"from\":\"gpt\",\"value\":\"b\"},{\"from\":\"human\",\"value\":\"c\"},{\"from\":\"gpt\",\"value\":\"d\"}]}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		path := filepath.Join(t.TempDir(), "in.json")
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		recs, readErr := ReadAlpaca(path)
		if readErr != nil && !strings.Contains(readErr.Error(), path) {
			t.Fatalf("ReadAlpaca: error %q does not name the file %s", readErr, path)
		}
		if readErr == nil {
			again, err := ReadAlpaca(path)
			if err != nil || !reflect.DeepEqual(recs, again) {
				t.Fatalf("reading twice gave different records (second error %v)", err)
			}
		}
		checkLoad(t, path, len(raw), func(ds *Dataset) {
			if strings.HasPrefix(ds.Source, "messages ") || strings.HasPrefix(ds.Source, "sharegpt ") {
				return // conversations, which ReadAlpaca does not read (chat_test.go checks them)
			}
			if readErr != nil {
				t.Fatalf("Load succeeded where ReadAlpaca failed: %v", readErr)
			}
			checkDisjoint(t, ds)
			if n := len(ds.Train) + len(ds.Eval) + ds.Dropped; n != len(recs) {
				t.Fatalf("%d records became %d train + %d eval + %d dropped", len(recs), len(ds.Train), len(ds.Eval), ds.Dropped)
			}
			for i, ex := range ds.Eval {
				want := encodeRecord(ds.EvalRecords[i], tokenizer.Byte()).Tokens
				if !reflect.DeepEqual(ex.Tokens, want[:min(len(want), len(ex.Tokens))]) {
					t.Fatalf("eval example %d is not its record's encoding", i)
				}
			}
		})
	})
}

func FuzzText(f *testing.F) {
	f.Add(readSeed(f, "sample.txt"))
	for _, s := range []string{"", "x", "xy", "\x00\xff", "é", strings.Repeat("ab", 100), "line\r\nline\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		path := filepath.Join(t.TempDir(), "in.txt")
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		checkLoad(t, path, len(raw), func(ds *Dataset) {
			// The windows overlap by one token and together are the whole
			// file, byte for byte (byte tokenizer).
			all := append(ds.Train, ds.Eval...)
			var got []byte
			for i, ex := range all {
				if ex.PromptLen != 0 {
					t.Fatalf("text window %d has PromptLen %d", i, ex.PromptLen)
				}
				if i > 0 && len(all[i-1].Tokens) != fuzzOptions.SeqLen+1 {
					t.Fatalf("window %d of %d is short (%d tokens)", i-1, len(all), len(all[i-1].Tokens))
				}
				toks := ex.Tokens
				if i > 0 {
					toks = toks[1:]
				}
				got = append(got, tokenizer.Byte().Decode(toks)...)
			}
			if string(got) != string(raw) {
				t.Fatalf("windows hold %q, the file %q", got, raw)
			}
		})
	})
}

// checkLoad loads path with the byte tokenizer twice and checks the common
// properties; ok runs the format's own checks on a loaded dataset.
func checkLoad(t *testing.T, path string, size int, ok func(*Dataset)) {
	tok := tokenizer.Byte()
	var ds *Dataset
	var err error
	used := alloc.Bytes(func() { ds, err = Load(path, tok, fuzzOptions) })
	if limit := allocPerByte*uint64(size) + allocSlack; used > limit {
		t.Fatalf("loading a %d-byte file allocated %d bytes (limit %d); err = %v", size, used, limit, err)
	}
	if err != nil {
		if !strings.Contains(err.Error(), path) {
			t.Fatalf("Load: error %q does not name the file %s", err, path)
		}
		return
	}
	again, err := Load(path, tok, fuzzOptions)
	if err != nil || !reflect.DeepEqual(ds, again) {
		t.Fatalf("loading twice gave different datasets (second error %v)", err)
	}
	if len(ds.Train) == 0 {
		t.Fatalf("a loaded dataset has no training example")
	}
	for _, set := range [][]Example{ds.Train, ds.Eval} {
		for i, ex := range set {
			if len(ex.Tokens) < 2 || len(ex.Tokens) > fuzzOptions.SeqLen+1 {
				t.Fatalf("example %d has %d tokens (sequence length %d)", i, len(ex.Tokens), fuzzOptions.SeqLen)
			}
			if ex.PromptLen < 0 || ex.PromptLen >= len(ex.Tokens) {
				t.Fatalf("example %d: PromptLen %d of %d tokens leaves no target", i, ex.PromptLen, len(ex.Tokens))
			}
			for _, id := range ex.Tokens {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("example %d holds id %d", i, id)
				}
			}
		}
	}
	ok(ds)
}
