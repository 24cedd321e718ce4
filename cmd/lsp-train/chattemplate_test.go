// Tests of --chat-template through the command (issue 42), each as a
// child process: which rendering a run on conversations uses and logs, a
// resume that refuses another template, a template that does not parse,
// and sample --chat's prompt.

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// writeTemplate writes a chat template file.
func writeTemplate(t *testing.T, name, src string) string {
	t.Helper()
	return tempFile(t, name, []byte(src))
}

// A small template with the prefix property training needs: the
// generation prompt is the assistant turn's header.
const testTemplate = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}\n"

func TestChatTemplateFlag(t *testing.T) {
	data := chatJSONL(t, "train.jsonl", 20)
	tmpl := writeTemplate(t, "mine.jinja", testTemplate)
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := execCmd(t, "", append(chatRun(out), "--data", data, "--chat-template", tmpl)...)
	if code != 0 {
		t.Fatalf("--chat-template: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if want := `msg="conversations rendered" with="chat template ` + tmpl + `"`; !strings.Contains(stderr, want) {
		t.Errorf("the log does not say %q:\n%s", want, stderr)
	}

	// The tiny preset's byte tokenizer has no chat_template: the fixed
	// format, said so.
	code, stdout, stderr = execCmd(t, "", append(chatRun(filepath.Join(t.TempDir(), "out")), "--data", data)...)
	if code != 0 || !strings.Contains(stderr, `msg="conversations rendered" with="fixed ChatML-like format (no chat_template)"`) {
		t.Errorf("no template: exit %d, want 0 and the fixed format logged\n%s\n%s", code, stdout, stderr)
	}

	// Resuming with another template is refused, naming both.
	other := writeTemplate(t, "other.jinja", testTemplate)
	code, stdout, stderr = execCmd(t, "", append(chatRun(out), "--data", data, "--chat-template", other, "--resume", "--steps", "2")...)
	if want := "--chat-template: checkpoint has " + tmpl + ", command line has " + other; code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("resume with another template: exit %d, want an error saying %q\n%s\n%s", code, want, stdout, stderr)
	}
	// ... and with the same one it goes on.
	code, stdout, stderr = execCmd(t, "", append(chatRun(out), "--data", data, "--chat-template", tmpl, "--resume", "--steps", "2")...)
	if code != 0 {
		t.Errorf("resume with the same template: exit %d\n%s\n%s", code, stdout, stderr)
	}

	// sample --chat renders the prompt as one user turn with the
	// generation prompt: "<|user|>hi</s><|assistant|>" is 27 bytes.
	code, stdout, stderr = execCmd(t, "", "sample", "--model", out, "--prompt", "hi", "--chat", "--chat-template", tmpl, "--max-new", "2", "--threads", "1")
	if code != 0 || !strings.Contains(stderr, "27 prompt tokens") {
		t.Errorf("sample --chat: exit %d, want 0 and 27 prompt tokens\n%s\n%s", code, stdout, stderr)
	}

	// Refusals name the flag and the file.
	broken := writeTemplate(t, "broken.jinja", "{% for m in messages %}")
	raises := writeTemplate(t, "raises.jinja", "{{ raise_exception('only user turns') }}")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{append(chatRun(filepath.Join(t.TempDir(), "out")), "--data", data, "--chat-template", broken), []string{"--chat-template", broken}},
		{append(chatRun(filepath.Join(t.TempDir(), "out")), "--data", data, "--chat-template", raises), []string{"--data", raises, "only user turns"}},
		{[]string{"sample", "--model", out, "--prompt", "hi", "--chat", "--alpaca"}, []string{"--chat", "--alpaca"}},
		{[]string{"sample", "--model", out, "--prompt", "hi", "--chat-template", tmpl}, []string{"--chat-template", "--chat too"}},
	} {
		code, stdout, stderr := execCmd(t, "", tc.args...)
		for _, w := range tc.want {
			if code == 0 || !strings.Contains(stderr, w) {
				t.Errorf("%v: exit %d, want an error saying %q\n%s\n%s", tc.args, code, w, stdout, stderr)
			}
		}
	}
}

// copyFile copies src to dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.WriteFile(dst, readFile(t, src), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointChatTemplate: without --chat-template a run renders
// conversations with the chat_template of the checkpoint's
// tokenizer_config.json, and sample --chat its prompt; a checkpoint
// template that does not parse fails conversation data, naming the file,
// but not other data.
func TestCheckpointChatTemplate(t *testing.T) {
	model := filepath.Join(t.TempDir(), "hf")
	mc := gpt2.Config{V: 512, MaxT: 128, C: 32, L: 1, NH: 2, Eps: 1e-5}
	if err := gpt2.ExportHF(model, mc, gpt2.Init(mc, 7)); err != nil {
		t.Fatal(err)
	}
	// A small Qwen2-style tokenizer (453 ids, <|im_start|> and <|im_end|>
	// among them) and a ChatML template.
	copyFile(t, "../../train/tokenizer/testdata/qwen2/tokenizer.json", filepath.Join(model, "tokenizer.json"))
	tmpl := "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
	cfg, err := json.Marshal(map[string]any{"bos_token": nil, "eos_token": "<|im_end|>", "chat_template": tmpl})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(model, "tokenizer_config.json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	data := chatJSONL(t, "train.jsonl", 20)
	run := func(data string) []string {
		return []string{"--model", model, "--data", data, "--steps", "1", "--batch", "4", "--seq-len", "64", "--threads", "1",
			"--eval-every", "0", "--eval-generate", "2", "--eval-max-new", "4", "--out", filepath.Join(t.TempDir(), "out")}
	}
	code, stdout, stderr := execCmd(t, "", run(data)...)
	if want := `msg="conversations rendered" with="chat template ` + cfgPath + ` chat_template"`; code != 0 || !strings.Contains(stderr, want) {
		t.Errorf("checkpoint template: exit %d, want 0 and the log saying %q\n%s\n%s", code, want, stdout, stderr)
	}

	tok, err := tokenizer.Open(model)
	if err != nil {
		t.Fatal(err)
	}
	n := len(tok.Encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
	code, stdout, stderr = execCmd(t, "", "sample", "--model", model, "--prompt", "hi", "--chat", "--max-new", "2", "--threads", "1")
	if want := strconv.Itoa(n) + " prompt tokens"; code != 0 || !strings.Contains(stderr, want) {
		t.Errorf("sample --chat: exit %d, want 0 and %q\n%s\n%s", code, want, stdout, stderr)
	}

	if err := os.WriteFile(cfgPath, []byte(`{"eos_token": "<|im_end|>", "chat_template": "{% if %}"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = execCmd(t, "", run(data)...)
	if code == 0 || !strings.Contains(stderr, "--data") || !strings.Contains(stderr, cfgPath) {
		t.Errorf("broken checkpoint template: exit %d, want an error naming --data and %s\n%s\n%s", code, cfgPath, stdout, stderr)
	}
	code, stdout, stderr = execCmd(t, "", run("builtin:copy:50")...)
	if code != 0 {
		t.Errorf("broken checkpoint template, builtin data: exit %d, want 0\n%s\n%s", code, stdout, stderr)
	}
}
