// Package chattmpl renders a checkpoint's chat template: the Jinja
// template in tokenizer_config.json's chat_template that turns a
// conversation into the text the model was tuned on, with the semantics
// of transformers' apply_chat_template, so that fine-tuning sees the
// same text as inference does.
//
// transformers renders with Jinja2's ImmutableSandboxedEnvironment,
// trim_blocks and lstrip_blocks on, and adds the globals raise_exception
// and strftime_now and its own tojson filter (ensure_ascii=False, no HTML
// escaping); it passes messages, tools (None here), documents (None),
// add_generation_prompt, and the tokenizer's special tokens (bos_token,
// eos_token). The engine is github.com/ardanlabs/jinja, which has those
// whitespace settings, raise_exception, and a tojson without HTML
// escaping built in (docs/notes/jinja-candidates.md); this package adds
// Jinja2's source handling (newlines normalised, one trailing newline
// dropped), a strftime_now on a clock the caller can fix, and the
// variables.
//
// Limits: messages are role and content strings only (no tool calls,
// tool schemas or documents); tojson on strings holding U+2028 or U+2029
// escapes them where Python does not, and tojson(indent=N) is Go's
// indentation (only tool schemas use either in the templates we know).
package chattmpl

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// ConfigFile is the checkpoint file that holds the chat template and the
// special tokens it refers to.
const ConfigFile = "tokenizer_config.json"

// Message is one turn of a conversation: Role is system, user or
// assistant.
type Message struct{ Role, Content string }

// Template is a compiled chat template and the special tokens it is
// rendered with. It is safe for concurrent use.
type Template struct {
	// Name says where the template came from (a file path), for errors
	// and logs.
	Name string
	// Source is the template text as given.
	Source string
	// BOS and EOS are the bos_token and eos_token the template sees (""
	// when the tokenizer has none: transformers passes None then, which
	// renders as "None"; the templates we know only use them when set).
	BOS, EOS string
	// Now is strftime_now's clock; nil means time.Now. Tests fix it, since
	// LLaMA 3.x templates put today's date into the system turn.
	Now func() time.Time

	tmpl *jinja.Template
}

// Parse compiles src, the template named name (a file, for errors), to
// be rendered with the special tokens bos and eos.
func Parse(name, src, bos, eos string) (*Template, error) {
	t, err := jinja.Compile(jinjaSource(src))
	if err != nil {
		return nil, fmt.Errorf("chat template %s: %w", name, err)
	}
	return &Template{Name: name, Source: src, BOS: bos, EOS: eos, tmpl: t}, nil
}

// jinjaSource is src as Jinja2's lexer reads it: every \r\n and \r a \n,
// and one trailing newline dropped (keep_trailing_newline is false in
// transformers' environment). The Go engine does neither.
func jinjaSource(src string) string {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	return strings.TrimSuffix(src, "\n")
}

// Render renders the conversation msgs; addGenerationPrompt asks the
// template to end with the header of an assistant turn, as for
// generation. A template that raises (raise_exception) or fails is an
// error naming it.
func (t *Template) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		// role before content, the order of a Python dict literal, so
		// that a template iterating a message's items sees that order.
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		list[i] = d
	}
	now := t.Now
	if now == nil {
		now = time.Now
	}
	vars := map[string]jinja.Value{
		"messages":              jinja.NewList(list),
		"tools":                 jinja.None(),
		"documents":             jinja.None(),
		"add_generation_prompt": jinja.NewBool(addGenerationPrompt),
		"bos_token":             tokenValue(t.BOS),
		"eos_token":             tokenValue(t.EOS),
		"strftime_now": jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			if len(args) != 1 || !args[0].IsString() {
				return jinja.Undefined(), errors.New("strftime_now takes one format string")
			}
			s, err := Strftime(now(), args[0].AsString())
			return jinja.NewString(s), err
		}),
	}
	out, err := t.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("chat template %s: %w", t.Name, err)
	}
	return out, nil
}

// tokenValue is a special token as the template sees it: None when the
// tokenizer has none.
func tokenValue(s string) jinja.Value {
	if s == "" {
		return jinja.None()
	}
	return jinja.NewString(s)
}

// Strftime formats tm with the C/Python strftime directives the chat
// templates use (%d %b %Y in LLaMA 3.x's); an unknown directive is an
// error rather than text Python would print differently.
func Strftime(tm time.Time, format string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+1 == len(format) {
			return "", fmt.Errorf("strftime_now: format %q ends in %%", format)
		}
		i++
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", tm.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", tm.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(tm.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", tm.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", tm.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (tm.Hour()+11)%12+1)
		case 'M':
			fmt.Fprintf(&b, "%02d", tm.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", tm.Second())
		case 'p':
			b.WriteString(tm.Format("PM"))
		case 'b':
			b.WriteString(tm.Format("Jan"))
		case 'B':
			b.WriteString(tm.Format("January"))
		case 'a':
			b.WriteString(tm.Format("Mon"))
		case 'A':
			b.WriteString(tm.Format("Monday"))
		case 'j':
			fmt.Fprintf(&b, "%03d", tm.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("strftime_now: directive %%%c in %q is not supported", format[i], format)
		}
	}
	return b.String(), nil
}

// Load reads a chat template for a checkpoint directory dir (may be ""):
// the template of file when it is not "" (--chat-template: a Jinja file,
// or a JSON file with a chat_template field such as another checkpoint's
// tokenizer_config.json), else dir's tokenizer_config.json chat_template.
// The special tokens are dir's tokenizer_config.json's (file's, for a
// JSON file without a directory). It returns nil and no error when there
// is no template: no file given and dir has none.
func Load(dir, file string) (*Template, error) {
	var cfg tokenizerConfig
	cfgPath := ""
	if dir != "" {
		p := filepath.Join(dir, ConfigFile)
		ok, err := readConfig(p, &cfg)
		if err != nil {
			return nil, err
		}
		if ok {
			cfgPath = p
		}
	}
	if file != "" {
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("chat template: %w", err)
		}
		src := string(raw)
		if strings.EqualFold(filepath.Ext(file), ".json") {
			var fc tokenizerConfig
			if err := json.Unmarshal(raw, &fc); err != nil {
				return nil, fmt.Errorf("chat template %s: %w", file, err)
			}
			if src, err = fc.template(file); err != nil {
				return nil, err
			}
			if src == "" {
				return nil, fmt.Errorf("chat template %s: no chat_template field", file)
			}
			if cfgPath == "" {
				cfg = fc
			}
		}
		return Parse(file, src, cfg.BOS.s, cfg.EOS.s)
	}
	if cfgPath == "" {
		return nil, nil
	}
	src, err := cfg.template(cfgPath)
	if err != nil || src == "" {
		return nil, err
	}
	return Parse(cfgPath+" chat_template", src, cfg.BOS.s, cfg.EOS.s)
}

// tokenizerConfig is the part of tokenizer_config.json a template needs.
type tokenizerConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOS          token           `json:"bos_token"`
	EOS          token           `json:"eos_token"`
}

// readConfig decodes path into cfg; a missing file is no error (ok false).
func readConfig(path string, cfg *tokenizerConfig) (bool, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("chat template: %w", err)
	}
	if err := json.Unmarshal(raw, cfg); err != nil {
		return false, fmt.Errorf("chat template: %s: %w", path, err)
	}
	return true, nil
}

// template returns chat_template: a string, or transformers' list of
// named templates, of which the one named "default" is the one
// apply_chat_template uses without a name. "" when there is none.
func (c tokenizerConfig) template(path string) (string, error) {
	raw := c.ChatTemplate
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct{ Name, Template string }
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chat template: %s: chat_template is neither a string nor a list of {name, template}", path)
	}
	names := make([]string, len(named))
	for i, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
		names[i] = n.Name
	}
	return "", fmt.Errorf("chat template: %s: chat_template has no template named \"default\" (it has %s)", path, strings.Join(names, ", "))
}

// token is a special token of tokenizer_config.json: a string, or an
// AddedToken object whose content is the text.
type token struct{ s string }

func (t *token) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if json.Unmarshal(b, &t.s) == nil {
		return nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(b, &obj); err != nil {
		return fmt.Errorf("a special token is %s, want a string or an object with content", string(b))
	}
	t.s = obj.Content
	return nil
}
