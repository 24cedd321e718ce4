// Package chattmpltest reads train/chattmpl/testdata/expected.json,
// transformers' renderings of the chat templates under testdata (written
// by scripts/fixtures/chat_templates.py), for the tests of chattmpl and of
// the packages that render conversations with it.
package chattmpltest

import (
	"encoding/json"
	"os"
	"testing"
)

// Fixture is expected.json.
type Fixture struct {
	Versions map[string]string
	Now      string
	Tokens   map[string]struct {
		BOS *string `json:"bos_token"`
		EOS *string `json:"eos_token"`
	}
	Conversations map[string][]Turn
	Cases         []struct {
		Template, Conversation string
		Turns                  int
		AddGenerationPrompt    bool   `json:"add_generation_prompt"`
		Output                 string `json:"output"`
		Error                  string `json:"error"`
	}
}

// Turn is one message of a fixture conversation, tagged as a messages
// file writes it.
type Turn struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Read reads the fixture at path (testdata/expected.json in chattmpl's
// tests, ../chattmpl/testdata/expected.json beside it).
func Read(t testing.TB, path string) Fixture {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f Fixture
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// Rendered is transformers' rendering of the first k turns of conversation
// conv by template tmpl, with the generation prompt when gen; "" for no
// turns.
func (f Fixture) Rendered(t testing.TB, tmpl, conv string, k int, gen bool) string {
	t.Helper()
	for _, c := range f.Cases {
		if c.Template == tmpl && c.Conversation == conv && c.Turns == k && c.AddGenerationPrompt == gen {
			return c.Output
		}
	}
	if k == 0 {
		return ""
	}
	t.Fatalf("fixture has no %s %s[:%d] gen=%v", tmpl, conv, k, gen)
	return ""
}
