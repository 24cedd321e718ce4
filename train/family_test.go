// Tests of the run's use of train/catalog: the family is recorded in the
// checkpoint, a resume with another model is refused naming both, and the
// export carries --model's tokenizer files along.

package train

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

func TestRunFamily(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	// The model's own tokenizer: the byte tokenizer's file form, with a
	// mark that only a copy of this file would carry.
	if _, err := tokenizer.Save(tokenizer.Byte(), model); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(model, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.Replace(string(raw), "{", `{"lsp_test_mark": 1,`, 1)
	if err := os.WriteFile(filepath.Join(model, "tokenizer.json"), []byte(tok), 0o644); err != nil {
		t.Fatal(err)
	}
	c := quickConfig(t, model)
	c.Steps, c.EvalEvery, c.EvalGenerate = 2, 0, 0
	res := mustRun(t, context.Background(), c, Options{})

	got, err := os.ReadFile(filepath.Join(res.Export, "tokenizer.json"))
	if err != nil || string(got) != tok {
		t.Errorf("hf/tokenizer.json = %q, %v; want --model's %q", got, err, tok)
	}
	st, err := checkpoint.ReadState(readCheckpoint(t, c.Out))
	if err != nil {
		t.Fatal(err)
	}
	if st.Family != "gpt2" || st.Model.NumParams() != microConfig(16, 1).NumParams() {
		t.Errorf("checkpoint records family %q model %+v; want gpt2 %+v", st.Family, st.Model, microConfig(16, 1))
	}

	// Resuming with a wider model of the same family is refused before
	// anything is restored, naming the checkpoint and both models.
	c.Model, c.Resume, c.Steps = writeModel(t, microConfig(32, 1)), true, 3
	_, err = Run(context.Background(), c, Options{})
	wantErr(t, err, filepath.Join(c.Out, checkpoint.FileName), "C:16", "C:32")
	if err != nil && !strings.Contains(err.Error(), "gpt2 model") {
		t.Errorf("error %q does not name the models' family", err)
	}
}
