// The GPT-2 family's entry.

package catalog

import (
	"fmt"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/model"
)

var gpt2Family = &Family{
	Name:        gpt2.FamilyName,
	ModelTypes:  []string{"gpt2"},
	ContextName: "n_positions",
	Presets:     gpt2.Presets,
	Preset:      asSpec(gpt2.Preset),
	FromDir:     asSpec(gpt2.ReadHFConfig),
	Decode:      decodeSpec[gpt2.Config],
	LoadWeights: func(spec model.Spec, dir string) ([]float32, error) {
		c, err := gpt2Config(spec)
		if err != nil {
			return nil, err
		}
		return gpt2.LoadWeights(filepath.Join(dir, "model.safetensors"), c)
	},
	LoadEach: func(spec model.Spec, dir string, sink Sink) error {
		c, err := gpt2Config(spec)
		if err != nil {
			return err
		}
		return gpt2.LoadEach(filepath.Join(dir, "model.safetensors"), c, sink)
	},
	LoadBytes: func(spec model.Spec) int64 {
		// The tied head's comparison (a file that stores one), then the
		// load.
		layout := spec.Layout()
		return max(hf.SameValuesBytes(layout[0].Len()), hf.LoadBytes(layout))
	},
	Export: func(spec model.Spec, dir string, fetch hf.Fetch) error {
		c, err := gpt2Config(spec)
		if err != nil {
			return err
		}
		return gpt2.ExportHFFrom(dir, c, fetch)
	},
	ExportBytes: func(spec model.Spec) int64 {
		c, err := gpt2Config(spec)
		if err != nil {
			return 0
		}
		return gpt2.ExportBytes(c)
	},
	Tokenizer: func(spec model.Spec) (string, error) {
		c, err := gpt2Config(spec)
		if err != nil {
			return "", err
		}
		return c.Tokenizer(), nil
	},
}

// gpt2Config is spec as the GPT-2 family's own type.
func gpt2Config(spec model.Spec) (gpt2.Config, error) {
	c, ok := spec.(gpt2.Config)
	if !ok {
		return gpt2.Config{}, fmt.Errorf("catalog: %T of family %s is not a gpt2.Config", spec, spec.Family())
	}
	return c, nil
}
