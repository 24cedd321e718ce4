package train

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// TestRunLlama2C: a llama2.c .bin fine-tunes (its tokenizer.bin beside
// it) and exports a Hugging Face LLaMA directory carrying the tokenizer;
// the export holds the checkpoint's weights and reads back as the run's
// model.
func TestRunLlama2C(t *testing.T) {
	c := quickConfig(t, "testdata/llama2c/untied.bin")
	c.Steps, c.SeqLen, c.EvalEvery, c.EvalGenerate = 3, 16, 3, 2
	res := mustRun(t, context.Background(), c, Options{})
	st, err := checkpoint.ReadState(readCheckpoint(t, c.Out))
	if err != nil {
		t.Fatal(err)
	}
	if st.Family != "llama" {
		t.Errorf("checkpoint family %q, want llama", st.Family)
	}
	spec, vals, err := catalog.Load(res.Export)
	if err != nil {
		t.Fatal(err)
	}
	if !catalog.Equal(spec, st.Model) {
		t.Errorf("export config %+v, checkpoint %+v", spec, st.Model)
	}
	want := checkpointParams(t, c.Out)
	if len(vals) != len(want) {
		t.Fatalf("export %d values, checkpoint %d", len(vals), len(want))
	}
	for i := range vals {
		if math.Float32bits(vals[i]) != math.Float32bits(want[i]) {
			t.Fatalf("export value %d = %v, checkpoint %v", i, vals[i], want[i])
		}
	}
	var cfg map[string]any
	raw, err := os.ReadFile(filepath.Join(res.Export, "config.json"))
	if err == nil {
		err = json.Unmarshal(raw, &cfg)
	}
	if err != nil || cfg["model_type"] != "llama" {
		t.Errorf("config.json: model_type %v, %v", cfg["model_type"], err)
	}
	tok, found, err := tokenizer.FromDir(res.Export)
	if err != nil || !found {
		t.Fatalf("the export's tokenizer: found %v, %v", found, err)
	}
	bin, err := tokenizer.Open("testdata/llama2c/tokenizer.bin")
	if err != nil {
		t.Fatal(err)
	}
	if s := "the cat said hello"; !slices.Equal(tok.Encode(s), bin.Encode(s)) {
		t.Errorf("exported tokenizer encodes %q as %v, tokenizer.bin as %v", s, tok.Encode(s), bin.Encode(s))
	}
}

// TestSampleCheckpointTokenizer: sampling from a checkpoint file uses the
// tokenizer its run trained with: the --tokenizer the run recorded (here
// the only way to find it: the model file has no tokenizer.bin beside
// it), else that of the --model it recorded.
func TestSampleCheckpointTokenizer(t *testing.T) {
	tmp := t.TempDir()
	copyFile := func(src, dst string) string {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	model := copyFile("testdata/llama2c/tied.bin", filepath.Join(tmp, "model", "stories.bin"))
	tokPath := copyFile("testdata/llama2c/tokenizer.bin", filepath.Join(tmp, "tok", "tok330.bin"))
	c := quickConfig(t, model)
	c.Tokenizer = tokPath
	c.Steps, c.SeqLen, c.EvalEvery, c.EvalGenerate = 1, 16, 0, 0
	mustRun(t, context.Background(), c, Options{})
	ckpt := filepath.Join(c.Out, checkpoint.FileName)
	res, err := eval.Sample(eval.SampleOptions{Model: ckpt, Prompt: "the cat said", MaxNew: 2, Threads: 1})
	if err != nil {
		t.Fatalf("sample from the checkpoint: %v", err)
	}
	if res.PromptTokens != 6 { // BOS " the" " " "c" "at" " said", by tokenizer.bin
		t.Errorf("%d prompt tokens, want 6 (the llama2.c tokenizer's)", res.PromptTokens)
	}
	// The recorded --tokenizer gone, the error names it.
	if err := os.Remove(tokPath); err != nil {
		t.Fatal(err)
	}
	_, err = eval.Sample(eval.SampleOptions{Model: ckpt, Prompt: "hi", MaxNew: 1})
	wantErr(t, err, tokPath, "trained with")
}
