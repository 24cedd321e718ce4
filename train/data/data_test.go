// Tests for loading: Alpaca JSON/JSONL parsing, templates and error
// positions, drop versus truncate, the train/eval split, plain text windows,
// Load's errors, and (when ../shared/data is present) the shared data sets.

package data

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAlpacaTemplates(t *testing.T) {
	wantIn := "Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.\n\n### Instruction:\nTranslate.\n\n### Input:\nbonjour\n\n### Response:\n"
	wantNo := "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n### Instruction:\nSay hi.\n\n### Response:\n"
	if got := AlpacaPrompt("Translate.", "bonjour"); got != wantIn {
		t.Errorf("with input:\n%q\nwant\n%q", got, wantIn)
	}
	for _, in := range []string{"", "  \n"} {
		if got := AlpacaPrompt("Say hi.", in); got != wantNo {
			t.Errorf("input %q:\n%q\nwant\n%q", in, got, wantNo)
		}
	}
}

func TestParseAlpaca(t *testing.T) {
	want := []Record{
		{AlpacaPrompt("Say hi.", ""), "hi"},
		{AlpacaPrompt("Translate.", "bonjour"), "hello"},
		{AlpacaPrompt("Nothing to say.", ""), ""},
	}
	tests := []struct{ name, content, kind string }{
		{"array", `[
  {"instruction": "Say hi.", "input": "", "output": "hi", "extra": [1, {"x": 2}]},
  {"instruction": "Translate.", "input": "bonjour", "output": "hello"},
  {"instruction": "Nothing to say.", "output": "", "history": null}
]`, "JSON array"},
		{"jsonl", "{\"instruction\": \"Say hi.\", \"output\": \"hi\", \"id\": 7}\n\n" +
			"{\"instruction\": \"Translate.\", \"input\": \"bonjour\", \"output\": \"hello\"}\r\n" +
			"{\"Instruction\": \"Nothing to say.\", \"input\": null, \"output\": \"\"}", "JSONL"},
		{"bom and spaces", "\xef\xbb\xbf \n [{\"instruction\":\"Say hi.\",\"output\":\"hi\"},{\"instruction\":\"Translate.\",\"input\":\"bonjour\",\"output\":\"hello\"},{\"instruction\":\"Nothing to say.\",\"output\":\"\"}]", "JSON array"},
	}
	for _, tc := range tests {
		got, kind, err := parseAlpaca(tc.name, []byte(tc.content))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if kind != tc.kind || !slices.Equal(got, want) {
			t.Errorf("%s: kind %q records\n%q\nwant %q\n%q", tc.name, kind, got, tc.kind, want)
		}
	}
}

func TestParseAlpacaErrors(t *testing.T) {
	tests := []struct {
		name, content string
		want          []string // substrings of the error
	}{
		{"array syntax", "[\n  {\"instruction\": \"a\", \"output\": \"b\"},\n  {\"instruction\": \"a\",\n   \"output\" \"b\"}\n]",
			[]string{"f.json:4:13:", "malformed JSON"}},
		{"array missing comma", "[\n{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\", \"output\": \"b\"}\n]",
			[]string{"f.json:3:1:"}},
		{"array trailing comma", "[\n{\"instruction\": \"a\", \"output\": \"b\"},\n]\n",
			[]string{"f.json:3:1:"}},
		{"array truncated", "[\n{\"instruction\": \"a\", \"output\": \"b\"},\n{\"instruction\": \"a\"\n",
			[]string{"f.json:3:", "malformed JSON"}},
		{"array trailing garbage", "[{\"instruction\": \"a\", \"output\": \"b\"}]\nx\n",
			[]string{"f.json:2:1:"}},
		{"jsonl syntax", "{\"instruction\": \"a\", \"output\": \"b\"}\n\n{\"instruction\": \"a\", \"output\": b}\n",
			[]string{"f.json:3:32:", "malformed JSON"}},
		{"jsonl two objects on a line", "{\"instruction\": \"a\", \"output\": \"b\"} {\"instruction\": \"c\", \"output\": \"d\"}\n",
			[]string{"f.json:1:37:"}},
		{"missing instruction", "[\n{\"instruction\": \"a\", \"output\": \"b\"},\n\n  {\"input\": \"a\", \"output\": \"b\"}]",
			[]string{"record 1 (line 4)", `missing field "instruction"`}},
		{"blank instruction", "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \" \", \"output\": \"b\"}",
			[]string{"record 1 (line 2)", `field "instruction" is empty`}},
		{"missing output", "{\"instruction\": \"a\", \"output\": \"b\"}\n\n{\"instruction\": \"a\", \"output\": null}",
			[]string{"record 1 (line 3)", `missing field "output"`}},
		{"wrong type", "[{\"instruction\": \"a\", \"output\": \"b\"},\n {\"instruction\": 5, \"output\": \"b\"}]",
			[]string{"record 1 (line 2)", `"instruction"`, "number"}},
		{"not an object", "[{\"instruction\": \"a\", \"output\": \"b\"}, \"text\"]",
			[]string{"record 1 (line 1)", "want an object"}},
		{"empty array", " [ ] ", []string{"no records"}},
		{"only spaces", " \n\t\n", []string{"f.json is empty"}},
	}
	for _, tc := range tests {
		_, _, err := parseAlpaca("f.json", []byte(tc.content))
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", tc.name, err, w)
			}
		}
	}
}

func TestLoadErrors(t *testing.T) {
	tok := tokenizer.Byte()
	opt := Options{SeqLen: 64, EvalFraction: 0.1}
	empty := writeFile(t, "empty.jsonl", "")
	emptyTxt := writeFile(t, "empty.txt", "")
	oneByte := writeFile(t, "one.txt", "x")
	tests := []struct {
		path string
		opt  Options
		want string
	}{
		{filepath.Join(t.TempDir(), "missing.json"), opt, "missing.json: no such file"},
		{empty, opt, "empty.jsonl is empty"},
		{emptyTxt, opt, "empty.txt is empty"},
		{oneByte, opt, "at least 2"},
		{"builtin:nope", opt, "add, copy, reverse, sort"},
		{"builtin:add:zero", opt, "not a positive integer"},
		{"builtin:add:1:2", opt, "builtin:TASK:N"},
		{"builtin", Options{SeqLen: 0}, "sequence length 0"},
		{"builtin", Options{SeqLen: 8, EvalFraction: 1}, "eval fraction"},
		{"builtin", Options{SeqLen: 8, EvalFraction: -0.1}, "eval fraction"},
		{"builtin:reverse:50", Options{SeqLen: 8}, "all 50 examples dropped: 50 are longer than 9 tokens (sequence length 8 + 1"},
	}
	for _, tc := range tests {
		_, err := Load(tc.path, tok, tc.opt)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%q): error %v, want it to contain %q", tc.path, err, tc.want)
		}
	}
	if _, err := Load("builtin", nil, opt); err == nil {
		t.Error("Load with no tokenizer succeeded")
	}
}

func TestDropVersusTruncate(t *testing.T) {
	recs := []Record{
		{"ab", "cd"},          // 5 tokens: fits T+1 = 11
		{"abcdefgh", "ijk"},   // 12: cut, prompt 8 <= 10
		{"abcdefghij", "xy"},  // 13: cut, prompt 10 keeps one response token
		{"abcdefghijk", "xy"}, // 14: prompt 11 > 10, dropped either way
		{"", "0123456789"},    // 11: fits, no prompt
	}
	tok := tokenizer.Byte()
	tests := []struct {
		truncate                  bool
		train, dropped, truncated int
	}{
		{false, 2, 3, 0},
		{true, 4, 1, 2},
	}
	for _, tc := range tests {
		ds, err := FromRecords(recs, tok, Options{SeqLen: 10, Truncate: tc.truncate})
		if err != nil {
			t.Fatal(err)
		}
		if len(ds.Train) != tc.train || len(ds.Eval) != 0 || ds.Dropped != tc.dropped || ds.Truncated != tc.truncated {
			t.Errorf("truncate=%v: train %d eval %d dropped %d truncated %d, want %d 0 %d %d",
				tc.truncate, len(ds.Train), len(ds.Eval), ds.Dropped, ds.Truncated, tc.train, tc.dropped, tc.truncated)
		}
		if _, err := NewLoader(ds.Train, 2, 10, 1); err != nil {
			t.Errorf("truncate=%v: examples do not fit: %v", tc.truncate, err)
		}
		if tc.truncate {
			cut := ds.Train[2] // record 2
			if len(cut.Tokens) != 11 || cut.PromptLen != 10 || cut.Tokens[10] != 'x' {
				t.Errorf("record 2 cut to %v (prompt %d)", cut.Tokens, cut.PromptLen)
			}
		}
	}
	_, err := FromRecords(recs[3:4], tok, Options{SeqLen: 10, Truncate: true})
	if err == nil || !strings.Contains(err.Error(), "with prompts of at least 11 tokens") {
		t.Errorf("all dropped with truncation: %v", err)
	}
	if _, err := FromRecords([]Record{{"a", "b"}, {"", ""}}, tok, Options{SeqLen: 10}); err == nil {
		t.Error("an empty record was accepted")
	}
}

// TestSeqLenKeeping checks the sequence length that keeps a share of the
// examples whole, which the run's drop warning and error suggest, against
// the lengths Dataset records before dropping.
func TestSeqLenKeeping(t *testing.T) {
	var recs []Record
	for i := range 20 {
		recs = append(recs, Record{"p", strings.Repeat("x", i)}) // i+2 tokens
	}
	ds, err := FromRecords(recs, tokenizer.Byte(), Options{SeqLen: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds.Lengths) != 20 || ds.Lengths[19] != 21 || ds.Dropped != 15 {
		t.Fatalf("lengths %v, dropped %d; want 2..21 and 15", ds.Lengths, ds.Dropped)
	}
	for _, tc := range []struct {
		share float64
		want  int
	}{{0.9, 18}, {1, 20}, {0.05, 1}, {0.5, 10}} {
		got := SeqLenKeeping(ds.Lengths, tc.share)
		if got != tc.want {
			t.Errorf("SeqLenKeeping(%v) = %d, want %d", tc.share, got, tc.want)
		}
		if kept := ShareKept(ds.Lengths, got); kept < tc.share {
			t.Errorf("--seq-len %d keeps %v, less than %v", got, kept, tc.share)
		}
	}
}

// TestBuiltinDefault: "builtin" is the default job's task, sort, all of
// whose examples fit the default --seq-len of 24.
func TestBuiltinDefault(t *testing.T) {
	ds, err := Load("builtin", tokenizer.Byte(), Options{SeqLen: 24, EvalFraction: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ds.Source, "builtin:sort ") || ds.Dropped != 0 {
		t.Errorf("builtin loaded %q, dropped %d; want builtin:sort, none dropped", ds.Source, ds.Dropped)
	}
}

func TestEvalCount(t *testing.T) {
	tests := []struct {
		n    int
		frac float64
		want int
	}{
		{0, 0.1, 0}, {1, 0.5, 0}, {2, 0.01, 1}, {2, 0.9, 1}, {100, 0.05, 5},
		{1000, 0.05, 50}, {10, 0, 0}, {19, 0.05, 1}, {30, 0.05, 2},
	}
	for _, tc := range tests {
		if got := evalCount(tc.n, tc.frac); got != tc.want {
			t.Errorf("evalCount(%d, %v) = %d, want %d", tc.n, tc.frac, got, tc.want)
		}
	}
}

// promptKey is the prompt part of an example, as a map key.
func promptKey(ex Example) string {
	return tokenizer.Byte().Decode(ex.Tokens[:ex.PromptLen])
}

func TestSplitNoOverlap(t *testing.T) {
	tok := tokenizer.Byte()
	ds, err := Load("builtin:add:2000", tok, Options{SeqLen: 16, EvalFraction: 0.1, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds.Eval) != 200 || len(ds.Train) != 1800 || len(ds.EvalRecords) != 200 || ds.Dropped != 0 {
		t.Fatalf("train %d eval %d records %d dropped %d", len(ds.Train), len(ds.Eval), len(ds.EvalRecords), ds.Dropped)
	}
	checkDisjoint(t, ds)
	for i, r := range ds.EvalRecords {
		if want := encodeRecord(r, tok); !slices.Equal(want.Tokens, ds.Eval[i].Tokens) {
			t.Fatalf("EvalRecords[%d] %q is not behind Eval[%d]", i, r.Prompt, i)
		}
	}
	again, _ := Load("builtin:add:2000", tok, Options{SeqLen: 16, EvalFraction: 0.1, Seed: 9})
	if !slices.Equal(again.EvalRecords, ds.EvalRecords) {
		t.Error("the split is not deterministic")
	}

	// Repeated prompts (ten answers each) never straddle the split.
	var recs []Record
	for i := range 300 {
		recs = append(recs, Record{Prompt: string(rune('A'+i%30)) + "?", Response: string(rune('a' + i%26))})
	}
	ds, err = FromRecords(recs, tok, Options{SeqLen: 8, EvalFraction: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds.Eval) != 20 || len(ds.Train) != 280 { // 15 asked: two whole groups of 10
		t.Errorf("grouped split: train %d eval %d", len(ds.Train), len(ds.Eval))
	}
	checkDisjoint(t, ds)

	// One prompt only: eval would empty train, so it stays empty.
	ds, _ = FromRecords(recs[:1:1], tok, Options{SeqLen: 8, EvalFraction: 0.5})
	same, _ := FromRecords([]Record{recs[0], recs[0]}, tok, Options{SeqLen: 8, EvalFraction: 0.5})
	if len(ds.Train) != 1 || len(ds.Eval) != 0 || len(same.Train) != 2 || len(same.Eval) != 0 {
		t.Errorf("single prompt: %d/%d and %d/%d", len(ds.Train), len(ds.Eval), len(same.Train), len(same.Eval))
	}
}

func checkDisjoint(t *testing.T, ds *Dataset) {
	t.Helper()
	train := map[string]bool{}
	for _, ex := range ds.Train {
		train[promptKey(ex)] = true
	}
	for _, ex := range ds.Eval {
		if train[promptKey(ex)] {
			t.Fatalf("prompt %q is in train and eval", promptKey(ex))
		}
	}
}

func TestLoadAlpacaFile(t *testing.T) {
	content := "{\"instruction\": \"Say hi.\", \"output\": \"hi\"}\n{\"instruction\": \"Say bye.\", \"output\": \"bye\"}\n"
	for _, name := range []string{"d.jsonl", "d.JSON"} { // content decides the format
		p := writeFile(t, name, content)
		ds, err := Load(p, tokenizer.Byte(), Options{SeqLen: 256, EvalFraction: 0.05, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(ds.Train) != 1 || len(ds.Eval) != 1 || !strings.Contains(ds.Source, "JSONL") {
			t.Errorf("%s: train %d eval %d source %q", name, len(ds.Train), len(ds.Eval), ds.Source)
		}
		ex := ds.Train[0]
		if got := tokenizer.Byte().Decode(ex.Tokens[:ex.PromptLen]); !strings.HasSuffix(got, "### Response:\n") {
			t.Errorf("prompt %q", got)
		}
		if ex.Tokens[len(ex.Tokens)-1] != eos {
			t.Error("example does not end with EOS")
		}
	}
	p := writeFile(t, "bad.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n{oops}\n")
	if _, err := Load(p, tokenizer.Byte(), Options{SeqLen: 256}); err == nil || !strings.Contains(err.Error(), "bad.jsonl:2:2:") {
		t.Errorf("malformed JSONL via Load: %v", err)
	}
}

func TestPlainText(t *testing.T) {
	text := "abcdefghijklmnopqrstuvwxy" // 25 bytes
	p := writeFile(t, "t.txt", text)
	ds, err := Load(p, tokenizer.Byte(), Options{SeqLen: 8, EvalFraction: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	// Windows start at 0, 8, 16: [0,9) [8,17) [16,25); round(0.9) = 1 for eval.
	if len(ds.Train) != 2 || len(ds.Eval) != 1 || len(ds.EvalRecords) != 0 {
		t.Fatalf("train %d eval %d records %d", len(ds.Train), len(ds.Eval), len(ds.EvalRecords))
	}
	if got := tokenizer.Byte().Decode(ds.Eval[0].Tokens); got != text[16:] {
		t.Errorf("eval window %q, want the tail %q", got, text[16:])
	}
	// Every token but the first is a target exactly once.
	var targets []byte
	for _, b := range EvalBatches(append(slices.Clone(ds.Train), ds.Eval...), 1, 8) {
		for _, tg := range b.Targets {
			if tg >= 0 {
				targets = append(targets, byte(tg))
			}
		}
	}
	if string(targets) != text[1:] {
		t.Errorf("targets %q, want %q", targets, text[1:])
	}
	// 26 bytes: a last window of two tokens.
	if got := windows(make([]int32, 26), 8); len(got) != 4 || len(got[3].Tokens) != 2 {
		t.Errorf("26 tokens: %d windows", len(got))
	}
}

// sharedData returns a file of ../shared/data or skips the test.
func sharedData(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join("..", "..", "..", "shared", "data", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared data %s absent: %v", p, err)
	}
	return p
}

func TestSharedAlpacaDemo(t *testing.T) {
	p := sharedData(t, "alpaca_en_demo.json")
	if testing.Short() {
		t.Skip("GPT-2 encoding of 999 records three times: seconds under -race")
	}
	tok, err := tokenizer.GPT2()
	if err != nil {
		t.Fatal(err)
	}
	const n, T = 999, 512
	opt := Options{SeqLen: T, EvalFraction: 0.05, Seed: 1}
	ds, err := Load(p, tok, opt)
	if err != nil {
		t.Fatal(err)
	}
	kept := len(ds.Train) + len(ds.Eval)
	t.Logf("%s: train %d eval %d dropped %d", ds.Source, len(ds.Train), len(ds.Eval), ds.Dropped)
	if kept+ds.Dropped != n || ds.Truncated != 0 || ds.Dropped == 0 || len(ds.Eval) < evalCount(kept, 0.05) || len(ds.EvalRecords) != len(ds.Eval) {
		t.Errorf("train %d eval %d dropped %d truncated %d", len(ds.Train), len(ds.Eval), ds.Dropped, ds.Truncated)
	}
	if _, err := NewLoader(ds.Train, 4, T, 1); err != nil {
		t.Error(err)
	}
	// Re-count the over-long records independently of the split.
	recs, err := ReadAlpaca(p)
	if err != nil || len(recs) != n {
		t.Fatalf("ReadAlpaca: %d records, %v", len(recs), err)
	}
	long, longPrompt := 0, 0
	for _, r := range recs {
		np, nr := len(tok.Encode(r.Prompt)), len(tok.Encode(r.Response))
		if np+nr+1 > T+1 {
			long++
			if np > T {
				longPrompt++
			}
		}
	}
	if long != ds.Dropped {
		t.Errorf("dropped %d, counted %d over %d tokens", ds.Dropped, long, T+1)
	}
	opt.Truncate = true
	tr, err := Load(p, tok, opt)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Dropped != longPrompt || tr.Truncated != long-longPrompt || len(tr.Train)+len(tr.Eval) != n-longPrompt {
		t.Errorf("truncating: dropped %d truncated %d, want %d %d", tr.Dropped, tr.Truncated, longPrompt, long-longPrompt)
	}
}

func TestSharedShakespeare(t *testing.T) {
	p := sharedData(t, "tinyshakespeare.txt")
	ds, err := Load(p, tokenizer.Byte(), Options{SeqLen: 1024, EvalFraction: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	// 1,115,394 bytes: windows start every 1024 while a target remains.
	const windows = (1115394 - 1 + 1023) / 1024
	if len(ds.Train)+len(ds.Eval) != windows || len(ds.Eval) != 109 {
		t.Errorf("%s: train %d eval %d, want %d windows, 109 eval", ds.Source, len(ds.Train), len(ds.Eval), windows)
	}
	if testing.Short() {
		return
	}
	tok, err := tokenizer.GPT2()
	if err != nil {
		t.Fatal(err)
	}
	ds, err = Load(p, tok, Options{SeqLen: 1024, EvalFraction: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gpt2: %s", ds.Source)
	// nanoGPT's shakespeare prepare.py reports 301,966 + 36,059 GPT-2 tokens
	// for its 90/10 split of this file.
	const gpt2Tokens = 338025
	if n := (len(ds.Train)+len(ds.Eval)-1)*1024 + len(ds.Eval[len(ds.Eval)-1].Tokens); n != gpt2Tokens {
		t.Errorf("gpt2: %d tokens, want %d", n, gpt2Tokens)
	}
}

// TestTemplateDoc keeps TEMPLATE.md's Go strings equal to the code's.
func TestTemplateDoc(t *testing.T) {
	doc, err := os.ReadFile("TEMPLATE.md")
	if err != nil {
		t.Fatal(err)
	}
	var quoted []string
	for _, line := range strings.Split(string(doc), "\n") {
		if s, ok := strings.CutPrefix(line, "    \""); ok {
			u, err := strconv.Unquote("\"" + s)
			if err != nil {
				t.Fatalf("TEMPLATE.md line %q: %v", line, err)
			}
			quoted = append(quoted, u)
		}
	}
	if want := []string{alpacaWithInput, alpacaNoInput}; !slices.Equal(quoted, want) {
		t.Errorf("TEMPLATE.md states\n%q\nthe code has\n%q", quoted, want)
	}
}
