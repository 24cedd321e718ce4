// Package llama is the LLaMA model family on the Backend (LLaMA 1-3,
// TinyLlama, SmolLM2, DeepSeek-Coder, Qwen2/Qwen2.5, and Mistral without a
// sliding window shorter than the run's sequences): configuration in Hugging Face's
// config.json names, presets of the real models' shapes, the parameter
// layout (one device allocation, HF names, projections stored in x out),
// and the forward and backward passes through train/model's contract.
package llama

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/lsp-offload/lsp-offload/train/model"
)

// Config is a LLaMA architecture. Its JSON form uses the field names of
// transformers' LlamaConfig (the transformers 4 layout, with rope_theta
// and rope_scaling at the top level), so a checkpoint records it in a
// form a reader of config.json recognizes.
type Config struct {
	Vocab        int `json:"vocab_size"`
	Hidden       int `json:"hidden_size"`
	Intermediate int `json:"intermediate_size"`
	NumLayers    int `json:"num_hidden_layers"`
	Heads        int `json:"num_attention_heads"`
	KVHeads      int `json:"num_key_value_heads"`
	// HeadDim is each head's size; 0 means Hidden / Heads (LlamaConfig's
	// default).
	HeadDim     int          `json:"head_dim,omitempty"`
	Eps         float32      `json:"rms_norm_eps"`
	RopeTheta   float64      `json:"rope_theta"`
	RopeScaling *RopeScaling `json:"rope_scaling,omitempty"`
	MaxPos      int          `json:"max_position_embeddings"`
	Tied        bool         `json:"tie_word_embeddings"`
	BOS         TokenIDs     `json:"bos_token_id"`
	EOS         TokenIDs     `json:"eos_token_id"`
	// InitRange is the standard deviation of Init's normal draws; 0 means
	// 0.02 (LlamaConfig's initializer_range).
	InitRange float64 `json:"initializer_range,omitempty"`
	// SlidingWindow is Mistral's attention window; 0: none (full causal
	// attention, every LLaMA). This model always attends to the whole
	// prefix, so a window shorter than the sequence is refused
	// (CheckSeqLen).
	SlidingWindow int `json:"sliding_window,omitempty"`
	// QKVBias: the q, k and v projections have biases (none on o): Qwen2's
	// attention, exported as model_type qwen2. LlamaConfig's
	// attention_bias, which puts one on o too, is another architecture
	// (refused by ParseHFConfig), hence the name of its own.
	QKVBias bool `json:"qkv_bias,omitempty"`
	// SlidingLayers are the layers the sliding window applies to, sorted;
	// nil: all (Mistral's). Qwen2's config.json can put only some in it
	// (layer_types, max_window_layers); they are kept so that an export
	// writes the same architecture back.
	SlidingLayers []int `json:"sliding_layers,omitempty"`
}

// inWindow reports whether the sliding window applies to layer l.
func (c Config) inWindow(l int) bool {
	return c.SlidingWindow > 0 && (c.SlidingLayers == nil || slices.Contains(c.SlidingLayers, l))
}

// RopeScaling is the rotary embeddings' frequency scaling, of one of the
// types transformers' LLaMA takes that this package implements.
type RopeScaling struct {
	// Type is "linear" (every frequency divided by Factor) or "llama3"
	// (Llama 3.1's banded scaling).
	Type   string  `json:"rope_type"`
	Factor float64 `json:"factor"`
	// llama3 only.
	LowFreqFactor  float64 `json:"low_freq_factor,omitempty"`
	HighFreqFactor float64 `json:"high_freq_factor,omitempty"`
	OriginalMaxPos int     `json:"original_max_position_embeddings,omitempty"`
}

// TokenIDs is a special token id field of config.json: absent or null
// (none), one id, or a list of ids (Llama 3.1's eos_token_id). It encodes
// back the same way: null, a number, or a list.
type TokenIDs []int

// MarshalJSON writes null, a number or a list.
func (t TokenIDs) MarshalJSON() ([]byte, error) {
	switch len(t) {
	case 0:
		return []byte("null"), nil
	case 1:
		return strconv.AppendInt(nil, int64(t[0]), 10), nil
	}
	return json.Marshal([]int(t))
}

// UnmarshalJSON reads null, a number or a list of numbers.
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*t = nil
		return nil
	case len(b) > 0 && b[0] == '[':
		var ids []int
		if err := json.Unmarshal(b, &ids); err != nil {
			return err
		}
		*t = ids
		return nil
	}
	var id int
	if err := json.Unmarshal(b, &id); err != nil {
		return err
	}
	*t = TokenIDs{id}
	return nil
}

func ids(v ...int) TokenIDs { return TokenIDs(v) }

// presets are the named architectures, with the shapes of the real models
// (their weights are random: for planning, benchmarks and tests).
// llama-tiny is the demo and test size: its 257-token vocabulary is the
// byte tokenizer's.
var presets = map[string]Config{
	"llama-tiny": {Vocab: 257, Hidden: 128, Intermediate: 344, NumLayers: 4, Heads: 4, KVHeads: 2,
		Eps: 1e-5, RopeTheta: 10000, MaxPos: 64, BOS: ids(256), EOS: ids(256)},
	// HuggingFaceTB/SmolLM2-135M.
	"smollm2-135m": {Vocab: 49152, Hidden: 576, Intermediate: 1536, NumLayers: 30, Heads: 9, KVHeads: 3,
		Eps: 1e-5, RopeTheta: 100000, MaxPos: 8192, Tied: true, BOS: ids(0), EOS: ids(0)},
	// TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T.
	"tinyllama-1.1b": {Vocab: 32000, Hidden: 2048, Intermediate: 5632, NumLayers: 22, Heads: 32, KVHeads: 4,
		Eps: 1e-5, RopeTheta: 10000, MaxPos: 2048, BOS: ids(1), EOS: ids(2)},
	// Qwen/Qwen2.5-0.5B, -1.5B and -7B (base models): q, k and v biases,
	// rope_theta 1e6; their sliding window is off (use_sliding_window
	// false), so none is set here.
	"qwen2.5-0.5b": {Vocab: 151936, Hidden: 896, Intermediate: 4864, NumLayers: 24, Heads: 14, KVHeads: 2,
		Eps: 1e-6, RopeTheta: 1000000, MaxPos: 32768, Tied: true, BOS: ids(151643), EOS: ids(151643), QKVBias: true},
	"qwen2.5-1.5b": {Vocab: 151936, Hidden: 1536, Intermediate: 8960, NumLayers: 28, Heads: 12, KVHeads: 2,
		Eps: 1e-6, RopeTheta: 1000000, MaxPos: 131072, Tied: true, BOS: ids(151643), EOS: ids(151643), QKVBias: true},
	"qwen2.5-7b": {Vocab: 152064, Hidden: 3584, Intermediate: 18944, NumLayers: 28, Heads: 28, KVHeads: 4,
		Eps: 1e-6, RopeTheta: 1000000, MaxPos: 131072, BOS: ids(151643), EOS: ids(151643), QKVBias: true},
	// meta-llama/Llama-2-7b-hf.
	"llama-7b": {Vocab: 32000, Hidden: 4096, Intermediate: 11008, NumLayers: 32, Heads: 32, KVHeads: 32,
		Eps: 1e-5, RopeTheta: 10000, MaxPos: 4096, BOS: ids(1), EOS: ids(2)},
	// meta-llama/Meta-Llama-3-8B.
	"llama3-8b": {Vocab: 128256, Hidden: 4096, Intermediate: 14336, NumLayers: 32, Heads: 32, KVHeads: 8,
		Eps: 1e-5, RopeTheta: 500000, MaxPos: 8192, BOS: ids(128000), EOS: ids(128001)},
	// deepseek-ai/deepseek-coder-1.3b-base and -6.7b-base, the LSP-Offload
	// paper's two model sizes: LLaMA architecture, 16K context by linear
	// RoPE scaling of factor 4.
	"deepseek-coder-1.3b": {Vocab: 32256, Hidden: 2048, Intermediate: 5504, NumLayers: 24, Heads: 16, KVHeads: 16,
		Eps: 1e-6, RopeTheta: 100000, RopeScaling: &RopeScaling{Type: "linear", Factor: 4}, MaxPos: 16384,
		BOS: ids(32013), EOS: ids(32014)},
	"deepseek-coder-6.7b": {Vocab: 32256, Hidden: 4096, Intermediate: 11008, NumLayers: 32, Heads: 32, KVHeads: 32,
		Eps: 1e-6, RopeTheta: 100000, RopeScaling: &RopeScaling{Type: "linear", Factor: 4}, MaxPos: 16384,
		BOS: ids(32013), EOS: ids(32014)},
}

// Presets lists the preset names, sorted.
func Presets() []string { return model.PresetNames(presets) }

// Preset returns a named architecture (a copy: its pointers and slices are
// its own).
func Preset(name string) (Config, error) {
	c, err := model.Preset(presets, "llama preset", name)
	return c.clone(), err
}

func (c Config) clone() Config {
	if c.RopeScaling != nil {
		r := *c.RopeScaling
		c.RopeScaling = &r
	}
	c.BOS, c.EOS = slices.Clone(c.BOS), slices.Clone(c.EOS)
	c.SlidingLayers = slices.Clone(c.SlidingLayers)
	return c
}

// Equal reports whether c and o are the same architecture: every field
// equal, the rope scaling and token ids compared by value. It compares
// the JSON encodings, which hold every field, so a new field cannot be
// forgotten here.
func (c Config) Equal(o Config) bool {
	a, errA := json.Marshal(c)
	b, errB := json.Marshal(o)
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// HS is the head size: head_dim, or hidden_size / num_attention_heads.
func (c Config) HS() int {
	if c.HeadDim > 0 {
		return c.HeadDim
	}
	if c.Heads <= 0 {
		return 0
	}
	return c.Hidden / c.Heads
}

// initRange is Init's standard deviation.
func (c Config) initRange() float64 {
	if c.InitRange > 0 {
		return c.InitRange
	}
	return 0.02
}

// Validate reports an inconsistent architecture, naming the field.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab_size", c.Vocab}, {"hidden_size", c.Hidden}, {"intermediate_size", c.Intermediate},
		{"num_hidden_layers", c.NumLayers}, {"num_attention_heads", c.Heads}, {"num_key_value_heads", c.KVHeads},
		{"max_position_embeddings", c.MaxPos}} {
		if f.v <= 0 {
			return fmt.Errorf("llama config: %s=%d must be positive", f.name, f.v)
		}
	}
	switch {
	case c.HeadDim < 0:
		return fmt.Errorf("llama config: head_dim=%d must be positive", c.HeadDim)
	case c.HeadDim == 0 && c.Hidden%c.Heads != 0:
		return fmt.Errorf("llama config: hidden_size=%d is not divisible by num_attention_heads=%d (and no head_dim is given)", c.Hidden, c.Heads)
	case c.HS()%2 != 0:
		return fmt.Errorf("llama config: head_dim=%d must be even (rotary embeddings rotate pairs)", c.HS())
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("llama config: num_attention_heads=%d is not a multiple of num_key_value_heads=%d", c.Heads, c.KVHeads)
	case !(c.Eps > 0) || math.IsInf(float64(c.Eps), 0):
		return fmt.Errorf("llama config: rms_norm_eps=%g must be positive and finite", c.Eps)
	case !f32Positive(c.RopeTheta):
		return fmt.Errorf("llama config: rope_theta=%g must be positive and within float32's range (the frequencies are float32, as in transformers)", c.RopeTheta)
	case c.SlidingWindow < 0:
		return fmt.Errorf("llama config: sliding_window=%d must not be negative", c.SlidingWindow)
	case !c.slidingLayersValid():
		return fmt.Errorf("llama config: sliding_layers %v must be sorted distinct layers below num_hidden_layers=%d, of a qwen2 model with a sliding_window", c.SlidingLayers, c.NumLayers)
	case c.InitRange < 0 || math.IsNaN(c.InitRange) || math.IsInf(c.InitRange, 0):
		return fmt.Errorf("llama config: initializer_range=%g must be positive", c.InitRange)
	}
	if r := c.RopeScaling; r != nil {
		if err := r.validate(); err != nil {
			return fmt.Errorf("llama config: %w", err)
		}
	}
	if _, ok := c.paramCount(); !ok {
		return fmt.Errorf("llama config: the parameter count of hidden_size=%d intermediate_size=%d num_hidden_layers=%d vocab_size=%d heads %d/%d of %d overflows",
			c.Hidden, c.Intermediate, c.NumLayers, c.Vocab, c.Heads, c.KVHeads, c.HS())
	}
	return nil
}

// slidingLayersValid reports whether SlidingLayers is nil, or sorted
// distinct layers of a Qwen2 (only its config.json can say which layers;
// a Mistral export would window them all) with a window to apply.
func (c Config) slidingLayersValid() bool {
	if c.SlidingLayers == nil {
		return true
	}
	if !c.QKVBias || c.SlidingWindow <= 0 || len(c.SlidingLayers) == 0 {
		return false
	}
	for i, l := range c.SlidingLayers {
		if l < 0 || l >= c.NumLayers || (i > 0 && l <= c.SlidingLayers[i-1]) {
			return false
		}
	}
	return true
}

// f32Positive reports whether v is positive and a positive float32 (the
// rotary frequencies are computed in float32).
func f32Positive(v float64) bool {
	return v > 0 && v <= math.MaxFloat32 && float32(v) > 0
}

// paramCount is NumParams computed in int64 with overflow checks (on
// sizes already known to be positive); ok is false when it overflows an
// int, so that an absurd config.json is refused before anything is sized
// from it.
func (c Config) paramCount() (n int, ok bool) {
	var k model.Checked
	mul, add := k.Mul, k.Add
	C, I, V, L := int64(c.Hidden), int64(c.Intermediate), int64(c.Vocab), int64(c.NumLayers)
	qw, kw := mul(int64(c.Heads), int64(c.HS())), mul(int64(c.KVHeads), int64(c.HS()))
	block := add(add(mul(2, C), mul(C, add(mul(2, qw), mul(2, kw)))), mul(mul(3, C), I))
	if c.QKVBias {
		block = add(block, add(qw, mul(2, kw)))
	}
	heads := int64(2)
	if c.Tied {
		heads = 1
	}
	return k.Int(add(add(mul(heads, mul(V, C)), mul(L, block)), C))
}

func (r RopeScaling) validate() error {
	pos := func(name string, v float64) error {
		if !f32Positive(v) {
			return fmt.Errorf("rope_scaling.%s=%g must be positive and within float32's range", name, v)
		}
		return nil
	}
	switch r.Type {
	case "linear":
		return pos("factor", r.Factor)
	case "llama3":
		for _, f := range []struct {
			name string
			v    float64
		}{{"factor", r.Factor}, {"low_freq_factor", r.LowFreqFactor}, {"high_freq_factor", r.HighFreqFactor},
			{"original_max_position_embeddings", float64(r.OriginalMaxPos)}} {
			if err := pos(f.name, f.v); err != nil {
				return err
			}
		}
		if !(r.HighFreqFactor > r.LowFreqFactor) {
			return fmt.Errorf("rope_scaling.high_freq_factor=%g must exceed low_freq_factor=%g", r.HighFreqFactor, r.LowFreqFactor)
		}
		return nil
	}
	return fmt.Errorf("rope_scaling.rope_type %q is not supported (want linear or llama3)", r.Type)
}

// CheckSeqLen refuses a run of sequences of T tokens that this model would
// not compute as the checkpoint's own code does: longer than the context
// (max_position_embeddings), or than Mistral's or Qwen2's sliding window
// (this model attends to the whole prefix).
func (c Config) CheckSeqLen(T int) error {
	switch {
	case T <= 0:
		return fmt.Errorf("llama: sequence length %d must be positive", T)
	case T > c.MaxPos:
		return fmt.Errorf("llama: sequence length %d exceeds the model context max_position_embeddings=%d", T, c.MaxPos)
	case c.SlidingWindow > 0 && c.SlidingWindow < T:
		return fmt.Errorf("llama: sequence length %d exceeds sliding_window=%d; attention within a sliding window is not supported", T, c.SlidingWindow)
	}
	return nil
}

// InvFreq returns the rotary embeddings' inverse frequencies (HS/2 of
// them), computed in float32 step by step as transformers' LLaMA does
// (rope_init_fn of the default, linear and llama3 types): inv_freq[i] =
// 1 / theta^(float32(2i)/HS), then scaled.
func (c Config) InvFreq() []float32 {
	hs := c.HS()
	inv := make([]float32, hs/2)
	base := float32(c.RopeTheta)
	for i := range inv {
		e := float32(2*i) / float32(hs)
		inv[i] = 1 / float32(math.Pow(float64(base), float64(e)))
	}
	r := c.RopeScaling
	if r == nil {
		return inv
	}
	factor := float32(r.Factor)
	switch r.Type {
	case "linear":
		for i := range inv {
			inv[i] /= factor
		}
	case "llama3":
		// Wavelengths above the low-frequency bound are divided by the
		// factor, those below the high-frequency bound kept, and those in
		// between interpolated (transformers' _compute_llama3_parameters,
		// every tensor op in float32).
		old := float32(r.OriginalMaxPos)
		lowF, highF := float32(r.LowFreqFactor), float32(r.HighFreqFactor)
		lowWave, highWave := float32(float64(r.OriginalMaxPos)/r.LowFreqFactor), float32(float64(r.OriginalMaxPos)/r.HighFreqFactor)
		for i, f := range inv {
			wave := float32(2*math.Pi) / f
			switch {
			case wave > lowWave:
				inv[i] = f / factor
			case wave < highWave:
			default:
				smooth := (old/wave - lowF) / (highF - lowF)
				// The explicit conversions keep Go from fusing a
				// multiply-add that torch rounds twice.
				inv[i] = float32((1-smooth)*f/factor) + float32(smooth*f)
			}
		}
	}
	return inv
}
