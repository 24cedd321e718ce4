// Package gpt2 is the GPT-2 model on the Backend: configuration and presets,
// the parameter layout (every parameter in one device allocation, in Hugging
// Face order and names), forward and backward passes, and import and export
// of Hugging Face checkpoints.
package gpt2

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/model"
)

// Config is a GPT-2 architecture. Names follow llm.c: V vocabulary, MaxT
// context length, C channels, L layers, NH heads.
type Config struct {
	V    int     `json:"vocab_size"`
	MaxT int     `json:"n_positions"`
	C    int     `json:"n_embd"`
	L    int     `json:"n_layer"`
	NH   int     `json:"n_head"`
	Eps  float32 `json:"layer_norm_epsilon"`
}

// presets are the named architectures. tiny is the default demo: small
// enough to learn the built-in task in a few minutes on two cores; mini is
// tiny with a 256-token context, for text and instruction data (make
// bench-quality pretrains it on a corpus in about 15 minutes).
var presets = map[string]Config{
	"tiny":        {V: 257, MaxT: 64, C: 128, L: 4, NH: 4, Eps: 1e-5},
	"mini":        {V: 257, MaxT: 256, C: 128, L: 4, NH: 4, Eps: 1e-5},
	"gpt2":        {V: 50257, MaxT: 1024, C: 768, L: 12, NH: 12, Eps: 1e-5},
	"gpt2-medium": {V: 50257, MaxT: 1024, C: 1024, L: 24, NH: 16, Eps: 1e-5},
	"gpt2-large":  {V: 50257, MaxT: 1024, C: 1280, L: 36, NH: 20, Eps: 1e-5},
	"gpt2-xl":     {V: 50257, MaxT: 1024, C: 1600, L: 48, NH: 25, Eps: 1e-5},
}

// Presets lists the preset names, sorted.
func Presets() []string { return model.PresetNames(presets) }

// Preset returns a named architecture.
func Preset(name string) (Config, error) { return model.Preset(presets, "model preset", name) }

// Tokenizer names the tokenizer a config expects: byte-level for the
// 257-token vocabulary, GPT-2 BPE otherwise.
func (c Config) Tokenizer() string {
	if c.V == 257 {
		return "byte"
	}
	return "gpt2"
}

// Validate reports an inconsistent architecture.
func (c Config) Validate() error {
	switch {
	case c.V <= 0 || c.MaxT <= 0 || c.C <= 0 || c.L <= 0 || c.NH <= 0:
		return fmt.Errorf("model config: sizes must be positive (vocab_size=%d n_positions=%d n_embd=%d n_layer=%d n_head=%d)",
			c.V, c.MaxT, c.C, c.L, c.NH)
	case c.C%c.NH != 0:
		return fmt.Errorf("model config: n_embd=%d is not divisible by n_head=%d", c.C, c.NH)
	case !(c.Eps > 0):
		return fmt.Errorf("model config: layer_norm_epsilon=%g must be positive", c.Eps)
	}
	return nil
}

// Layout lists every parameter in allocation order, with Hugging Face's
// names and shapes (Conv1D weights are in x out): embeddings, then each
// layer's tensors together, then the final LayerNorm. The LM head is tied
// to wte and has no storage of its own.
func (c Config) Layout() []model.Param {
	var ps []model.Param
	off, layer := 0, -1
	add := func(name string, decay bool, shape ...int) {
		p := model.Param{Name: name, Shape: shape, Offset: off, Decay: decay, Layer: layer}
		off += p.Len()
		ps = append(ps, p)
	}
	// pass says which backward passes outside the blocks write the
	// gradient of the tensor added last (model.Param.Backward).
	pass := func(b model.Pass) { ps[len(ps)-1].Backward = b }
	C := c.C
	add("transformer.wte.weight", true, c.V, C)
	pass(model.ByHead | model.ByEmbed) // the tied head
	add("transformer.wpe.weight", true, c.MaxT, C)
	pass(model.ByEmbed)
	for l := 0; l < c.L; l++ {
		layer = l
		h := fmt.Sprintf("transformer.h.%d.", l)
		add(h+"ln_1.weight", false, C)
		add(h+"ln_1.bias", false, C)
		add(h+"attn.c_attn.weight", true, C, 3*C)
		add(h+"attn.c_attn.bias", false, 3*C)
		add(h+"attn.c_proj.weight", true, C, C)
		add(h+"attn.c_proj.bias", false, C)
		add(h+"ln_2.weight", false, C)
		add(h+"ln_2.bias", false, C)
		add(h+"mlp.c_fc.weight", true, C, 4*C)
		add(h+"mlp.c_fc.bias", false, 4*C)
		add(h+"mlp.c_proj.weight", true, 4*C, C)
		add(h+"mlp.c_proj.bias", false, C)
	}
	layer = -1
	add("transformer.ln_f.weight", false, C)
	pass(model.ByHead)
	add("transformer.ln_f.bias", false, C)
	pass(model.ByHead)
	return ps
}

// NumParams is the number of parameter elements.
func (c Config) NumParams() int {
	ps := c.Layout()
	last := ps[len(ps)-1]
	return last.Offset + last.Len()
}

// Layers is the number of blocks (model.Arch).
func (c Config) Layers() int { return c.L }

// perLayer is the number of parameter tensors of one transformer block.
const perLayer = 12
