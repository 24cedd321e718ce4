package train

import (
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/llama2c"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// TestPlanStreamingTransients: the plan's initial weights, weights load
// and export are what those phases hold (the formulas beside their
// buffers), not the whole model in fp32: for llama-7b a small part of
// its 25 GiB; a Hugging Face GPT-2 file, the larger of its tied head's
// comparison and the load.
func TestPlanStreamingTransients(t *testing.T) {
	transient := func(t *testing.T, name string, mode engine.Mode) (model.Spec, map[string]int64) {
		t.Helper()
		c := Defaults()
		c.Model, c.Mode, c.Batch, c.SeqLen = name, mode, 1, 16
		mc, p := memoryPlan(t, c)
		m := map[string]int64{}
		for _, x := range p.Transient {
			m[x.Name] = x.Bytes
		}
		return mc, m
	}
	mc, got := transient(t, "llama-7b", engine.LSP)
	whole := 4 * int64(mc.NumParams())
	if got["initial weights"] != model.InitBytes(mc) || got["export"] != catalog.ExportBytes(mc) {
		t.Errorf("llama-7b: transients %v, want initial weights %d and export %d", got, model.InitBytes(mc), catalog.ExportBytes(mc))
	}
	for _, name := range []string{"initial weights", "export"} {
		if got[name] <= 0 || got[name] > whole/40 {
			t.Errorf("llama-7b: %s planned at %d bytes, want a small part of the model's %d", name, got[name], whole)
		}
	}

	bin := filepath.Join("testdata", "llama2c", "tied.bin")
	mc, got = transient(t, bin, engine.Native)
	if want := llama2c.LoadBytes(mc.(llama.Config)); got["weights load"] != want {
		t.Errorf("llama2.c file: weights load %d bytes, want llama2c.LoadBytes %d", got["weights load"], want)
	}
	dir := filepath.Join("testdata", "llama-tiny-gqa")
	mc, got = transient(t, dir, engine.Native)
	if want := hf.LoadBytes(mc.Layout()); got["weights load"] != want {
		t.Errorf("Hugging Face LLaMA: weights load %d bytes, want hf.LoadBytes %d", got["weights load"], want)
	}
	dir = filepath.Join("testdata", "gpt2-tiny")
	mc, got = transient(t, dir, engine.Native)
	layout := mc.Layout()
	if want := max(hf.SameValuesBytes(layout[0].Len()), hf.LoadBytes(layout)); got["weights load"] != want {
		t.Errorf("Hugging Face GPT-2: weights load %d bytes, want the tied head's check or hf.LoadBytes, %d", got["weights load"], want)
	}
}
