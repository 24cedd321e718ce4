// Spec: what the run (train, checkpoint, eval, compare, the command) needs
// from a model family beyond Arch, so that none of them names a family's
// types. Each family's configuration (gpt2.Config, llama.Config)
// implements it; package train/catalog resolves presets, Hugging Face
// directories and checkpoint records to a Spec.

package model

// Spec is one model architecture of some family, with its sizes. It is a
// value that encodes to JSON (a checkpoint records it under its Family).
type Spec interface {
	Arch
	// Family names the family: "gpt2", "llama".
	Family() string
	// MaxSeqLen is the longest sequence the model takes (its context).
	MaxSeqLen() int
	// VocabSize is the number of token ids.
	VocabSize() int
	// Describe is the log line's view of the architecture, as slog
	// key-value pairs.
	Describe() []any
	// Init returns the seeded initialisation of a model trained from
	// scratch: NumParams values in Layout order.
	Init(seed uint64) []float32
	// HFConfig is the config.json of an export, as transformers'
	// save_pretrained writes it for this architecture.
	HFConfig() ([]byte, error)
}
