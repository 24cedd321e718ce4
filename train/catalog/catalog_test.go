package catalog

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

var micro = gpt2.Config{V: 257, MaxT: 16, C: 8, L: 1, NH: 2, Eps: 1e-5}

// exportDir writes spec with its seeded initialisation as a Hugging Face
// directory and returns it with the values.
func exportDir(t *testing.T, spec model.Spec, src string) (string, []float32) {
	t.Helper()
	vals := spec.Init(3)
	return exportTo(t, spec, vals, src, nil), vals
}

// exportTo exports spec with vals (and src's files, tok) as a Hugging
// Face directory of its own and returns it.
func exportTo(t *testing.T, spec model.Spec, vals []float32, src string, tok tokenizer.Tokenizer) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hf")
	if err := Export(spec, dir, vals, src, tok); err != nil {
		t.Fatal(err)
	}
	return dir
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one naming %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not name %q", err, p)
		}
	}
}

func TestResolvePreset(t *testing.T) {
	for _, name := range Presets() {
		spec, src, err := Resolve(name)
		if err != nil || src != "" {
			t.Fatalf("Resolve(%q) = %v, %q, %v; want a preset with no source", name, spec, src, err)
		}
		want, err := Lookup(spec.Family())
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := want.Preset(name); !Equal(spec, p) || !slices.Contains(want.Presets(), name) {
			t.Errorf("Resolve(%q) = %+v, want %+v", name, spec, p)
		}
	}
}

func TestResolveDir(t *testing.T) {
	dir, vals := exportDir(t, micro, "")
	spec, src, err := Resolve(dir)
	if err != nil {
		t.Fatal(err)
	}
	if src != dir || !Equal(spec, micro) {
		t.Fatalf("Resolve(dir) = %+v, %q; want %+v, %q", spec, src, micro, dir)
	}
	got, err := LoadWeights(spec, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, vals) {
		t.Error("weights read back differ from the exported ones")
	}
}

// A directory named like a preset but without config.json is not a model,
// and says so rather than resolving to the preset silently.
func TestResolveDirWithoutConfig(t *testing.T) {
	dir := t.TempDir()
	_, _, err := Resolve(dir)
	wantErr(t, err, dir, "without config.json")
}

func TestResolveUnknownName(t *testing.T) {
	_, _, err := Resolve("gpt3-mini")
	wantErr(t, err, append([]string{`"gpt3-mini"`, "gpt2:"}, Presets()...)...)
	_, _, err = Resolve(filepath.Join(t.TempDir(), "no-such-model"))
	wantErr(t, err, "no-such-model", "neither a checkpoint directory nor a preset")
}

func TestFromDirModelType(t *testing.T) {
	dir, _ := exportDir(t, micro, "")
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	write := func() {
		raw, _ := json.Marshal(h)
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	h["model_type"] = "qwen3"
	write()
	_, _, err = Resolve(dir)
	wantErr(t, err, path, "model_type", `"qwen3"`, "supported: "+strings.Join(ModelTypes(), ", "))

	// The original gpt2 hub files name no model_type: GPT-2.
	delete(h, "model_type")
	write()
	spec, err := FromDir(dir)
	if err != nil || !Equal(spec, micro) {
		t.Errorf("FromDir without model_type = %+v, %v; want %+v", spec, err, micro)
	}

	if err := os.WriteFile(path, []byte(`{"model_type": "gpt2",`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = FromDir(dir)
	wantErr(t, err, path)
}

// Every preset of every family survives a checkpoint's record: encoded to
// JSON and decoded under its family, it is the same spec.
func TestDecodeRoundTrip(t *testing.T) {
	for _, name := range Presets() {
		spec, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(spec.Family(), raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !Equal(back, spec) {
			t.Errorf("%s: decoded %+v, encoded %+v", name, back, spec)
		}
	}
}

// A checkpoint from before families were recorded holds a GPT-2 config
// with no family beside it.
func TestDecodeLegacy(t *testing.T) {
	raw := `{"vocab_size":257,"n_positions":16,"n_embd":8,"n_layer":1,"n_head":2,"layer_norm_epsilon":0.00001}`
	spec, err := Decode("", []byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := spec.(gpt2.Config); !ok || c != micro {
		t.Errorf("Decode of a legacy record = %#v, want %+v", spec, micro)
	}
}

func TestDecodeBad(t *testing.T) {
	_, err := Decode("mamba", []byte(`{}`))
	wantErr(t, err, `"mamba"`, "gpt2")
	_, err = Decode("gpt2", []byte(`{"vocab_size":257,"n_positions":16,"n_embd":9,"n_layer":1,"n_head":2,"layer_norm_epsilon":1e-5}`))
	wantErr(t, err, "gpt2", "n_embd=9", "n_head=2")
	_, err = Decode("gpt2", []byte(`[1]`))
	wantErr(t, err, "gpt2")
}

// otherSpec is a spec of another family with the same fields as a GPT-2.
type otherSpec struct{ gpt2.Config }

func (otherSpec) Family() string { return "other" }

func TestEqual(t *testing.T) {
	wider := micro
	wider.C = 16
	switch {
	case !Equal(micro, micro):
		t.Error("a spec differs from itself")
	case Equal(micro, wider):
		t.Error("specs of different widths are equal")
	case Equal(micro, otherSpec{micro}):
		t.Error("specs of different families are equal")
	case Equal(micro, nil) || !Equal(nil, nil):
		t.Error("nil specs compare wrong")
	}
}

func TestFamilyFacts(t *testing.T) {
	tiny, _ := Preset("tiny")
	big, _ := Preset("gpt2")
	if n := ContextName(tiny); n != "n_positions" {
		t.Errorf("ContextName = %q, want n_positions", n)
	}
	for spec, want := range map[model.Spec]string{tiny: "byte", big: "gpt2"} {
		tok, err := Tokenizer(spec, "", "")
		if err != nil || tok.Name() != want {
			t.Errorf("Tokenizer(%+v) = %v, %v; want %s", spec, tok, err, want)
		}
	}
	if _, err := Tokenizer(otherSpec{micro}, "", ""); err == nil {
		t.Error("Tokenizer of an unknown family: no error")
	}
}

// Export writes config.json as the spec's HFConfig, carries the tokenizer
// files of its source along (byte for byte, following a symbolic link as
// Hugging Face's cache has), and nothing else from it.
func TestExportTokenizerFiles(t *testing.T) {
	src := t.TempDir()
	files := map[string]string{"tokenizer.json": `{"version": "1.0"}`, "merges.txt": "#version: 0.2\nĠ t\n"}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	blob := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(blob, []byte(`{"model_max_length": 16}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(blob, filepath.Join(src, "tokenizer_config.json")); err != nil {
		t.Fatal(err)
	}
	files["tokenizer_config.json"] = `{"model_max_length": 16}`
	if err := os.WriteFile(filepath.Join(src, "notes.txt"), []byte("not a tokenizer"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, _ := exportDir(t, micro, src)
	for name, text := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != text {
			t.Errorf("%s in the export: %q, %v; want %q", name, got, err, text)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err == nil {
		t.Error("notes.txt, not a tokenizer file, was copied")
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := micro.HFConfig()
	if err != nil {
		t.Fatal(err)
	}
	if string(cfg) != string(want) {
		t.Errorf("config.json:\n%s\nwant the spec's HFConfig:\n%s", cfg, want)
	}

	// A preset's export has no source and no tokenizer files.
	bare, _ := exportDir(t, micro, "")
	entries, err := os.ReadDir(bare)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"config.json", "model.safetensors"}) {
		t.Errorf("a preset's export holds %v, want config.json and model.safetensors", names)
	}

	if err := Export(micro, filepath.Join(t.TempDir(), "short"), make([]float32, 3), "", nil); err == nil {
		t.Error("Export of 3 values for a larger model: no error")
	}
}
