// Config as a model.Spec: what the run needs from a GPT-2 architecture
// beyond its layout and model (package train/models resolves --model,
// Hugging Face directories and checkpoint records to it).

package gpt2

import (
	"os"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/model"
)

// FamilyName is the family's name in checkpoints and in config.json's
// model_type.
const FamilyName = "gpt2"

var _ model.Spec = Config{}

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

// HFConfig is the config.json ExportHF writes for c (model.Spec).
func (c Config) HFConfig() ([]byte, error) {
	// writeHFConfig is the one writer of GPT-2's config.json; it writes
	// a file, so the bytes are read back from a scratch directory.
	dir, err := os.MkdirTemp("", "gpt2-config-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := writeHFConfig(dir, c); err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(dir, "config.json"))
}
