// Hugging Face config.json in and out. transformers 4 writes the rotary
// settings at the top level (rope_theta, and rope_scaling with a "type" or
// "rope_type"); transformers 5 nests them in rope_parameters (rope_theta,
// rope_type and the type's own fields). Both are read; HFConfig writes the
// transformers 5 layout, which transformers 5.23 loads as
// LlamaForCausalLM. Whatever this model would not compute as transformers
// does is refused, naming the file, the field and what was found.

package llama

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// hfConfig is the part of transformers' LlamaConfig (and MistralConfig)
// this package reads; pointers tell absent fields from zero ones.
type hfConfig struct {
	ModelType           string          `json:"model_type"`
	VocabSize           int             `json:"vocab_size"`
	HiddenSize          int             `json:"hidden_size"`
	IntermediateSize    int             `json:"intermediate_size"`
	NumHiddenLayers     int             `json:"num_hidden_layers"`
	NumAttentionHeads   int             `json:"num_attention_heads"`
	NumKeyValueHeads    *int            `json:"num_key_value_heads"`
	HeadDim             *int            `json:"head_dim"`
	HiddenAct           *string         `json:"hidden_act"`
	RMSNormEps          *float64        `json:"rms_norm_eps"`
	RopeTheta           *float64        `json:"rope_theta"`
	RopeScaling         json.RawMessage `json:"rope_scaling"`
	RopeParameters      json.RawMessage `json:"rope_parameters"`
	MaxPos              *int            `json:"max_position_embeddings"`
	TieWordEmbeddings   *bool           `json:"tie_word_embeddings"`
	BOS                 TokenIDs        `json:"bos_token_id"`
	EOS                 TokenIDs        `json:"eos_token_id"`
	InitializerRange    *float64        `json:"initializer_range"`
	SlidingWindow       json.RawMessage `json:"sliding_window"` // absent, null or a number
	AttentionBias       *bool           `json:"attention_bias"`
	MLPBias             *bool           `json:"mlp_bias"`
	PartialRotaryFactor *float64        `json:"partial_rotary_factor"`
	// Qwen2's: the window applies only with use_sliding_window, and then
	// only to the layers from max_window_layers on.
	// layer_types, when given, says which layers use it instead.
	UseSlidingWindow *bool    `json:"use_sliding_window"`
	MaxWindowLayers  *int     `json:"max_window_layers"`
	LayerTypes       []string `json:"layer_types"`
}

// ReadHFConfig reads dir/config.json and checks that this model computes
// what transformers computes for it.
func ReadHFConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("checkpoint: %w", err)
	}
	c, err := ParseHFConfig(raw)
	if err != nil {
		return Config{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return c, nil
}

// ParseHFConfig is ReadHFConfig of the bytes of a config.json.
func ParseHFConfig(raw []byte) (Config, error) {
	var h hfConfig
	if err := json.Unmarshal(raw, &h); err != nil {
		return Config{}, err
	}
	switch h.ModelType {
	case "llama", "mistral", "qwen2":
	case "":
		return Config{}, fmt.Errorf("model_type is missing (want llama, mistral or qwen2)")
	default:
		return Config{}, fmt.Errorf("model_type %q is not supported (want llama, mistral or qwen2)", h.ModelType)
	}
	if h.HiddenAct != nil && *h.HiddenAct != "silu" {
		return Config{}, fmt.Errorf("hidden_act %q is not supported (want silu)", *h.HiddenAct)
	}
	if h.AttentionBias != nil && *h.AttentionBias && h.ModelType != "qwen2" {
		return Config{}, fmt.Errorf("attention_bias=true is not supported (the projections have no biases here)")
	}
	if h.MLPBias != nil && *h.MLPBias {
		return Config{}, fmt.Errorf("mlp_bias=true is not supported (the MLP has no biases here)")
	}
	if f := h.PartialRotaryFactor; f != nil && *f != 1 {
		return Config{}, fmt.Errorf("partial_rotary_factor=%g is not supported (want 1)", *f)
	}
	c := Config{
		Vocab: h.VocabSize, Hidden: h.HiddenSize, Intermediate: h.IntermediateSize,
		NumLayers: h.NumHiddenLayers, Heads: h.NumAttentionHeads, KVHeads: h.NumAttentionHeads,
		Eps: 1e-6, RopeTheta: 10000, MaxPos: 2048, BOS: h.BOS, EOS: h.EOS,
	}
	if h.NumKeyValueHeads != nil {
		c.KVHeads = *h.NumKeyValueHeads
	}
	if h.HeadDim != nil && *h.HeadDim != 0 {
		c.HeadDim = *h.HeadDim
		if c.Heads > 0 && c.HeadDim == c.Hidden/c.Heads && c.Hidden%c.Heads == 0 {
			c.HeadDim = 0 // the default: keep one spelling per architecture
		}
	}
	if h.MaxPos != nil {
		c.MaxPos = *h.MaxPos
	}
	if h.TieWordEmbeddings != nil {
		c.Tied = *h.TieWordEmbeddings
	}
	if h.InitializerRange != nil {
		c.InitRange = *h.InitializerRange
		if c.InitRange == 0.02 {
			c.InitRange = 0
		}
	}
	if h.ModelType == "qwen2" {
		// Qwen2's attention: biases on q, k and v, always (Qwen2Config
		// has no switch for them).
		c.QKVBias = true
		if h.MaxPos == nil {
			c.MaxPos = 32768 // Qwen2Config's default
		}
		w, layers, err := qwen2Window(h)
		if err != nil {
			return Config{}, err
		}
		h.SlidingWindow = w
		if len(layers) < h.NumHiddenLayers {
			c.SlidingLayers = layers // nil: every layer, as Mistral's
		}
	}
	if h.ModelType == "mistral" {
		// MistralConfig's defaults where save_pretrained's output would
		// have the key: a 4096-token window, a 131072-token context.
		if h.MaxPos == nil {
			c.MaxPos = 4096 * 32
		}
		if h.SlidingWindow == nil {
			h.SlidingWindow = json.RawMessage("4096")
		}
	}
	if len(h.SlidingWindow) > 0 && !isNull(h.SlidingWindow) {
		var w int
		if err := json.Unmarshal(h.SlidingWindow, &w); err != nil {
			return Config{}, fmt.Errorf("sliding_window: %s is not an integer", h.SlidingWindow)
		}
		if h.ModelType != "mistral" && h.ModelType != "qwen2" {
			return Config{}, fmt.Errorf("sliding_window=%d in a model_type %q config (only mistral and qwen2 have one)", w, h.ModelType)
		}
		if w <= 0 {
			return Config{}, fmt.Errorf("sliding_window=%d must be positive or null", w)
		}
		c.SlidingWindow = w
	}
	if e := h.RMSNormEps; e != nil {
		// The model computes in float32: an epsilon float32 cannot hold is
		// refused, not changed.
		c.Eps = float32(*e)
		if *e > 0 && (c.Eps == 0 || math.IsInf(float64(c.Eps), 0)) {
			return Config{}, fmt.Errorf("rms_norm_eps=%g is outside float32's range", *e)
		}
	}
	if h.RopeTheta != nil {
		c.RopeTheta = *h.RopeTheta
	}
	var err error
	switch {
	case len(h.RopeParameters) > 0 && !isNull(h.RopeParameters):
		c.RopeScaling, err = parseRope("rope_parameters", h.RopeParameters, &c.RopeTheta)
	case len(h.RopeScaling) > 0 && !isNull(h.RopeScaling):
		c.RopeScaling, err = parseRope("rope_scaling", h.RopeScaling, nil)
	}
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// qwen2Window is the sliding_window of a qwen2 config.json that changes
// what the model computes, or nil, and the layers it applies to:
// transformers' Qwen2 attends within the window only with
// use_sliding_window true (default false), and then only in the layers
// layer_types calls "sliding_attention" (without layer_types: those from
// max_window_layers, default 28, on). A window that applies is kept, so
// CheckSeqLen refuses the runs whose sequences it would cut (the model
// here always attends to the whole prefix) and accepts the rest; its
// layers are kept for the export to write them back.
func qwen2Window(h hfConfig) (json.RawMessage, []int, error) {
	if h.UseSlidingWindow == nil || !*h.UseSlidingWindow {
		return nil, nil, nil
	}
	layers, err := qwen2SlidingLayers(h)
	if err != nil || len(layers) == 0 {
		return nil, nil, err
	}
	if len(h.SlidingWindow) == 0 {
		return json.RawMessage("4096"), layers, nil // Qwen2Config's default
	}
	if isNull(h.SlidingWindow) {
		return nil, nil, nil // no window after all
	}
	return h.SlidingWindow, layers, nil
}

// qwen2SlidingLayers lists the layers of a qwen2 config.json with
// use_sliding_window that attend within the window.
func qwen2SlidingLayers(h hfConfig) ([]int, error) {
	var layers []int
	if h.LayerTypes == nil {
		from := 28
		if h.MaxWindowLayers != nil {
			from = *h.MaxWindowLayers
		}
		for l := max(from, 0); l < h.NumHiddenLayers; l++ {
			layers = append(layers, l)
		}
		return layers, nil
	}
	if len(h.LayerTypes) != h.NumHiddenLayers {
		return nil, fmt.Errorf("layer_types has %d entries for num_hidden_layers=%d", len(h.LayerTypes), h.NumHiddenLayers)
	}
	for i, t := range h.LayerTypes {
		switch t {
		case "full_attention":
		case "sliding_attention":
			layers = append(layers, i)
		default:
			return nil, fmt.Errorf("layer_types[%d] %q is not supported (want full_attention or sliding_attention)", i, t)
		}
	}
	return layers, nil
}

func isNull(b json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(b), []byte("null")) }

// parseRope reads a rope_scaling (transformers 4) or rope_parameters
// (transformers 5) object; theta, when set, receives the latter's
// rope_theta. A nil result is the default (unscaled) RoPE.
func parseRope(field string, raw json.RawMessage, theta *float64) (*RopeScaling, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	num := func(key string) (float64, bool, error) {
		v, ok := m[key]
		if !ok || isNull(v) {
			return 0, false, nil
		}
		var f float64
		if err := json.Unmarshal(v, &f); err != nil {
			return 0, false, fmt.Errorf("%s.%s: %s is not a number", field, key, v)
		}
		return f, true, nil
	}
	str := func(key string) (string, error) {
		v, ok := m[key]
		if !ok || isNull(v) {
			return "", nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", fmt.Errorf("%s.%s: %s is not a string", field, key, v)
		}
		return s, nil
	}
	typ, err := str("rope_type")
	if err != nil {
		return nil, err
	}
	typeKey := "rope_type"
	if typ == "" {
		if typ, err = str("type"); err != nil {
			return nil, err
		}
		typeKey = "type"
	}
	if typ == "" {
		typ = "default"
	}
	if t, ok, err := num("rope_theta"); err != nil {
		return nil, err
	} else if ok {
		if theta == nil {
			return nil, fmt.Errorf("%s.rope_theta: set rope_theta at the top level with rope_scaling", field)
		}
		*theta = t
	}
	if f, ok, err := num("attention_factor"); err != nil {
		return nil, err
	} else if ok && f != 1 {
		return nil, fmt.Errorf("%s.attention_factor=%g is not supported (want 1)", field, f)
	}
	if f, ok, err := num("partial_rotary_factor"); err != nil {
		return nil, err
	} else if ok && f != 1 {
		return nil, fmt.Errorf("%s.partial_rotary_factor=%g is not supported (want 1)", field, f)
	}
	known := map[string]bool{"rope_type": true, "type": true, "rope_theta": true, "attention_factor": true, "partial_rotary_factor": true}
	var r *RopeScaling
	switch typ {
	case "default":
	case "linear":
		r = &RopeScaling{Type: typ}
		known["factor"] = true
	case "llama3":
		r = &RopeScaling{Type: typ}
		for _, k := range []string{"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} {
			known[k] = true
		}
	default:
		return nil, fmt.Errorf("%s.%s %q is not supported (want default, linear or llama3)", field, typeKey, typ)
	}
	var unknown []string
	for k := range m {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%s has fields %v that rope_type %q does not take here", field, unknown, typ)
	}
	if r == nil {
		return nil, nil
	}
	for _, f := range []struct {
		key string
		dst *float64
	}{{"factor", &r.Factor}, {"low_freq_factor", &r.LowFreqFactor}, {"high_freq_factor", &r.HighFreqFactor}} {
		if !known[f.key] {
			continue
		}
		v, ok, err := num(f.key)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%s.%s is missing (rope_type %q needs it)", field, f.key, typ)
		}
		*f.dst = v
	}
	if typ == "llama3" {
		v, ok, err := num("original_max_position_embeddings")
		if err != nil {
			return nil, err
		}
		if !ok || v != math.Trunc(v) || v <= 0 || v > math.MaxInt32 {
			return nil, fmt.Errorf("%s.original_max_position_embeddings must be a positive integer (rope_type llama3), got %s", field, m["original_max_position_embeddings"])
		}
		r.OriginalMaxPos = int(v)
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return r, nil
}

// pyFloat is a float written as Python's json writes one (its repr):
// always with a point or an exponent (10000.0, 1e-05, 1000000.0 where Go
// would write 1e+06), so that transformers reads a float. bits is 32 for a value the model holds as a float32 (the
// shortest decimal that reads back as it, not its binary expansion).
type pyFloat struct {
	v    float64
	bits int
}

func (f pyFloat) MarshalJSON() ([]byte, error) {
	if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
		return nil, fmt.Errorf("%v is not a JSON number", f.v)
	}
	// repr writes decimal exponents -4 to 15 positionally, the rest in
	// exponent form with at least two digits (as Go's 'e' does).
	s := strconv.FormatFloat(f.v, 'e', -1, f.bits)
	exp, err := strconv.Atoi(s[strings.IndexByte(s, 'e')+1:])
	if err != nil {
		return nil, fmt.Errorf("%v: exponent of %q: %w", f.v, s, err)
	}
	if exp >= -4 && exp < 16 {
		s = strconv.FormatFloat(f.v, 'f', -1, f.bits)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
	}
	return []byte(s), nil
}

// HFConfig is the config.json of an fp32 export (model.Spec).
func (c Config) HFConfig() ([]byte, error) { return c.HFConfigDType("float32") }

// HFConfigDType is the config.json that transformers' save_pretrained
// writes for this architecture (transformers 5 layout) with weights
// stored in dtype: "float32", "bfloat16" or "float16". A model with q, k
// and v biases is written as Qwen2, one with a sliding window as Mistral,
// the rest as LLaMA.
func (c Config) HFConfigDType(dtype string) ([]byte, error) {
	switch dtype {
	case "float32", "bfloat16", "float16":
	default:
		return nil, fmt.Errorf("llama config: export dtype %q (want float32, bfloat16 or float16)", dtype)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rope := map[string]any{"rope_theta": pyFloat{c.RopeTheta, 64}, "rope_type": "default"}
	if r := c.RopeScaling; r != nil {
		rope["rope_type"] = r.Type
		rope["factor"] = pyFloat{r.Factor, 64}
		if r.Type == "llama3" {
			rope["low_freq_factor"] = pyFloat{r.LowFreqFactor, 64}
			rope["high_freq_factor"] = pyFloat{r.HighFreqFactor, 64}
			rope["original_max_position_embeddings"] = r.OriginalMaxPos
		}
	}
	arch, typ := "LlamaForCausalLM", "llama"
	if c.SlidingWindow > 0 {
		arch, typ = "MistralForCausalLM", "mistral"
	}
	h := map[string]any{
		"architectures":           []string{arch},
		"model_type":              typ,
		"attention_bias":          false,
		"attention_dropout":       pyFloat{0, 64},
		"bos_token_id":            c.BOS,
		"eos_token_id":            c.EOS,
		"dtype":                   dtype,
		"head_dim":                c.HS(),
		"hidden_act":              "silu",
		"hidden_size":             c.Hidden,
		"initializer_range":       pyFloat{c.initRange(), 64},
		"intermediate_size":       c.Intermediate,
		"max_position_embeddings": c.MaxPos,
		"mlp_bias":                false,
		"num_attention_heads":     c.Heads,
		"num_hidden_layers":       c.NumLayers,
		"num_key_value_heads":     c.KVHeads,
		"pad_token_id":            nil,
		"pretraining_tp":          1,
		"rms_norm_eps":            pyFloat{float64(c.Eps), 32},
		"rope_parameters":         rope,
		"tie_word_embeddings":     c.Tied,
		"use_cache":               true,
		"vocab_size":              c.Vocab,
	}
	if c.SlidingWindow > 0 {
		h["sliding_window"] = c.SlidingWindow
		delete(h, "mlp_bias")
		delete(h, "pretraining_tp")
		delete(h, "attention_bias")
	}
	if c.QKVBias {
		qwen2Keys(c, h)
	}
	raw, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("llama config: %w", err)
	}
	return append(raw, '\n'), nil
}

// qwen2Keys turns h, a LlamaConfig's keys, into the Qwen2Config that
// save_pretrained writes: no attention_bias, mlp_bias or pretraining_tp
// (Qwen2's biases are not optional), and the sliding-window settings,
// with the layers the config.json read had in the window (all without a
// list) in layer_types, which transformers reads before max_window_layers.
func qwen2Keys(c Config, h map[string]any) {
	h["architectures"] = []string{"Qwen2ForCausalLM"}
	h["model_type"] = "qwen2"
	for _, k := range []string{"attention_bias", "mlp_bias", "pretraining_tp"} {
		delete(h, k)
	}
	if c.HeadDim == 0 {
		delete(h, "head_dim") // Qwen2Config has none; Qwen2 reads one if given
	}
	h["use_sliding_window"] = c.SlidingWindow > 0
	h["max_window_layers"] = c.NumLayers
	h["sliding_window"] = nil
	types := make([]string, c.NumLayers)
	for i := range types {
		types[i] = "full_attention"
	}
	if c.SlidingWindow > 0 {
		h["sliding_window"] = c.SlidingWindow
		h["max_window_layers"] = 0
		if len(c.SlidingLayers) > 0 {
			h["max_window_layers"] = c.SlidingLayers[0]
		}
		for i := range types {
			if c.inWindow(i) {
				types[i] = "sliding_attention"
			}
		}
	}
	h["layer_types"] = types
}
