// Tests of the conversation formats: each format read (array and JSONL),
// the rendering and its target mask counted turn by turn, the record exact
// match scores, truncation of a conversation, and the errors of malformed
// files naming the file, the record, its line, the turn and the field.

package data

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// The same conversation in each format and layout.
var chatFiles = []struct{ name, content, source string }{
	{"messages.json", `[
  {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]},
  {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "id": 7}
]`, "messages JSON array"},
	{"messages.jsonl", `{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]}

{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
`, "messages JSONL"},
	{"sharegpt.json", `[{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"},
  {"from": "human", "value": "and 3+3?"}, {"from": "gpt", "value": "6"}]},
 {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]`, "sharegpt JSON array"},
	{"sharegpt.jsonl", `{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}, {"from": "human", "value": "and 3+3?"}, {"from": "gpt", "value": "6"}]}
{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}`, "sharegpt JSONL"},
}

// render is the fixed format by hand, with the byte tokenizer: each turn
// "<|im_start|>role\n" ++ content ++ [EOS].
func render(turns ...string) []int32 {
	var t []int32
	for i := 0; i < len(turns); i += 2 {
		for _, c := range []byte("<|im_start|>" + turns[i] + "\n" + turns[i+1]) {
			t = append(t, int32(c))
		}
		t = append(t, eos)
	}
	return t
}

func TestChatFormats(t *testing.T) {
	want0 := render("system", "Be brief.", "user", "2+2?", "assistant", "4", "user", "and 3+3?", "assistant", "6")
	want1 := render("user", "hi", "assistant", "hello")
	for _, f := range chatFiles {
		ds, err := Load(writeFile(t, f.name, f.content), tokenizer.Byte(), Options{SeqLen: 200})
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if !strings.HasPrefix(ds.Source, f.source+" ") {
			t.Errorf("%s: source %q, want %q first", f.name, ds.Source, f.source)
		}
		if len(ds.Train) != 2 || !slices.Equal(ds.Train[0].Tokens, want0) || !slices.Equal(ds.Train[1].Tokens, want1) {
			t.Fatalf("%s: examples %v, want the fixed rendering %v and %v", f.name, ds.Train, want0, want1)
		}
		if got, want := ds.Lengths, []int{len(want0), len(want1)}; !slices.Equal(got, want) {
			t.Errorf("%s: lengths %v, want %v", f.name, got, want)
		}
	}
}

// TestChatTargetsPerTurn counts the targets of a batch row turn by turn:
// every assistant turn's content and its EOS, nothing of the system and
// user turns or the headers.
func TestChatTargetsPerTurn(t *testing.T) {
	turns := []Turn{{RoleSystem, "sys"}, {RoleUser, "u1"}, {RoleAssistant, "first answer"},
		{RoleUser, "u2 is longer"}, {RoleAssistant, "2nd"}, {RoleUser, "u3"}, {RoleAssistant, "the last one"}}
	ex, rec, prompt := encodeConversation(turns, tokenizer.Byte())
	T := len(ex.Tokens) + 5
	b := EvalBatches([]Example{ex}, 1, T)[0]
	// The tokens of each turn: its header, its content and its EOS.
	pos := 0
	total := 0
	for i, turn := range turns {
		n := len("<|im_start|>"+turn.Role+"\n") + len(turn.Content) + 1
		// Token j is a target when position j-1 predicts it.
		targets := 0
		for j := max(pos, 1); j < pos+n; j++ {
			if b.Targets[j-1] != -1 {
				if b.Targets[j-1] != ex.Tokens[j] {
					t.Fatalf("turn %d: target at %d is %d, want the token %d", i, j-1, b.Targets[j-1], ex.Tokens[j])
				}
				targets++
			}
		}
		want := 0
		if turn.Role == RoleAssistant {
			want = len(turn.Content) + 1 // the content and the EOS
		}
		if targets != want {
			t.Errorf("turn %d (%s %q): %d targets, want %d", i, turn.Role, turn.Content, targets, want)
		}
		total += targets
		pos += n
	}
	if pos != len(ex.Tokens) || b.NumTargets != total {
		t.Errorf("turns cover %d of %d tokens; NumTargets %d, counted %d", pos, len(ex.Tokens), b.NumTargets, total)
	}
	// Exact match: the last assistant turn, from the tokens before its content.
	if rec.Response != "the last one" || !strings.HasSuffix(rec.Prompt, "u3<|im_end|><|im_start|>assistant\n") ||
		!strings.HasPrefix(rec.Prompt, "<|im_start|>system\nsys<|im_end|>") {
		t.Errorf("record %+v", rec)
	}
	if want := ex.Tokens[:len(ex.Tokens)-len("the last one")-1]; !slices.Equal(prompt, want) {
		t.Errorf("prompt tokens %v, want %v", prompt, want)
	}
}

// TestChatEvalRecords: the eval set's records and prompt tokens line up
// with its examples; instruction data has no EvalPrompts.
func TestChatEvalRecords(t *testing.T) {
	var b strings.Builder
	for i := range 20 {
		b.WriteString(`{"messages": [{"role": "user", "content": "q` + string(rune('a'+i)) + `"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}, {"role": "assistant", "content": "r` + string(rune('a'+i)) + `"}]}` + "\n")
	}
	tok := tokenizer.Byte()
	ds, err := Load(writeFile(t, "c.jsonl", b.String()), tok, Options{SeqLen: 200, EvalFraction: 0.25, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds.Eval) != 5 || len(ds.EvalRecords) != 5 || len(ds.EvalPrompts) != 5 {
		t.Fatalf("eval %d, records %d, prompts %d; want 5 each", len(ds.Eval), len(ds.EvalRecords), len(ds.EvalPrompts))
	}
	for i, ex := range ds.Eval {
		p := ds.PromptTokens(i, tok)
		if !slices.Equal(ex.Tokens[:len(p)], p) || tok.Decode(ex.Tokens[len(p):len(ex.Tokens)-1]) != ds.EvalRecords[i].Response {
			t.Errorf("eval %d: prompt %v and response %q do not make its example %v", i, p, ds.EvalRecords[i].Response, ex.Tokens)
		}
	}
	alpaca, err := Load("testdata/alpaca-sample.json", tok, Options{SeqLen: 1000, EvalFraction: 0.3, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if alpaca.EvalPrompts != nil {
		t.Errorf("Alpaca data has EvalPrompts")
	}
	if got, want := alpaca.PromptTokens(0, tok), encodeRecord(alpaca.EvalRecords[0], tok).Tokens[:alpaca.Eval[0].PromptLen]; !slices.Equal(got, want) {
		t.Errorf("Alpaca prompt tokens %v, want %v", got, want)
	}
}

// TestChatTruncate cuts a conversation inside its second assistant turn:
// the spans are clipped and the loader takes it.
func TestChatTruncate(t *testing.T) {
	f := writeFile(t, "c.jsonl", `{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}, {"role": "assistant", "content": "hello again"}]}`)
	full := render("user", "hi", "assistant", "hello", "user", "again", "assistant", "hello again")
	T := len(full) - 5
	ds, err := Load(f, tokenizer.Byte(), Options{SeqLen: T, Truncate: true})
	if err != nil {
		t.Fatal(err)
	}
	ex := ds.Train[0]
	if ds.Truncated != 1 || len(ex.Tokens) != T+1 || ex.Spans[len(ex.Spans)-1].End != T+1 {
		t.Fatalf("truncated %d, tokens %d, spans %v; want 1, %d, the last ending at %d", ds.Truncated, len(ex.Tokens), ex.Spans, T+1, T+1)
	}
	if _, err := NewLoader(ds.Train, 1, T, 1); err != nil {
		t.Fatal(err)
	}
	// Cut before the first assistant turn's content: dropped.
	ds, err = Load(f, tokenizer.Byte(), Options{SeqLen: 20, Truncate: true})
	if err == nil || !strings.Contains(err.Error(), "all 1 examples dropped") {
		t.Fatalf("got %v, %v; want every example dropped", ds, err)
	}
}

func TestLoaderChecksSpans(t *testing.T) {
	toks := []int32{1, 2, 3, 4, 5, 6}
	for _, spans := range [][]Span{{}, {{2, 3}}, {{1, 3}, {2, 4}}, {{1, 1}}, {{1, 7}}, {{0, 2}}} {
		ex := Example{Tokens: toks, PromptLen: 1, Spans: spans}
		if len(spans) > 0 && spans[0].Start == 0 {
			ex.PromptLen = 0 // token 0 as a target
		}
		if _, err := NewLoader([]Example{ex}, 1, 8, 1); err == nil || !strings.Contains(err.Error(), "target spans") {
			t.Errorf("spans %v: error %v, want one about the target spans", spans, err)
		}
	}
	// Without Spans, the one span from PromptLen to the end.
	if got := (Example{Tokens: toks, PromptLen: 2}).TargetSpans(); !reflect.DeepEqual(got, []Span{{2, 6}}) {
		t.Errorf("TargetSpans of a prompt-masked example: %v, want [{2 6}]", got)
	}
	ok := Example{Tokens: toks, PromptLen: 1, Spans: []Span{{1, 2}, {4, 6}}}
	if got := ok.TargetSpans(); !reflect.DeepEqual(got, ok.Spans) {
		t.Errorf("TargetSpans %v, want its Spans %v", got, ok.Spans)
	}
	if _, err := NewLoader([]Example{ok}, 1, 8, 1); err != nil {
		t.Fatal(err)
	}
	var b Batch
	l, _ := NewLoader([]Example{ok}, 1, 8, 1)
	l.Next(&b)
	if want := []int32{2, -1, -1, 5, 6, -1, -1, -1}; !reflect.DeepEqual(b.Targets, want) || b.NumTargets != 3 {
		t.Errorf("targets %v (%d), want %v (3)", b.Targets, b.NumTargets, want)
	}
}

func TestChatErrors(t *testing.T) {
	const u, a = `{"role": "user", "content": "hi"}`, `{"role": "assistant", "content": "yo"}`
	tests := []struct {
		name, file, content string
		want                []string
	}{
		{"unknown role", "m.jsonl", `{"messages": [` + u + `, ` + a + `]}` + "\n" + `{"messages": [` + u + `, {"role": "tool", "content": "x"}]}`,
			[]string{"record 1 (line 2)", "messages turn 1", `field "role" is "tool"`, "system, user or assistant"}},
		{"no assistant", "m.json", "[\n{\"messages\": [" + u + "]}]",
			[]string{"record 0 (line 2)", `field "messages" has no assistant turn`}},
		{"empty content", "m.jsonl", `{"messages": [{"role": "user", "content": " "}, ` + a + `]}`,
			[]string{"record 0 (line 1)", "messages turn 0 (user)", `field "content" is empty`}},
		{"content parts", "m.jsonl", `{"messages": [{"role": "user", "content": [{"type": "text"}]}, ` + a + `]}`,
			[]string{"record 0 (line 1)", "messages turn 0 (user)", `field "content" is a JSON array, want a string`}},
		{"missing role", "m.jsonl", `{"messages": [{"content": "x"}, ` + a + `]}`,
			[]string{"messages turn 0", `missing field "role"`}},
		{"null content", "m.jsonl", `{"messages": [` + u + `, {"role": "assistant", "content": null}]}`,
			[]string{"messages turn 1 (assistant)", `missing field "content"`}},
		{"late system", "m.jsonl", `{"messages": [` + u + `, {"role": "system", "content": "s"}, ` + a + `]}`,
			[]string{"messages turn 1", "system turn may only come first"}},
		{"not an array", "m.jsonl", `{"messages": "hi"}`,
			[]string{"record 0 (line 1)", `field "messages" is a JSON string, want an array of turns`}},
		{"empty list", "m.jsonl", `{"messages": []}`, []string{`field "messages" is empty`}},
		{"turn not object", "m.jsonl", `{"messages": [` + u + `, 5]}`, []string{"messages turn 1 is a JSON number, want an object"}},
		{"mixed formats", "m.jsonl", `{"messages": [` + u + `, ` + a + `]}` + "\n\n" + `{"instruction": "x", "output": "y"}`,
			[]string{"record 1 (line 3)", `missing field "messages" (the file's first record is messages)`}},
		{"sharegpt role", "s.json", `[{"conversations": [{"from": "human", "value": "a"}, {"from": "observation", "value": "b"}]}]`,
			[]string{"record 0 (line 1)", "conversations turn 1", `field "from" is "observation", want system, human or gpt`}},
		{"sharegpt no gpt", "s.jsonl", `{"conversations": [{"from": "human", "value": "a"}]}`,
			[]string{`field "conversations" has no gpt turn`}},
		{"sharegpt empty value", "s.jsonl", `{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": ""}]}`,
			[]string{"conversations turn 1 (gpt)", `field "value" is empty`}},
		{"syntax", "m.jsonl", `{"messages": [` + u + `, ` + a + `]}` + "\n" + `{"messages": [}`,
			[]string{":2:", "malformed JSON"}},
	}
	for _, tc := range tests {
		path := writeFile(t, tc.file, tc.content)
		_, err := Load(path, tokenizer.Byte(), Options{SeqLen: 100})
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range append(tc.want, path) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", tc.name, err, w)
			}
		}
	}
}

// TestLoadEval: a held-out file of any format goes to Eval whole, with its
// records (and a conversation's prompt tokens); a fraction is refused.
func TestLoadEval(t *testing.T) {
	tok := tokenizer.Byte()
	for _, c := range []struct {
		path    string
		records bool
	}{
		{writeFile(t, chatFiles[0].name, chatFiles[0].content), true},
		{writeFile(t, chatFiles[3].name, chatFiles[3].content), true},
		{"testdata/alpaca-sample.jsonl", true},
		{"builtin:add:30", true},
		{"testdata/sample.txt", false},
	} {
		full, err := Load(c.path, tok, Options{SeqLen: 400, Truncate: true, Seed: 4})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := LoadEval(c.path, tok, Options{SeqLen: 400, Truncate: true, Seed: 4})
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.Train) != 0 || !reflect.DeepEqual(ev.Eval, full.Train) {
			t.Errorf("%s: train %d, eval %d; want 0 and the %d examples Load trains on, in order", c.path, len(ev.Train), len(ev.Eval), len(full.Train))
		}
		if c.records != (len(ev.EvalRecords) == len(ev.Eval)) {
			t.Errorf("%s: %d records for %d eval examples", c.path, len(ev.EvalRecords), len(ev.Eval))
		}
	}
	if _, err := LoadEval("builtin", tok, Options{SeqLen: 40, EvalFraction: 0.1}); err == nil || !strings.Contains(err.Error(), "want 0") {
		t.Errorf("LoadEval with a fraction: %v", err)
	}
}

// TestChatFormatDetection: the first record decides, messages before
// ShareGPT when a record has both, keys matched as encoding/json does
// (case aside).
func TestChatFormatDetection(t *testing.T) {
	for _, c := range []struct{ content, source string }{
		{`{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}`, "messages JSONL"},
		{`{"Messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}`, "messages JSONL"},
		{`[{"CONVERSATIONS": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}]`, "sharegpt JSON array"},
		{`{"instruction": "a", "output": "b", "meta": {"messages": 1}}`, "alpaca JSONL"},
	} {
		for range 5 { // map order must not matter
			ds, err := Load(writeFile(t, "d.jsonl", c.content), tokenizer.Byte(), Options{SeqLen: 400})
			if err != nil || !strings.HasPrefix(ds.Source, c.source+" ") {
				t.Fatalf("%s: %v, %v; want %s", c.content, ds, err, c.source)
			}
		}
	}
}
