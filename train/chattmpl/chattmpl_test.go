package chattmpl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/chattmpl/chattmpltest"
)

// fixture is testdata/expected.json, transformers' renderings.
type fixture = chattmpltest.Fixture

func readFixture(t *testing.T) fixture {
	t.Helper()
	return chattmpltest.Read(t, "testdata/expected.json")
}

// fixtureTemplate parses testdata/NAME.jinja with the fixture's tokens
// and clock.
func fixtureTemplate(t *testing.T, f fixture, name string) *Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", name+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tok := f.Tokens[name]
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	tm, err := Parse(name+".jinja", string(src), str(tok.BOS), str(tok.EOS))
	if err != nil {
		t.Fatal(err)
	}
	now, err := time.Parse("2006-01-02T15:04:05", f.Now)
	if err != nil {
		t.Fatal(err)
	}
	tm.Now = func() time.Time { return now }
	return tm
}

func messages(f fixture, conv string, k int) []Message {
	var out []Message
	for _, m := range f.Conversations[conv][:k] {
		out = append(out, Message{m.Role, m.Content})
	}
	return out
}

// TestMatchesTransformers renders every case of the fixture (five real
// templates and one of transformers' additions, every prefix of several
// conversations, with and without the generation prompt) and compares
// with transformers' rendering byte for byte.
func TestMatchesTransformers(t *testing.T) {
	f := readFixture(t)
	if len(f.Cases) == 0 {
		t.Fatal("no cases")
	}
	templates := map[string]*Template{}
	for _, c := range f.Cases {
		tm := templates[c.Template]
		if tm == nil {
			tm = fixtureTemplate(t, f, c.Template)
			templates[c.Template] = tm
		}
		got, err := tm.Render(messages(f, c.Conversation, c.Turns), c.AddGenerationPrompt)
		what := fmt.Sprintf("%s/%s[:%d]", c.Template, c.Conversation, c.Turns)
		if c.AddGenerationPrompt {
			what += "+gen"
		}
		if c.Error != "" {
			if err == nil || !strings.Contains(err.Error(), c.Error) || !strings.Contains(err.Error(), c.Template+".jinja") {
				t.Errorf("%s: error %v, want one naming the template and saying %q", what, err, c.Error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		if got != c.Output {
			t.Errorf("%s:\n got %q\nwant %q", what, got, c.Output)
		}
	}
	for _, name := range []string{"llama-3.1-instruct", "qwen2.5-instruct", "mistral-7b-instruct-v0.3", "smollm2-instruct", "zephyr-7b-beta"} {
		if templates[name] == nil {
			t.Errorf("the fixture has no case of %s", name)
		}
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoad reads the template as transformers does: chat_template a
// string or a list whose "default" is taken, the special tokens strings
// or AddedToken objects, --chat-template a Jinja file or a JSON one
// overriding the checkpoint's; no template at all is nil, no error.
func TestLoad(t *testing.T) {
	msgs := []Message{{"user", "hi"}}
	dir := t.TempDir()
	cfg := filepath.Join(dir, ConfigFile)

	if tm, err := Load(dir, ""); tm != nil || err != nil {
		t.Fatalf("no tokenizer_config.json: %v, %v; want nil, nil", tm, err)
	}
	writeFile(t, cfg, `{"eos_token": "</s>"}`)
	if tm, err := Load(dir, ""); tm != nil || err != nil {
		t.Fatalf("no chat_template: %v, %v; want nil, nil", tm, err)
	}

	writeFile(t, cfg, `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
		"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}`)
	tm, err := Load(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tm.Render(msgs, false); got != "<s>hi</s>" {
		t.Errorf("string template: %q", got)
	}
	if !strings.Contains(tm.Name, cfg) {
		t.Errorf("name %q does not say %s", tm.Name, cfg)
	}

	writeFile(t, cfg, `{"eos_token": "</s>", "chat_template": [
		{"name": "tool_use", "template": "tools"},
		{"name": "default", "template": "default {{ messages[0].content }}"}]}`)
	if tm, err = Load(dir, ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := tm.Render(msgs, false); got != "default hi" {
		t.Errorf("named templates: %q, want the default one", got)
	}
	writeFile(t, cfg, `{"chat_template": [{"name": "tool_use", "template": "tools"}]}`)
	if _, err := Load(dir, ""); err == nil || !strings.Contains(err.Error(), `no template named "default"`) || !strings.Contains(err.Error(), cfg) {
		t.Errorf("no default: %v", err)
	}

	// --chat-template: a Jinja file; the tokens stay the checkpoint's.
	writeFile(t, cfg, `{"eos_token": "</s>", "chat_template": "checkpoint's"}`)
	jf := filepath.Join(t.TempDir(), "mine.jinja")
	writeFile(t, jf, "mine {{ messages[0].content }}{{ eos_token }}\n")
	if tm, err = Load(dir, jf); err != nil {
		t.Fatal(err)
	}
	if got, _ := tm.Render(msgs, false); got != "mine hi</s>" || tm.Name != jf {
		t.Errorf("--chat-template FILE: %q (name %s), want %q: one trailing newline dropped as Jinja2 does", got, tm.Name, "mine hi</s>")
	}
	// ... or another tokenizer_config.json, whose tokens serve when
	// there is no checkpoint directory.
	other := filepath.Join(t.TempDir(), "tokenizer_config.json")
	writeFile(t, other, `{"eos_token": "<|e|>", "chat_template": "other {{ eos_token }}"}`)
	if tm, err = Load("", other); err != nil {
		t.Fatal(err)
	}
	if got, _ := tm.Render(msgs, false); got != "other <|e|>" {
		t.Errorf("--chat-template JSON: %q", got)
	}
	if _, err := Load(dir, filepath.Join(dir, "missing.jinja")); err == nil || !strings.Contains(err.Error(), "missing.jinja") {
		t.Errorf("missing file: %v", err)
	}
}

// TestErrorsNameTheTemplate: a template that does not parse, and one
// that raises, are errors naming the file and saying what went wrong.
func TestErrorsNameTheTemplate(t *testing.T) {
	if _, err := Parse("broken.jinja", "{% for m in messages %}{{ m.content }}", "", ""); err == nil || !strings.Contains(err.Error(), "broken.jinja") {
		t.Errorf("unclosed for: %v, want an error naming broken.jinja", err)
	}
	tm, err := Parse("raises.jinja", "{{ raise_exception('roles must alternate') }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tm.Render(nil, false); err == nil || !strings.Contains(err.Error(), "raises.jinja") || !strings.Contains(err.Error(), "roles must alternate") {
		t.Errorf("raise_exception: %v", err)
	}
	tm, err = Parse("date.jinja", "{{ strftime_now('%Q') }}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tm.Render(nil, false); err == nil || !strings.Contains(err.Error(), "%Q") {
		t.Errorf("unknown strftime directive: %v", err)
	}
}

func TestStrftime(t *testing.T) {
	tm := time.Date(2024, 7, 6, 15, 4, 5, 0, time.UTC)
	for format, want := range map[string]string{
		"%d %b %Y":          "06 Jul 2024",
		"%Y-%m-%d %H:%M:%S": "2024-07-06 15:04:05",
		"%A %B %y %j":       "Saturday July 24 188",
		"%I%p 100%%":        "03PM 100%",
	} {
		got, err := Strftime(tm, format)
		if err != nil || got != want {
			t.Errorf("Strftime(%q) = %q, %v; want %q", format, got, err, want)
		}
	}
}
