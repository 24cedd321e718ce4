// Sampling from a trained model, for the sample command: find the export,
// check the options (naming their flags), open the backend, generate.

package eval

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/models"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// SampleOptions configure Sample.
type SampleOptions struct {
	Model       string // Hugging Face directory, or a training output directory holding hf/
	Tokenizer   string // --tokenizer: instead of the model directory's (see models.Tokenizer)
	Prompt      string
	Alpaca      bool // wrap Prompt in the Alpaca template
	MaxNew      int
	Temperature float64
	TopP        float64
	Seed        uint64
	Threads     int
}

var flagErr = flagerr.New

// Sample loads a model and continues the prompt.
func Sample(o SampleOptions) (string, error) {
	dir := o.Model
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		if _, err2 := os.Stat(filepath.Join(dir, "hf", "config.json")); err2 == nil {
			dir = filepath.Join(dir, "hf")
		} else {
			return "", flagErr("model", "%s holds no config.json (nor hf/config.json)", o.Model)
		}
	}
	if o.TopP < 0 || o.TopP > 1 {
		return "", flagErr("top-p", "must be in (0, 1], got %g", o.TopP)
	}
	if o.Temperature < 0 {
		return "", flagErr("temperature", "must be >= 0, got %g", o.Temperature)
	}
	spec, vals, err := models.Load(dir)
	if err != nil {
		return "", flagErr("model", "%v", err)
	}
	tok, err := models.Tokenizer(spec, dir, o.Tokenizer)
	if err != nil {
		if o.Tokenizer != "" {
			return "", flagErr("tokenizer", "%v", err)
		}
		return "", flagErr("model", "%v", err)
	}
	be, err := device.Open(device.Config{Kind: device.CPU, Threads: o.Threads})
	if err != nil {
		return "", fmt.Errorf("sample: %w", err)
	}
	defer be.Close()
	s := be.DefaultStream()
	T := spec.MaxSeqLen()
	mm, err := spec.NewModel(be, 1, T, backend.F32, model.Options{})
	if err != nil {
		return "", err
	}
	defer mm.Free()
	m := Model{Model: mm, Spec: spec, B: 1, T: T}
	if err := backend.Upload(be, s, m.Buffers().Params, vals); err != nil {
		return "", err
	}
	prompt := o.Prompt
	if o.Alpaca {
		prompt = data.AlpacaPrompt(o.Prompt, "")
	}
	ids := append(tokenizer.Prefix(tok), tok.Encode(prompt)...)
	if len(ids) >= T {
		return "", flagErr("prompt", "%d tokens, the model context is %d", len(ids), T)
	}
	out, err := Generate(be, s, m, [][]int32{ids}, max(o.MaxNew, 1), tok.EOS(), NewSampler(o.Temperature, o.TopP, o.Seed))
	if err != nil {
		return "", fmt.Errorf("sample: %w", err)
	}
	return tok.Decode(out[0]), nil
}
