package train

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/models"
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
	spec, vals, err := models.Load(res.Export)
	if err != nil {
		t.Fatal(err)
	}
	if !models.Equal(spec, st.Model) {
		t.Errorf("export config %+v, checkpoint %+v", spec, st.Model)
	}
	want, _, err := readCheckpoint(t, c.Out).Float32("params")
	if err != nil {
		t.Fatal(err)
	}
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
