package train

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// qloraConfig is the quick job in lora mode on a quantized base.
func qloraConfig(t *testing.T, model, base string) Config {
	c := quickConfig(t, model)
	c.Mode, c.DenseParams, c.BaseDType = engine.LoRA, engine.DenseFrozen, base
	c.EvalEvery, c.EvalGenerate = 0, 0
	return c
}

// TestQuantizedBaseExport: with --base-dtype the hf/ export is the base
// as the run computed with it (each block matrix quantized and
// dequantized, train/quant) with the adapter beside it merged in, and the
// frozen dense parameters exactly --model's: nothing else changed.
func TestQuantizedBaseExport(t *testing.T) {
	for _, base := range []string{"nf4", "int8"} {
		t.Run(base, func(t *testing.T) {
			cfg := microConfig(16, 2)
			dir := writeModel(t, cfg)
			res := mustRun(t, context.Background(), qloraConfig(t, dir, base), Options{})
			spec, got, err := catalog.Load(res.Export)
			if err != nil {
				t.Fatal(err)
			}
			idx, err := model.NewIndex(spec)
			if err != nil {
				t.Fatal(err)
			}
			want := gpt2.Init(cfg, 7) // writeModel's weights
			f, _ := lora.ParseBaseDType(base)
			changed := 0
			for _, row := range idx.MatParam {
				for _, i := range row {
					p := idx.Layout[i]
					v := want[p.Offset : p.Offset+p.Len()]
					q, err := quant.Quantize(f, p.Shape[0], p.Shape[1], v)
					if err != nil {
						t.Fatal(err)
					}
					before := append([]float32(nil), v...)
					if err := q.Dequantize(0, v); err != nil {
						t.Fatal(err)
					}
					for j := range v {
						if v[j] != before[j] {
							changed++
						}
					}
				}
			}
			if changed == 0 {
				t.Fatal("quantization changed no weight: the test compares nothing")
			}
			ad, err := lora.ReadAdapter(res.Adapter, idx)
			if err != nil {
				t.Fatal(err)
			}
			if err := lora.MergeAll(want, idx, ad); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("export element %d is %v, the dequantized base with the adapter merged %v", i, got[i], want[i])
				}
			}
		})
	}
}

// TestQuantizedBaseResumeChecksModel: a resume quantizes the base again
// from --model; if the weights there changed since the run started, it is
// refused naming --model and the tensor, not trained on silently.
func TestQuantizedBaseResumeChecksModel(t *testing.T) {
	cfg := microConfig(16, 2)
	dir := writeModel(t, cfg)
	c := qloraConfig(t, dir, "nf4")
	mustRun(t, context.Background(), c, Options{StopAfter: 3})
	w := gpt2.Init(cfg, 7)
	idx, err := model.NewIndex(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := idx.Layout[idx.MatParam[1][0]]
	w[p.Offset+5] += 0.25 // one weight of one matrix
	if err := gpt2.ExportHF(dir, cfg, w); err != nil {
		t.Fatal(err)
	}
	c.Resume = true
	_, err = Run(context.Background(), c, Options{})
	var fe *FlagError
	if err == nil || !errors.As(err, &fe) || fe.Flag != "model" || !strings.Contains(err.Error(), p.Name) || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("resume on a changed --model: %v, want an error naming --model, %s and the change", err, p.Name)
	}
}
