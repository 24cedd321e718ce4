// Config as a model.Spec: what the run needs from a GPT-2 architecture
// beyond its layout and model (package train/catalog resolves --model,
// Hugging Face directories and checkpoint records to it).

package gpt2

import (
	"encoding/json"
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/model"
)

// FamilyName is the family's name in checkpoints and in config.json's
// model_type.
const FamilyName = "gpt2"

var (
	_ model.Spec        = Config{}
	_ model.DecoderSpec = Config{}
)

// Family names the family (model.Spec).
func (c Config) Family() string { return FamilyName }

// MaxSeqLen is the context, n_positions (model.Spec).
func (c Config) MaxSeqLen() int { return c.MaxT }

// VocabSize is vocab_size (model.Spec).
func (c Config) VocabSize() int { return c.V }

// Describe is the log line's view of the architecture (model.Spec).
func (c Config) Describe() []any {
	return []any{"params", c.NumParams(), "layers", c.L, "width", c.C, "heads", c.NH, "vocab", c.V}
}

// Init is GPT-2's seeded initialisation, Init (model.Spec).
func (c Config) Init(seed uint64) []float32 { return Init(c, seed) }

// InitEach is InitEach of c (model.Spec).
func (c Config) InitEach(seed uint64, fn func(p model.Param, v []float32) error) error {
	return InitEach(c, seed, fn)
}

// HFConfig is the config.json ExportHF writes for c (model.Spec), built
// in memory: an export must not write anywhere but its own directory.
func (c Config) HFConfig() ([]byte, error) {
	tie, eps := true, float32JSON(c.Eps)
	h := hfConfig{
		ModelType: "gpt2", Architectures: []string{"GPT2LMHeadModel"},
		VocabSize: c.V, NPositions: c.MaxT, NCtx: c.MaxT, NEmbd: c.C, NLayer: c.L, NHead: c.NH,
		Activation: "gelu_new", LayerNormEpsilon: &eps, TieWordEmbeddings: &tie,
		InitializerRange: 0.02, BosTokenID: c.V - 1, EosTokenID: c.V - 1, TorchDtype: "float32",
	}
	raw, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	return append(raw, '\n'), nil
}
