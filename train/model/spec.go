// Spec: what the run (train, checkpoint, eval, compare, the command) needs
// from a model family beyond Arch, so that none of them names a family's
// types. Each family's configuration (gpt2.Config, llama.Config)
// implements it; package train/catalog resolves presets, Hugging Face
// directories and checkpoint records to a Spec.

package model

import "github.com/lsp-offload/lsp-offload/train/backend"

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
	// scratch: NumParams values in Layout order (InitEach's, gathered).
	Init(seed uint64) []float32
	// InitEach is Init one parameter at a time, in Layout order, so that
	// a run can upload the initialisation of a model larger than its
	// host's memory: fn gets each parameter and its values, in one buffer
	// of InitBytes that the next parameter reuses (fn must not keep v).
	// An error of fn stops it and is returned.
	InitEach(seed uint64, fn func(p Param, v []float32) error) error
	// HFConfig is the config.json of an export, as transformers'
	// save_pretrained writes it for this architecture.
	HFConfig() ([]byte, error)
}

// DecoderSpec is a Spec whose models decode with a KV cache
// (model.Cached): DecoderBytes is the device memory NewDecoder(maxT)
// allocates in dtype dt, which a run's memory plan counts when its
// evaluation generates with the cache.
type DecoderSpec interface {
	DecoderBytes(maxT int, dt backend.DType) int64
}

// InitBuffer is the buffer a Spec's InitEach fills each parameter in:
// as long as a's longest parameter.
func InitBuffer(a Arch) []float32 {
	return make([]float32, LongestParam(a.Layout()))
}

// InitBytes is the host memory InitEach of a holds at once: InitBuffer.
func InitBytes(a Arch) int64 { return 4 * int64(LongestParam(a.Layout())) }

// LongestParam is the element count of layout's longest parameter: the
// buffer of a reader that holds one parameter at a time.
func LongestParam(layout []Param) int {
	n := 0
	for _, p := range layout {
		n = max(n, p.Len())
	}
	return n
}
