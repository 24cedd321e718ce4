package llama

import (
	"encoding/json"
	"strings"
	"testing"
)

// qwen2JSON is a small qwen2 config.json as transformers 5 writes it, with
// edit applied.
func qwen2JSON(t *testing.T, edit func(m map[string]any)) []byte {
	t.Helper()
	m := map[string]any{
		"architectures": []string{"Qwen2ForCausalLM"}, "model_type": "qwen2", "vocab_size": 320, "hidden_size": 64,
		"intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": false,
		"rope_parameters":    map[string]any{"rope_type": "default", "rope_theta": 1e6},
		"use_sliding_window": false, "sliding_window": nil, "max_window_layers": 2,
		"layer_types": []string{"full_attention", "full_attention"},
	}
	if edit != nil {
		edit(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestQwen2Config: model_type qwen2 is the LLaMA block with q, k and v
// biases; its sliding window is kept only where transformers would use it
// (use_sliding_window, and a layer that layer_types or max_window_layers
// puts in the window), so CheckSeqLen refuses only the runs it changes.
func TestQwen2Config(t *testing.T) {
	c, err := ParseHFConfig(qwen2JSON(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !c.QKVBias || c.SlidingWindow != 0 || c.RopeTheta != 1e6 || c.KVHeads != 2 {
		t.Errorf("qwen2 config read as %+v", c)
	}
	if got, want := c.NumParams(), 320*64*2+64+2*(2*64+64*64+2*64*32+64*64+3*64*176+64+2*32); got != want {
		t.Errorf("NumParams %d, want %d (with the q, k and v biases)", got, want)
	}
	for _, tc := range []struct {
		name   string
		edit   func(m map[string]any)
		window int
	}{
		{"window off", func(m map[string]any) { m["sliding_window"] = 16 }, 0},
		{"window on, no layer in it", func(m map[string]any) {
			m["use_sliding_window"], m["sliding_window"] = true, 16
		}, 0},
		{"window on, layer_types", func(m map[string]any) {
			m["use_sliding_window"], m["sliding_window"] = true, 16
			m["layer_types"] = []string{"full_attention", "sliding_attention"}
		}, 16},
		{"window on, max_window_layers", func(m map[string]any) {
			m["use_sliding_window"], m["sliding_window"], m["max_window_layers"] = true, 16, 1
			delete(m, "layer_types")
		}, 16},
		{"window on, null", func(m map[string]any) {
			m["use_sliding_window"] = true
			m["layer_types"] = []string{"sliding_attention", "sliding_attention"}
		}, 0},
	} {
		c, err := ParseHFConfig(qwen2JSON(t, tc.edit))
		if err != nil || c.SlidingWindow != tc.window {
			t.Errorf("%s: window %d, %v; want %d", tc.name, c.SlidingWindow, err, tc.window)
		}
		if tc.window > 0 && (c.inWindow(0) || !c.inWindow(1)) {
			t.Errorf("%s: layers in the window %v, want [1]", tc.name, c.SlidingLayers)
		}
	}
	c, _ = ParseHFConfig(qwen2JSON(t, func(m map[string]any) {
		m["use_sliding_window"], m["sliding_window"] = true, 16
		m["layer_types"] = []string{"sliding_attention", "full_attention"}
	}))
	if err := c.CheckSeqLen(16); err != nil {
		t.Errorf("T=16 within the window: %v", err)
	}
	if err := c.CheckSeqLen(17); err == nil || !strings.Contains(err.Error(), "sliding_window=16") {
		t.Errorf("T=17 beyond the window: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"layer_types length", func(m map[string]any) {
			m["use_sliding_window"], m["sliding_window"] = true, 16
			m["layer_types"] = []string{"full_attention"}
		}, "layer_types has 1 entries"},
		{"layer_types unknown", func(m map[string]any) {
			m["use_sliding_window"], m["sliding_window"] = true, 16
			m["layer_types"] = []string{"full_attention", "chunked_attention"}
		}, `layer_types[1] "chunked_attention"`},
		{"mlp_bias", func(m map[string]any) { m["mlp_bias"] = true }, "mlp_bias=true"},
	} {
		if _, err := ParseHFConfig(qwen2JSON(t, tc.edit)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestQwen2ConfigRoundTrip: HFConfig writes a QKVBias model as Qwen2 (no
// attention_bias, which LlamaConfig would read as a bias on o too), and
// reading it back gives the same architecture, with and without a window.
func TestQwen2ConfigRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		window int
		layers []int
	}{{0, nil}, {16, nil}, {16, []int{20, 21, 22, 23}}, {16, []int{1, 5}}} {
		c, err := Preset("qwen2.5-0.5b")
		if err != nil {
			t.Fatal(err)
		}
		window := tc.window
		c.SlidingWindow, c.SlidingLayers = window, tc.layers
		raw, err := c.HFConfigDType("bfloat16")
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		if m["model_type"] != "qwen2" || m["architectures"].([]any)[0] != "Qwen2ForCausalLM" || m["attention_bias"] != nil {
			t.Errorf("window %d: config.json %s", window, raw)
		}
		back, err := ParseHFConfig(raw)
		if err != nil || !back.Equal(c) {
			t.Errorf("window %d layers %v: read back %+v, %v; want %+v", window, tc.layers, back, err, c)
		}
		types := m["layer_types"].([]any)
		for l := range c.NumLayers {
			if want := map[bool]string{true: "sliding_attention", false: "full_attention"}[c.inWindow(l)]; types[l] != want {
				t.Errorf("window %d layers %v: layer_types[%d] %v, want %s", window, tc.layers, l, types[l], want)
			}
		}
	}
}

// TestPyFloat: floats are written as Python's repr writes them, which is
// how save_pretrained writes config.json (rope_theta 1e6 as 1000000.0).
func TestPyFloat(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		bits int
		want string
	}{{1e-5, 32, "1e-05"}, {1e-6, 32, "1e-06"}, {0.02, 64, "0.02"}, {1e6, 64, "1000000.0"}, {1e16, 64, "1e+16"},
		{123456789012345, 64, "123456789012345.0"}, {1e-4, 64, "0.0001"}, {2.5e-7, 64, "2.5e-07"}, {0, 64, "0.0"}} {
		got, err := pyFloat{tc.v, tc.bits}.MarshalJSON()
		if err != nil || string(got) != tc.want {
			t.Errorf("pyFloat(%g) = %s, %v; want %s", tc.v, got, err, tc.want)
		}
	}
}

// TestSlidingLayersValidate: the layers in the window are sorted distinct
// layers of the model, and only with a window, of a Qwen2.
func TestSlidingLayersValidate(t *testing.T) {
	for _, tc := range []struct {
		window int
		layers []int
		ok     bool
	}{{16, []int{0, 1}, true}, {16, nil, true}, {0, []int{1}, false}, {16, []int{}, false},
		{16, []int{1, 0}, false}, {16, []int{1, 1}, false}, {16, []int{2}, false}, {16, []int{-1}, false}} {
		c := hookCfg.clone()
		c.QKVBias, c.SlidingWindow, c.SlidingLayers = true, tc.window, tc.layers
		if err := c.Validate(); (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "sliding_layers")) {
			t.Errorf("window %d layers %v: %v, want ok=%v", tc.window, tc.layers, err, tc.ok)
		}
	}
	mistral := hookCfg.clone()
	mistral.SlidingWindow, mistral.SlidingLayers = 16, []int{1}
	if err := mistral.Validate(); err == nil {
		t.Error("a LLaMA/Mistral config with sliding_layers validated")
	}
}
