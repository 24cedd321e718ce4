// llama2.c model files as a source of the LLaMA family: --model names a
// .bin file (train/llama2c reads it), whose tokenizer is the tokenizer.bin
// beside it unless --tokenizer names one. A run from such a file records
// a llama.Config like any LLaMA and exports a Hugging Face directory.

package catalog

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/llama2c"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// isFile reports whether src, a model's source, is a file (a llama2.c
// model) rather than a directory.
func isFile(src string) bool {
	if src == "" {
		return false
	}
	st, err := os.Stat(src)
	return err == nil && st.Mode().IsRegular()
}

// llama2cWeights reads the weights of the llama2.c model at path, which
// must have the architecture spec.
func llama2cWeights(spec model.Spec, path string) ([]float32, error) {
	c, vals, err := llama2c.Load(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if !Equal(spec, c) {
		return nil, fmt.Errorf("checkpoint: %s holds another architecture than the one it was resolved to", path)
	}
	return vals, nil
}

// llama2cLoadEach hands the weights of the llama2.c model at path, which
// must have the architecture spec, to sink a tensor at a time: a first
// pass checks the whole file (every weight finite) holding nothing, so
// that a bad file reaches sink with nothing; the second hands over each
// tensor as it is read (llama2c.LoadBytes).
func llama2cLoadEach(spec model.Spec, path string, sink Sink) error {
	c, err := llama2c.Check(path)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if !Equal(spec, c) {
		return fmt.Errorf("checkpoint: %s holds another architecture than the one it was resolved to", path)
	}
	_, err = llama2c.Each(path, func(p model.Param, v []float32) error {
		return sink(p.Offset, v)
	})
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// llama2cTokenizer is the tokenizer.bin beside the llama2.c model at path.
func llama2cTokenizer(path string) (tokenizer.Tokenizer, error) {
	p := filepath.Join(filepath.Dir(path), "tokenizer.bin")
	if _, err := os.Stat(p); err != nil {
		return nil, fmt.Errorf("no tokenizer.bin beside the llama2.c model %s: give --tokenizer (llama2.c's tokenizer .bin, e.g. tok512.bin for stories260K)", path)
	}
	return tokenizer.LoadLlama2C(p)
}
