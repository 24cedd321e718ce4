package data

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/chattmpl"
	"github.com/lsp-offload/lsp-offload/train/chattmpl/chattmpltest"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// readTemplateFixture reads train/chattmpl/testdata/expected.json,
// transformers' renderings.
func readTemplateFixture(t *testing.T) chattmpltest.Fixture {
	t.Helper()
	return chattmpltest.Read(t, "../chattmpl/testdata/expected.json")
}

// writeConversation writes turns as a one-record messages file.
func writeConversation(t *testing.T, turns any) string {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"messages": turns})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "chat.jsonl")
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTemplateSpans loads conversations rendered with real chat templates
// (LLaMA 3.1 on a small Llama-3-style tokenizer, Qwen2.5 on a small
// Qwen2 one) and checks the targets: each assistant turn's span is the
// tokens of exactly what transformers' rendering of turns 0..i adds to
// its rendering of turns 0..i-1 with the generation prompt (the content
// and the template's end-of-turn token), nothing else is a target, and
// all the tokens together are the whole rendering.
func TestTemplateSpans(t *testing.T) {
	f := readTemplateFixture(t)
	for _, c := range []struct{ template, tokDir, bos, eos, endOfTurn string }{
		{"llama-3.1-instruct", "llama3", "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"},
		{"qwen2.5-instruct", "qwen2", "", "<|im_end|>", "<|im_end|>"},
	} {
		tok := instructTokenizer(t, c.tokDir, c.eos)
		tm := fixtureTemplate(t, c.template, c.bos, c.eos)
		eot := tok.Encode(c.endOfTurn)
		if len(eot) != 1 {
			t.Fatalf("%s: %s is %d tokens, want one special token", c.tokDir, c.endOfTurn, len(eot))
		}
		for _, conv := range []string{"system-multi", "awkward"} {
			turns := f.Conversations[conv]
			ds, err := Load(writeConversation(t, turns), tok, Options{SeqLen: 4096, Chat: tm, allEval: true})
			if err != nil {
				t.Fatalf("%s %s: %v", c.template, conv, err)
			}
			if ds.Rendering != "chat template "+c.template+".jinja" {
				t.Errorf("rendering %q", ds.Rendering)
			}
			ex := ds.Eval[0]
			whole := f.Rendered(t, c.template, conv, len(turns), false)
			var want []int32
			var spans []Span
			done := ""
			for i, turn := range turns {
				if turn.Role != RoleAssistant {
					continue
				}
				prompt := f.Rendered(t, c.template, conv, i, true)
				full := f.Rendered(t, c.template, conv, i+1, false)
				want = append(want, tok.Encode(prompt[len(done):])...)
				target := full[len(prompt):]
				if !strings.HasSuffix(target, c.endOfTurn) && !strings.HasSuffix(target, c.endOfTurn+"\n") {
					t.Errorf("%s %s turn %d: target text %q does not end with %s", c.template, conv, i, target, c.endOfTurn)
				}
				ids := tok.Encode(target)
				if !slices.Contains(ids, eot[0]) {
					t.Errorf("%s %s turn %d: target %v lacks the end-of-turn id %d", c.template, conv, i, ids, eot[0])
				}
				spans = append(spans, Span{len(want), len(want) + len(ids)})
				want = append(want, ids...)
				done = full
			}
			want = append(want, tok.Encode(whole[len(done):])...)
			if !slices.Equal(ex.Tokens, want) {
				t.Errorf("%s %s: tokens\n %v\nwant\n %v", c.template, conv, ex.Tokens, want)
			}
			if !slices.Equal(ex.Spans, spans) {
				t.Errorf("%s %s: spans %v, want %v", c.template, conv, ex.Spans, spans)
			}
			// The batch row's targets are the span tokens and nothing else.
			b := EvalBatches([]Example{ex}, 1, len(ex.Tokens))[0]
			for j := 1; j < len(ex.Tokens); j++ {
				in := slices.ContainsFunc(spans, func(s Span) bool { return j >= s.Start && j < s.End })
				if got := b.Targets[j-1]; (got != -1) != in || in && got != ex.Tokens[j] {
					t.Fatalf("%s %s: target at %d is %d (token %d in a span: %v)", c.template, conv, j-1, got, ex.Tokens[j], in)
				}
			}
			// Exact match generates the last assistant turn from the
			// rendering before it, generation prompt included.
			lastAsst := 0
			for i, turn := range turns {
				if turn.Role == RoleAssistant {
					lastAsst = i
				}
			}
			if got, wantP := ds.EvalPrompts[0], ex.Tokens[:spans[len(spans)-1].Start]; !slices.Equal(got, wantP) {
				t.Errorf("%s %s: eval prompt %v, want %v", c.template, conv, got, wantP)
			}
			// Its response is the target text up to the end of turn, as
			// the template wrote it (LLaMA 3.1's trims the content).
			lastTarget := f.Rendered(t, c.template, conv, lastAsst+1, false)[len(f.Rendered(t, c.template, conv, lastAsst, true)):]
			wantResp, _, _ := strings.Cut(lastTarget, c.endOfTurn)
			if r := ds.EvalRecords[0]; r.Response != wantResp || r.Prompt != f.Rendered(t, c.template, conv, lastAsst, true) {
				t.Errorf("%s %s: eval record %+v, want response %q", c.template, conv, r, wantResp)
			}
		}
	}
}

// instructTokenizer is the small tokenizer of ../tokenizer/testdata/dir
// with eos as its EOS, as an instruct checkpoint's tokenizer_config.json
// names its end-of-turn token (Qwen2.5-Instruct's <|im_end|>), so that
// generation stops there.
func instructTokenizer(t *testing.T, dir, eos string) tokenizer.Tokenizer {
	t.Helper()
	tmp := t.TempDir()
	raw, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := json.Marshal(map[string]any{"eos_token": eos})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Open(tmp)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// fixtureTemplate parses chattmpl's testdata/NAME.jinja with the given
// BOS and EOS tokens.
func fixtureTemplate(t *testing.T, name, bos, eos string) *chattmpl.Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "chattmpl", "testdata", name+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := chattmpl.Parse(name+".jinja", string(src), bos, eos)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// TestTemplateErrors: a template whose shorter renderings are not
// prefixes of longer ones, one that raises, and one that could not be
// read are errors naming the template; other data loads without one.
func TestTemplateErrors(t *testing.T) {
	tok := tokenizer.Byte()
	conv := writeConversation(t, []map[string]string{{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}})
	for _, c := range []struct {
		what, name, src string
		want            []string // what the error names besides the template
	}{
		// The generation prompt differs from the assistant turn's header.
		{"prefix property broken", "bad.jinja", "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<gen>{% endif %}",
			[]string{"not a prefix", "turn 1"}},
		{"raise_exception", "raises.jinja", "{{ raise_exception('Conversation roles must alternate') }}",
			[]string{"roles must alternate", "record 0"}},
	} {
		tmpl, err := chattmpl.Parse(c.name, c.src, "", "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Load(conv, tok, Options{SeqLen: 64, Chat: tmpl})
		for _, w := range append([]string{c.name}, c.want...) {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want an error naming %q", c.what, err, w)
			}
		}
	}
	unread := os.ErrPermission
	if _, err := Load(conv, tok, Options{SeqLen: 64, ChatErr: unread}); err == nil || !strings.Contains(err.Error(), unread.Error()) {
		t.Errorf("ChatErr with conversations: %v", err)
	}
	alpaca := filepath.Join(t.TempDir(), "a.jsonl")
	if err := os.WriteFile(alpaca, []byte(`{"instruction": "x", "output": "y"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ds, err := Load(alpaca, tok, Options{SeqLen: 512, ChatErr: unread}); err != nil {
		t.Errorf("ChatErr with Alpaca data: %v, want it loaded", err)
	} else if ds.Rendering != "" {
		t.Errorf("Alpaca data: rendering %q, want none", ds.Rendering)
	}
	if ds, err := Load(conv, tok, Options{SeqLen: 64}); err != nil {
		t.Error(err)
	} else if ds.Rendering != FixedRendering {
		t.Errorf("no template: rendering %q, want %q", ds.Rendering, FixedRendering)
	}
}

// TestChatPrompt: sample --chat's prompt is what training generates the
// last assistant turn from, with and without a template.
func TestChatPrompt(t *testing.T) {
	f := readTemplateFixture(t)
	tok, err := tokenizer.Open(filepath.Join("..", "tokenizer", "testdata", "qwen2"))
	if err != nil {
		t.Fatal(err)
	}
	tm := fixtureTemplate(t, "qwen2.5-instruct", "", "<|im_end|>")
	got, err := ChatPrompt("Hello?", tok, tm)
	if err != nil {
		t.Fatal(err)
	}
	if want := tok.Encode(f.Rendered(t, "qwen2.5-instruct", "user-first-only", 1, true)); !slices.Equal(got, want) {
		t.Errorf("with a template: %v, want %v", got, want)
	}
	for _, tm := range []*chattmpl.Template{nil, tm} {
		conv := writeConversation(t, []map[string]string{{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi."}})
		ds, err := Load(conv, tok, Options{SeqLen: 512, Chat: tm, allEval: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := ChatPrompt("Hello?", tok, tm)
		if err != nil || !slices.Equal(got, ds.EvalPrompts[0]) {
			t.Errorf("template %v: %v, %v; want the eval prompt %v", tm != nil, got, err, ds.EvalPrompts[0])
		}
	}
}

// TestTemplateConcurrent renders many conversations on all cores (the
// template is shared by encodeAll's workers) and compares each with its
// rendering alone; under -race it checks the sharing too.
func TestTemplateConcurrent(t *testing.T) {
	tok := instructTokenizer(t, "qwen2", "<|im_end|>")
	tm := fixtureTemplate(t, "qwen2.5-instruct", "", "<|im_end|>")
	var b strings.Builder
	var convs [][]Turn
	for i := range 300 {
		q, a := strings.Repeat("q", 1+i%7), strings.Repeat("a", 1+i%5)
		b.WriteString(`{"messages": [{"role": "user", "content": "` + q + `"}, {"role": "assistant", "content": "` + a + `"}]}` + "\n")
		convs = append(convs, []Turn{{RoleUser, q}, {RoleAssistant, a}})
	}
	path := filepath.Join(t.TempDir(), "many.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := Load(path, tok, Options{SeqLen: 512, Chat: tm, allEval: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds.Eval) != len(convs) {
		t.Fatalf("%d examples, want %d", len(ds.Eval), len(convs))
	}
	for i, c := range convs {
		want, _, _, err := encodeTemplated(c, tok, tm)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ds.Eval[i].Tokens, want.Tokens) || !slices.Equal(ds.Eval[i].Spans, want.Spans) {
			t.Fatalf("conversation %d: %v %v, want %v %v", i, ds.Eval[i].Tokens, ds.Eval[i].Spans, want.Tokens, want.Spans)
		}
	}
}
