package train

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// TestLoRAExportAndAdapter: a lora run on a checkpoint directory writes
// hf/ as --model's weights with the trained adapter merged (what
// merge_and_unload gives; the control: the base weights alone differ),
// and adapter/ beside it; --adapter then continues from that adapter: its
// first loss is the trained one's, below a fresh adapter's.
func TestLoRAExportAndAdapter(t *testing.T) {
	base := writeModel(t, microConfig(16, 2))
	c := quickConfig(t, base)
	c.Mode, c.LR, c.EvalEvery = engine.LoRA, 1e-2, 0
	res := mustRun(t, context.Background(), c, Options{})
	if res.Adapter != filepath.Join(c.Out, "adapter") {
		t.Fatalf("adapter at %q, want %s/adapter", res.Adapter, c.Out)
	}
	spec, _, err := catalog.Resolve(base)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := model.NewIndex(spec)
	if err != nil {
		t.Fatal(err)
	}
	ad, err := lora.ReadAdapter(res.Adapter, idx)
	if err != nil {
		t.Fatal(err)
	}
	if ad.Cfg.R != lora.DefaultR || len(ad.Sites) != 4*2 || !slices.ContainsFunc(ad.B[0], func(x float32) bool { return x != 0 }) {
		t.Fatalf("adapter r %d on %d modules, B[0] all zero: %v", ad.Cfg.R, len(ad.Sites), !slices.ContainsFunc(ad.B[0], func(x float32) bool { return x != 0 }))
	}
	weights := func(dir string) []float32 {
		t.Helper()
		ck, err := hf.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer ck.Close()
		var vals []float32
		for _, p := range idx.Layout {
			v, _, err := ck.Float32(p.Name)
			if err != nil {
				t.Fatal(err)
			}
			if p.Transposed {
				t.Fatalf("%s: a GPT-2 has no transposed tensor", p.Name)
			}
			vals = append(vals, v...)
		}
		return vals
	}
	want := weights(base)
	if slices.Equal(weights(res.Export), want) {
		t.Fatal("the export is the base model: nothing merged")
	}
	if err := lora.MergeAll(want, idx, ad); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(weights(res.Export), want) {
		t.Fatal("the export is not the base model with adapter/ merged")
	}

	// Continuing from adapter/, against a fresh adapter on the same base.
	first := func(adapter string) float64 {
		c2 := c
		c2.Out, c2.Steps, c2.Adapter = filepath.Join(t.TempDir(), "out"), 1, adapter
		return mustRun(t, context.Background(), c2, Options{}).Losses[0]
	}
	fresh, cont := first(""), first(res.Adapter)
	if !(cont < fresh) {
		t.Errorf("first loss %.4f from the trained adapter, %.4f from a fresh one", cont, fresh)
	}
}
