// chat.go: conversations as training data: OpenAI-style messages and
// ShareGPT, read through the same JSON/JSONL walk as Alpaca (alpaca.go),
// and rendered with the checkpoint's chat template when it has one
// (Options.Chat), else with a fixed ChatML-like format.
//
// A messages record is {"messages": [{"role": R, "content": C}, ...]} with R
// one of system, user, assistant; a ShareGPT record is {"conversations":
// [{"from": F, "value": V}, ...]} with F one of system, human, gpt (user and
// assistant). Other fields of a record or a turn are ignored. A
// conversation needs at least one assistant turn; a system turn may only
// come first; every content must be a string with something other than
// white space in it (OpenAI's content arrays, tool calls and tool turns are
// not read). Errors name the file, the record and its line, the turn and
// the field.
//
// With a chat template (encodeTemplated), the text is the template's
// rendering, as transformers' apply_chat_template makes it, and assistant
// turn i's targets are what rendering turns 0..i adds to rendering turns
// 0..i-1 with the generation prompt: its content and the template's own
// end-of-turn marker (<|eot_id|>, <|im_end|>, </s>...). Each piece is
// tokenized on its own, so a span's ends are token ends, and no BOS is
// put first (the template writes it where the model wants one, and
// transformers tokenizes a chat with add_special_tokens=False).
//
// The fixed format (encodeConversation, for checkpoints without a
// chat_template, such as GPT-2 and the builtin tokenizers): tokens =
// tokenizer.Prefix ++, for each turn, Encode("<|im_start|>" + role + "\n")
// ++ Encode(content) ++ [EOS], the tokenizer's EOS id ending every turn.
// The targets are each assistant turn's content tokens and its EOS.
//
// Either way everything else takes no loss (turns after the last
// assistant turn are kept, as context without a target), and exact match
// generates the last assistant turn from everything before its content
// (Dataset.EvalPrompts); with a template its response is the target text
// up to the first stop id. Limits: the whole file is in memory; with a
// template whose end-of-turn marker is not a stop id (text markers, on
// the builtin tokenizers) generation does not stop there, and exact match
// scores 0.

package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/chattmpl"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// The roles of a conversation's turns, as rendered.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Turn is one message of a conversation, its role one of RoleSystem,
// RoleUser and RoleAssistant.
type Turn struct{ Role, Content string }

// FixedRendering names the fixed format in Dataset.Rendering and logs.
const FixedRendering = "fixed ChatML-like format (no chat_template)"

// ChatTurnStart is the text before each turn's role in the fixed format;
// ChatTurnEnd stands for the EOS id that ends every turn in
// Record.Prompt's text.
const (
	ChatTurnStart = "<|im_start|>"
	ChatTurnEnd   = "<|im_end|>"
)

// chatFormat is one conversation format: the record's field holding the
// turns, and each turn's role and content fields with the roles it names.
type chatFormat struct {
	name, list, role, content string
	roles                     map[string]string // the format's role -> Role*
	roleNames                 string            // for errors
}

var (
	messagesFormat = chatFormat{name: "messages", list: "messages", role: "role", content: "content",
		roles:     map[string]string{"system": RoleSystem, "user": RoleUser, "assistant": RoleAssistant},
		roleNames: "system, user or assistant"}
	shareGPTFormat = chatFormat{name: "sharegpt", list: "conversations", role: "from", content: "value",
		roles:     map[string]string{"system": RoleSystem, "human": RoleUser, "gpt": RoleAssistant},
		roleNames: "system, human or gpt"}
)

// detectFormat names the format of a file from its first record and
// returns the parser of its records: a record with a "messages" field is
// OpenAI-style messages, one with "conversations" ShareGPT, any other (or
// a value that is not an object) Alpaca, whose parser words the error.
func detectFormat(v []byte) (string, func([]byte) (item, error)) {
	var m map[string]json.RawMessage
	if json.Unmarshal(v, &m) == nil {
		for _, f := range []chatFormat{messagesFormat, shareGPTFormat} {
			if fieldFold(m, f.list) != nil {
				return f.name, f.parse
			}
		}
	}
	return "alpaca", alpacaRecord
}

// parse decodes and checks one record of the format.
func (f chatFormat) parse(v []byte) (item, error) {
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(v, &rec); err != nil {
		return item{}, errors.New(describeDecodeErr(err))
	}
	list := fieldFold(rec, f.list)
	if list == nil || string(list) == "null" {
		return item{}, fmt.Errorf("missing field %q (the file's first record is %s)", f.list, f.name)
	}
	var turns []json.RawMessage
	if err := json.Unmarshal(list, &turns); err != nil {
		return item{}, fmt.Errorf("field %q is %s, want an array of turns", f.list, jsonKindOf(list))
	}
	if len(turns) == 0 {
		return item{}, fmt.Errorf("field %q is empty", f.list)
	}
	conv := make([]Turn, len(turns))
	assistant := false
	for i, raw := range turns {
		var t map[string]json.RawMessage
		if err := json.Unmarshal(raw, &t); err != nil {
			return item{}, fmt.Errorf("%s turn %d is %s, want an object", f.list, i, jsonKindOf(raw))
		}
		role, err := stringField(t, f.role)
		if err != nil {
			return item{}, fmt.Errorf("%s turn %d: %w", f.list, i, err)
		}
		r, ok := f.roles[role]
		if !ok {
			return item{}, fmt.Errorf("%s turn %d: field %q is %q, want %s", f.list, i, f.role, role, f.roleNames)
		}
		content, err := stringField(t, f.content)
		if err != nil {
			return item{}, fmt.Errorf("%s turn %d (%s): %w", f.list, i, role, err)
		}
		if strings.TrimSpace(content) == "" {
			return item{}, fmt.Errorf("%s turn %d (%s): field %q is empty", f.list, i, role, f.content)
		}
		if r == RoleSystem && i > 0 {
			return item{}, fmt.Errorf("%s turn %d: a %s turn may only come first", f.list, i, role)
		}
		assistant = assistant || r == RoleAssistant
		conv[i] = Turn{Role: r, Content: content}
	}
	if !assistant {
		return item{}, fmt.Errorf("field %q has no %s turn: nothing to learn from", f.list, f.roleOf(RoleAssistant))
	}
	return item{conv: conv}, nil
}

// fieldFold returns the field key of a record as encoding/json would
// match it: the key itself, else the first (in sorted order) that equals it
// but for case; nil when there is none.
func fieldFold(rec map[string]json.RawMessage, key string) json.RawMessage {
	if raw, ok := rec[key]; ok {
		return raw
	}
	keys := slices.Sorted(maps.Keys(rec))
	for _, k := range keys {
		if strings.EqualFold(k, key) {
			return rec[k]
		}
	}
	return nil
}

// roleOf is the format's name for a role.
func (f chatFormat) roleOf(r string) string {
	for k, v := range f.roles {
		if v == r {
			return k
		}
	}
	return r
}

// stringField returns the string field key of a turn (matched exactly).
func stringField(t map[string]json.RawMessage, key string) (string, error) {
	raw, ok := t[key]
	if !ok || string(raw) == "null" {
		return "", fmt.Errorf("missing field %q", key)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("field %q is %s, want a string", key, jsonKindOf(raw))
	}
	return s, nil
}

// jsonKindOf names the JSON kind of a valid value: "a JSON array", ...
func jsonKindOf(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if s == "" {
		return "nothing"
	}
	switch s[0] {
	case '[':
		return "a JSON array"
	case '{':
		return "a JSON object"
	case '"':
		return "a JSON string"
	case 't', 'f':
		return "a JSON boolean"
	case 'n':
		return "null"
	}
	return "a JSON number"
}

// encodeConversation tokenizes a conversation in the fixed format (the
// file comment) and returns its example, whose Spans are the assistant
// turns' content and EOS, and the record exact match scores: the last
// assistant turn, generated from prompt, the tokens before its content.
func encodeConversation(conv []Turn, tok tokenizer.Tokenizer) (Example, Record, []int32) {
	t := tokenizer.Prefix(tok)
	var spans []Span
	var text strings.Builder
	last, lastText := 0, 0
	for _, turn := range conv {
		header := ChatTurnStart + turn.Role + "\n"
		t = append(t, tok.Encode(header)...)
		text.WriteString(header)
		start := len(t)
		if turn.Role == RoleAssistant {
			last, lastText = start, text.Len()
		}
		t = append(append(t, tok.Encode(turn.Content)...), tok.EOS())
		text.WriteString(turn.Content + ChatTurnEnd)
		if turn.Role == RoleAssistant {
			spans = append(spans, Span{start, len(t)})
		}
	}
	final := conv[0].Content
	for _, turn := range conv {
		if turn.Role == RoleAssistant {
			final = turn.Content
		}
	}
	rec := Record{Prompt: text.String()[:lastText], Response: final}
	return Example{Tokens: t, PromptLen: spans[0].Start, Spans: spans}, rec, t[:last:last]
}

// encodeTemplated renders a conversation with the chat template tm and
// tokenizes it piece by piece (the file comment): its example, whose
// Spans are the assistant turns, and the record and prompt tokens exact
// match generates the last assistant turn from. It fails when the
// template raises, or when it renders a conversation so that a shorter
// one with the generation prompt is not a prefix of it: then no span is
// the assistant's alone, and the error names the template and the turn.
func encodeTemplated(conv []Turn, tok tokenizer.Tokenizer, tm *chattmpl.Template) (Example, Record, []int32, error) {
	msgs := make([]chattmpl.Message, len(conv))
	for i, t := range conv {
		msgs[i] = chattmpl.Message{Role: t.Role, Content: t.Content}
	}
	var t []int32
	var spans []Span
	text := "" // rendered so far: every piece tokenized
	last, lastText, final := 0, 0, ""
	add := func(piece string) { t = append(t, tok.Encode(piece)...) }
	for i, turn := range conv {
		if turn.Role != RoleAssistant {
			continue
		}
		prompt, err := tm.Render(msgs[:i], true)
		if err != nil {
			return Example{}, Record{}, nil, err
		}
		full, err := tm.Render(msgs[:i+1], false)
		if err != nil {
			return Example{}, Record{}, nil, err
		}
		if !strings.HasPrefix(prompt, text) || !strings.HasPrefix(full, prompt) {
			return Example{}, Record{}, nil, fmt.Errorf("chat template %s: turn %d (assistant): rendering the turns before it with the generation prompt is not a prefix of rendering them with it, so its tokens cannot be told apart for the loss", tm.Name, i)
		}
		add(prompt[len(text):])
		start := len(t)
		add(full[len(prompt):])
		if len(t) == start {
			return Example{}, Record{}, nil, fmt.Errorf("chat template %s: turn %d (assistant) renders to nothing", tm.Name, i)
		}
		spans = append(spans, Span{start, len(t)})
		last, lastText, final = start, len(prompt), generated(t[start:], tok)
		text = full
	}
	all, err := tm.Render(msgs, false)
	if err != nil {
		return Example{}, Record{}, nil, err
	}
	if !strings.HasPrefix(all, text) {
		return Example{}, Record{}, nil, fmt.Errorf("chat template %s: the turns after the last assistant turn change how the turns before them render, so the assistant turns' tokens cannot be told apart for the loss", tm.Name)
	}
	add(all[len(text):])
	rec := Record{Prompt: all[:lastText], Response: final}
	return Example{Tokens: t, PromptLen: spans[0].Start, Spans: spans}, rec, t[:last:last], nil
}

// generated is the text greedy generation would return for the target
// tokens span: those before the first stop id (tokenizer.StopIDs), as
// the template wrote them (LLaMA 3's trims the content, for one), so that
// exact match compares with what the model was taught to write.
func generated(span []int32, tok tokenizer.Tokenizer) string {
	stop := tokenizer.StopIDs(tok)
	for i, id := range span {
		if slices.Contains(stop, id) {
			return tok.Decode(span[:i])
		}
	}
	return tok.Decode(span)
}

// ChatPrompt returns the tokens a model tuned on conversations generates
// its answer to prompt from: prompt as one user turn, rendered as
// training renders conversations (encodeTemplated, encodeConversation)
// up to where the assistant's content starts: with tm and the generation
// prompt, or without a template in the fixed format. `sample --chat`
// uses it.
func ChatPrompt(prompt string, tok tokenizer.Tokenizer, tm *chattmpl.Template) ([]int32, error) {
	if tm == nil {
		t := append(tokenizer.Prefix(tok), tok.Encode(ChatTurnStart+RoleUser+"\n")...)
		t = append(append(t, tok.Encode(prompt)...), tok.EOS())
		return append(t, tok.Encode(ChatTurnStart+RoleAssistant+"\n")...), nil
	}
	text, err := tm.Render([]chattmpl.Message{{Role: RoleUser, Content: prompt}}, true)
	if err != nil {
		return nil, err
	}
	return tok.Encode(text), nil
}
