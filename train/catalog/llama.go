// The LLaMA family's entry: model_type llama, qwen2, and mistral where its
// sliding window is off (llama.ReadHFConfig decides), through train/hf.

package catalog

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model"
)

var llamaFamily = &Family{
	Name:        "llama",
	ModelTypes:  []string{"llama", "mistral", "qwen2"},
	ContextName: "max_position_embeddings",
	Presets:     llama.Presets,
	Preset:      asSpec(llama.Preset),
	FromDir:     asSpec(llama.ReadHFConfig),
	Decode:      decodeSpec[llama.Config],
	LoadWeights: func(spec model.Spec, dir string) ([]float32, error) {
		c, err := llamaConfig(spec)
		if err != nil {
			return nil, err
		}
		ck, err := hf.Open(dir)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		defer ck.Close()
		vals, err := ck.LoadFloat32(c.Layout(), llamaLoadOptions(c))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		return vals, nil
	},
	LoadEach: func(spec model.Spec, dir string, sink Sink) error {
		c, err := llamaConfig(spec)
		if err != nil {
			return err
		}
		ck, err := hf.Open(dir)
		if err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		defer ck.Close()
		if err := ck.LoadEach(c.Layout(), llamaLoadOptions(c), sink); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		return nil
	},
	LoadBytes: func(spec model.Spec) int64 { return hf.LoadBytes(spec.Layout()) },
	Export: func(spec model.Spec, dir string, fetch hf.Fetch) error {
		c, err := llamaConfig(spec)
		if err != nil {
			return err
		}
		if err := hf.ExportFrom(dir, c.Layout(), llamaExportOptions, fetch); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		return nil
	},
	ExportBytes: func(spec model.Spec) int64 {
		return hf.ExportBytes(spec.Layout(), llamaExportOptions)
	},
	Tokenizer: func(spec model.Spec) (string, error) {
		// A LLaMA preset is trained from scratch on bytes; a checkpoint
		// with a tokenizer of its own never gets here.
		if spec.VocabSize() < 257 {
			return "", fmt.Errorf("vocab_size %d is smaller than the byte tokenizer's 257", spec.VocabSize())
		}
		return "byte", nil
	},
	Equal: func(a, b model.Spec) bool {
		ca, errA := llamaConfig(a)
		cb, errB := llamaConfig(b)
		return errA == nil && errB == nil && ca.Equal(cb)
	},
}

// llamaExportOptions: fp32, every parameter of the layout (a tied
// model's holds no head).
var llamaExportOptions = hf.ExportOptions{DType: backend.F32}

// llamaLoadOptions: a tied model has no head of its own (its layout
// holds none); a checkpoint that stores one anyway is read as
// transformers reads it, tied to the embedding, so the copy is ignored.
func llamaLoadOptions(c llama.Config) hf.LoadOptions {
	if c.Tied {
		return hf.LoadOptions{Extra: func(name string) bool { return name == "lm_head.weight" }}
	}
	return hf.LoadOptions{}
}

// llamaConfig is spec as the LLaMA family's own type.
func llamaConfig(spec model.Spec) (llama.Config, error) {
	c, ok := spec.(llama.Config)
	if !ok {
		return llama.Config{}, fmt.Errorf("catalog: %T of family %s is not a llama.Config", spec, spec.Family())
	}
	return c, nil
}
