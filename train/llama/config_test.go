package llama

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// TestReadHFConfigFixtures: the fixtures' config.json (transformers 5
// layout) and the same configs in the transformers 4 layout that
// reference.json records give one architecture each, the one the fixture
// script describes.
func TestReadHFConfigFixtures(t *testing.T) {
	want := map[string]Config{
		"llama-tiny-gqa": {Vocab: 320, Hidden: 64, Intermediate: 176, NumLayers: 2, Heads: 4, KVHeads: 2,
			Eps: 1e-5, RopeTheta: 10000, MaxPos: 64, BOS: ids(1), EOS: ids(2)},
		"llama-tiny-rope3": {Vocab: 320, Hidden: 64, Intermediate: 176, NumLayers: 2, Heads: 4, KVHeads: 1,
			Eps: 1e-5, RopeTheta: 500000, MaxPos: 64, BOS: ids(1), EOS: ids(2),
			RopeScaling: &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 48}},
		"llama-tiny-tied": {Vocab: 320, Hidden: 64, Intermediate: 176, NumLayers: 2, Heads: 4, KVHeads: 4,
			Eps: 1e-5, RopeTheta: 10000, MaxPos: 64, BOS: ids(1), EOS: ids(2), Tied: true,
			RopeScaling: &RopeScaling{Type: "linear", Factor: 2}},
		"qwen2-tiny-gqa": {Vocab: 320, Hidden: 64, Intermediate: 176, NumLayers: 2, Heads: 4, KVHeads: 2,
			Eps: 1e-6, RopeTheta: 1e6, MaxPos: 64, BOS: ids(318), EOS: ids(319), QKVBias: true},
		"qwen2-tiny-tied": {Vocab: 320, Hidden: 64, Intermediate: 176, NumLayers: 2, Heads: 4, KVHeads: 1,
			Eps: 1e-6, RopeTheta: 1e6, MaxPos: 64, BOS: ids(318), EOS: ids(319), Tied: true, QKVBias: true},
	}
	for _, name := range fixtureNames {
		dir := fixtureDir(name)
		c5, err := ReadHFConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !c5.Equal(want[name]) {
			t.Errorf("%s: config %+v, want %+v", name, c5, want[name])
		}
		raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
		if err != nil {
			t.Fatal(err)
		}
		var ref struct {
			V4 json.RawMessage `json:"config_transformers4_layout"`
		}
		if err := json.Unmarshal(raw, &ref); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(ref.V4), `"rope_theta"`) || strings.Contains(string(ref.V4), "rope_parameters") {
			t.Fatalf("%s: config_transformers4_layout is not the transformers 4 layout: %s", name, ref.V4)
		}
		c4, err := ParseHFConfig(ref.V4)
		if err != nil {
			t.Fatalf("%s, transformers 4 layout: %v", name, err)
		}
		if !c4.Equal(c5) {
			t.Errorf("%s: transformers 4 layout gives %+v, 5 gives %+v", name, c4, c5)
		}
	}
}

// TestHFConfigExport: the config.json written for a fixture's
// architecture holds what save_pretrained wrote for it (every field, same
// values; Python floats where transformers has floats), and every
// export reads back as the same architecture, with the dtype asked for.
func TestHFConfigExport(t *testing.T) {
	for _, name := range fixtureNames {
		dir := fixtureDir(name)
		cfg, err := ReadHFConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		out, err := cfg.HFConfig()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var got, want map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		delete(want, "transformers_version")
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: exported config\n%s\nsave_pretrained wrote\n%s", name, out, raw)
		}
		eps := `"rms_norm_eps": 1e-05`
		if cfg.QKVBias {
			eps = `"rms_norm_eps": 1e-06` // Qwen2's
		}
		for _, f := range []string{eps, `"initializer_range": 0.02`, `"attention_dropout": 0.0`} {
			if !strings.Contains(string(out), f) {
				t.Errorf("%s: exported config lacks %s:\n%s", name, f, out)
			}
		}
		if !strings.Contains(string(out), `"rope_theta": 10000.0`) && !strings.Contains(string(out), `"rope_theta": 500000.0`) &&
			!strings.Contains(string(out), `"rope_theta": 1000000.0`) {
			t.Errorf("%s: rope_theta not written as a float:\n%s", name, out)
		}
	}
	cfgs := []Config{hookCfg}
	for _, name := range Presets() {
		c, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, c)
	}
	mistral := hookCfg.clone()
	mistral.SlidingWindow = 4096
	mistral.EOS = ids(2, 7)
	cfgs = append(cfgs, mistral)
	for _, c := range cfgs {
		for _, dt := range []string{"float32", "bfloat16", "float16"} {
			out, err := c.HFConfigDType(dt)
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseHFConfig(out)
			if err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			if !back.Equal(c) {
				t.Errorf("exported %+v reads back as %+v", c, back)
			}
			var h struct {
				DType string `json:"dtype"`
				Type  string `json:"model_type"`
			}
			if err := json.Unmarshal(out, &h); err != nil || h.DType != dt || (h.Type == "mistral") != (c.SlidingWindow > 0) {
				t.Errorf("export dtype %q model_type %q (%v), want %s", h.DType, h.Type, err, dt)
			}
		}
	}
	if _, err := hookCfg.HFConfigDType("int8"); err == nil || !strings.Contains(err.Error(), "int8") {
		t.Errorf("export dtype int8: %v", err)
	}
}

// TestBadConfigsRefused: what this model would not compute as
// transformers does is refused, the error naming the field and what was
// found; ReadHFConfig names the file.
func TestBadConfigsRefused(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(fixtureDir("llama-tiny-gqa"), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	v4 := func(scaling any) func(map[string]any) {
		return func(m map[string]any) {
			delete(m, "rope_parameters")
			m["rope_theta"] = 10000.0
			m["rope_scaling"] = scaling
		}
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"qwen3", set("model_type", "qwen3"), `model_type "qwen3"`},
		{"gpt_neox", set("model_type", "gpt_neox"), `model_type "gpt_neox"`},
		{"no model_type", func(m map[string]any) { delete(m, "model_type") }, "model_type is missing"},
		{"sliding window in llama", set("sliding_window", 4096), `sliding_window=4096 in a model_type "llama"`},
		{"yarn", set("rope_parameters", map[string]any{"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), `rope_parameters.rope_type "yarn"`},
		{"dynamic v4", v4(map[string]any{"type": "dynamic", "factor": 2.0}), `rope_scaling.type "dynamic"`},
		{"longrope v4", v4(map[string]any{"rope_type": "longrope", "factor": 2.0}), `rope_scaling.rope_type "longrope"`},
		{"theta inside rope_scaling", v4(map[string]any{"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "rope_scaling.rope_theta"},
		{"llama3 without low_freq_factor", set("rope_parameters", map[string]any{"rope_type": "llama3", "rope_theta": 5e5,
			"factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), "rope_parameters.low_freq_factor is missing"},
		{"llama3 bands reversed", set("rope_parameters", map[string]any{"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
			"low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}), "high_freq_factor=1 must exceed low_freq_factor=4"},
		{"llama3 fractional context", set("rope_parameters", map[string]any{"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
			"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 81.5}), "original_max_position_embeddings must be a positive integer"},
		{"linear factor 0", set("rope_parameters", map[string]any{"rope_type": "linear", "rope_theta": 1e4, "factor": 0.0}), "rope_parameters: rope_scaling.factor=0"},
		{"unknown rope field", set("rope_parameters", map[string]any{"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "beta_fast": 32.0}), "beta_fast"},
		{"attention_factor", set("rope_parameters", map[string]any{"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "attention_factor": 1.5}), "attention_factor=1.5"},
		{"factor not a number", v4(map[string]any{"type": "linear", "factor": "4"}), "rope_scaling.factor"},
		{"attention_bias", set("attention_bias", true), "attention_bias=true"},
		{"mlp_bias", set("mlp_bias", true), "mlp_bias=true"},
		{"gelu", set("hidden_act", "gelu"), `hidden_act "gelu"`},
		{"partial rotary", set("partial_rotary_factor", 0.5), "partial_rotary_factor=0.5"},
		{"kv heads", set("num_key_value_heads", 3), "num_attention_heads=4 is not a multiple of num_key_value_heads=3"},
		{"no hidden size", func(m map[string]any) { delete(m, "hidden_size") }, "hidden_size=0"},
		{"zero layers", set("num_hidden_layers", 0), "num_hidden_layers=0"},
		{"zero vocab", set("vocab_size", 0), "vocab_size=0"},
		{"odd head_dim", set("head_dim", 15), "head_dim=15 must be even"},
		{"eps out of float32", set("rms_norm_eps", 1e-50), "rms_norm_eps=1e-50 is outside float32's range"},
		{"zero eps", set("rms_norm_eps", 0.0), "rms_norm_eps=0"},
		{"negative theta", set("rope_parameters", map[string]any{"rope_type": "default", "rope_theta": -1.0}), "rope_theta=-1"},
		{"mistral window 0", func(m map[string]any) { m["model_type"] = "mistral"; m["sliding_window"] = 0 }, "sliding_window=0"},
		{"mistral window not a number", func(m map[string]any) { m["model_type"] = "mistral"; m["sliding_window"] = "big" }, `sliding_window: "big"`},
		{"sizes overflow", func(m map[string]any) { m["hidden_size"] = 1 << 40; m["head_dim"] = 1 << 36 }, "parameter count"},
		{"theta beyond float32", set("rope_parameters", map[string]any{"rope_type": "default", "rope_theta": 1e39}), "rope_theta=1e+39 must be positive and within float32's range"},
		{"not json", nil, "invalid character"},
	} {
		var b []byte
		if tc.edit == nil {
			b = []byte("{not json")
		} else {
			b = edit(tc.edit)
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadHFConfig(dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), filepath.Join(dir, "config.json")) {
			t.Errorf("%s: got %v, want an error naming %s and %q", tc.name, err, filepath.Join(dir, "config.json"), tc.want)
		}
	}
	if _, err := ReadHFConfig(t.TempDir()); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("missing config.json: %v", err)
	}

	// Mistral: a null window is plain causal attention; a window is kept
	// and checked against the run's sequence length.
	c, err := ParseHFConfig(edit(func(m map[string]any) { m["model_type"] = "mistral"; m["sliding_window"] = nil }))
	if err != nil || c.SlidingWindow != 0 {
		t.Errorf("mistral with a null sliding_window: %+v, %v", c, err)
	}
	c, err = ParseHFConfig(edit(func(m map[string]any) {
		m["model_type"] = "mistral"
		delete(m, "sliding_window")
		delete(m, "max_position_embeddings")
	}))
	if err != nil || c.SlidingWindow != 4096 || c.MaxPos != 131072 {
		t.Errorf("mistral without sliding_window and max_position_embeddings: %+v, %v, want MistralConfig's defaults 4096 and 131072", c, err)
	}
	c, err = ParseHFConfig(edit(func(m map[string]any) { m["model_type"] = "mistral"; m["sliding_window"] = 16 }))
	if err != nil || c.SlidingWindow != 16 {
		t.Fatalf("mistral with sliding_window 16: %+v, %v", c, err)
	}
	if err := c.CheckSeqLen(16); err != nil {
		t.Errorf("T=16 with sliding_window=16: %v", err)
	}
	if err := c.CheckSeqLen(17); err == nil || !strings.Contains(err.Error(), "sliding_window=16") {
		t.Errorf("T=17 with sliding_window=16: %v", err)
	}
	if err := c.CheckSeqLen(65); err == nil || !strings.Contains(err.Error(), "max_position_embeddings=64") {
		t.Errorf("T=65 with max_position_embeddings=64: %v", err)
	}
	if c.MaxSeqLen() != 16 {
		t.Errorf("MaxSeqLen %d with sliding_window 16", c.MaxSeqLen())
	}
	be := cpu.New(cpu.Config{})
	defer be.Close()
	if _, err := New(be, c, 1, 17, backend.F32, model.Options{}); err == nil || !strings.Contains(err.Error(), "sliding_window") {
		t.Errorf("New with T beyond the sliding window: %v", err)
	}
	bad := hookCfg.clone()
	bad.RopeScaling.Type = "yarn"
	if _, err := New(be, bad, 1, 4, backend.F32, model.Options{}); err == nil || !strings.Contains(err.Error(), `"yarn"`) {
		t.Errorf("New with rope type yarn: %v", err)
	}
	if _, err := New(be, hookCfg, 1, 4, backend.I32, model.Options{}); err == nil {
		t.Error("New with an i32 model succeeded")
	}
}

// TestPresets: every preset validates, its parameter count is the real
// model's (as transformers counts it), the layout agrees, and Preset
// hands out copies.
func TestPresets(t *testing.T) {
	real := map[string]int{
		"smollm2-135m":        134_515_008,
		"tinyllama-1.1b":      1_100_048_384,
		"llama-7b":            6_738_415_616,
		"llama3-8b":           8_030_261_248,
		"deepseek-coder-1.3b": 1_346_471_936,
		"deepseek-coder-6.7b": 6_740_512_768,
		// Qwen's model cards: 0.49B, 1.54B, 7.61B.
		"qwen2.5-0.5b": 494_032_768,
		"qwen2.5-1.5b": 1_543_714_304,
		"qwen2.5-7b":   7_615_616_512,
	}
	for _, name := range Presets() {
		c, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		layout := c.Layout()
		last := layout[len(layout)-1]
		if n := last.Offset + last.Len(); n != c.NumParams() {
			t.Errorf("%s: layout holds %d, NumParams %d", name, n, c.NumParams())
		}
		if want, ok := real[name]; ok && c.NumParams() != want {
			t.Errorf("%s: %d parameters, the real model has %d", name, c.NumParams(), want)
		} else if !ok && name != "llama-tiny" {
			t.Errorf("%s: no reference parameter count", name)
		}
		if _, err := model.NewIndex(c); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if n, ok := c.paramCount(); !ok || n != c.NumParams() {
			t.Errorf("%s: paramCount %d (%v), NumParams %d", name, n, ok, c.NumParams())
		}
		if c.MaxSeqLen() != c.MaxPos || c.VocabSize() != c.Vocab || c.Family() != "llama" || len(c.Describe())%2 != 0 {
			t.Errorf("%s: spec %d %d %s %v", name, c.MaxSeqLen(), c.VocabSize(), c.Family(), c.Describe())
		}
	}
	c, _ := Preset("deepseek-coder-1.3b")
	c.RopeScaling.Factor = 1
	c.EOS[0] = 0
	if again, _ := Preset("deepseek-coder-1.3b"); again.RopeScaling.Factor != 4 || again.EOS[0] != 32014 {
		t.Error("Preset hands out the preset's own rope scaling or token ids")
	}
	if _, err := Preset("llama-70b"); err == nil || !strings.Contains(err.Error(), "llama-tiny") {
		t.Errorf("unknown preset: %v", err)
	}
}

// TestInit: HF's initialisation: norms 1, everything else N(0, 0.02),
// seeded.
func TestInit(t *testing.T) {
	c := hookCfg
	v := c.Init(1)
	if w := c.Init(1); !reflect.DeepEqual(v, w) {
		t.Error("Init is not deterministic")
	}
	for _, p := range c.Layout() {
		x := v[p.Offset : p.Offset+p.Len()]
		if len(p.Shape) == 1 {
			for _, e := range x {
				if e != 1 {
					t.Fatalf("%s: %v, want ones", p.Name, e)
				}
			}
			continue
		}
		var ss float64
		for _, e := range x {
			ss += float64(e) * float64(e)
		}
		if std := (ss / float64(len(x))); std < 0.015*0.015 || std > 0.025*0.025 {
			t.Errorf("%s: variance %g, want 0.02^2", p.Name, std)
		}
	}
}

// TestPlan7B: the llama-7b preset plans in bf16 within a 24 GB device
// (lsp mode: matrix hooks, fp32 gradients of the dense parameters only),
// where fp32 weights alone would not fit; and, unless -short, it
// allocates there on the CPU backend (zeroed pages the test never
// touches, so the machine's memory is not used up).
func TestPlan7B(t *testing.T) {
	c, err := Preset("llama-7b")
	if err != nil {
		t.Fatal(err)
	}
	const budget = 24 << 30
	opts := model.Options{MatrixGrads: modeltest.NopHook{}}
	plan := c.MemoryWith(1, 512, backend.BF16, opts)
	if plan.Params != 2*6_738_415_616 {
		t.Errorf("bf16 weights %d bytes", plan.Params)
	}
	if plan.Grads != 4*int64(2*32000*4096+65*4096) {
		t.Errorf("dense gradients %d bytes, want the embedding, head and norms in fp32", plan.Grads)
	}
	if plan.Total() > budget {
		t.Errorf("bf16 plan %d bytes exceeds 24 GiB: %+v", plan.Total(), plan)
	}
	if fp32 := c.MemoryWith(1, 512, backend.F32, opts); fp32.Params < budget {
		t.Errorf("fp32 weights %d bytes fit in 24 GiB?", fp32.Params)
	}
	if testing.Short() {
		t.Skip("-short: allocating 13.5 GB is skipped")
	}
	be := cpu.New(cpu.Config{MemBudget: budget})
	defer be.Close()
	m, err := New(be, c, 1, 512, backend.BF16, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if got := be.MemStats().InUse; got != plan.Total() {
		t.Errorf("allocated %d bytes, plan %d", got, plan.Total())
	}
}

// TestConfigJSON: a Config encodes to JSON and back as the same
// architecture (a checkpoint records it so), token id lists and nulls
// included, and Equal tells apart configs that differ in one field.
func TestConfigJSON(t *testing.T) {
	var cfgs []Config
	for _, name := range Presets() {
		c, _ := Preset(name)
		cfgs = append(cfgs, c)
	}
	odd := hookCfg.clone()
	odd.SlidingWindow, odd.EOS, odd.BOS, odd.InitRange = 16, ids(2, 9), nil, 0.01
	cfgs = append(cfgs, hookCfg, odd)
	for _, c := range cfgs {
		raw, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back Config
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatal(err)
		}
		if !back.Equal(c) || !reflect.DeepEqual(back, c) {
			t.Errorf("%s reads back as %+v", raw, back)
		}
	}
	for _, edit := range []func(*Config){
		func(c *Config) { c.RopeScaling.OriginalMaxPos++ },
		func(c *Config) { c.RopeScaling = nil },
		func(c *Config) { c.EOS = ids(2) },
		func(c *Config) { c.Eps = 1e-6 },
		func(c *Config) { c.HeadDim = 0 },
	} {
		c := odd.clone()
		edit(&c)
		if c.Equal(odd) || odd.Equal(c) {
			t.Errorf("%+v equals %+v", c, odd)
		}
	}
	if !odd.clone().Equal(odd) {
		t.Error("a clone is not Equal")
	}
}
