package gpt2

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// TestExportRoundTrip exports the fixture and reads it back unchanged.
func TestExportRoundTrip(t *testing.T) {
	cfg, vals, err := LoadHF(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ExportHF(dir, cfg, vals); err != nil {
		t.Fatal(err)
	}
	cfg2, vals2, err := LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg2 != cfg || !slices.Equal(vals, vals2) {
		t.Fatalf("round trip changed the model: %+v vs %+v", cfg2, cfg)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	if h["model_type"] != "gpt2" || h["tie_word_embeddings"] != true || h["activation_function"] != "gelu_new" {
		t.Errorf("config.json lacks what transformers needs: %s", raw)
	}
	f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Info("lm_head.weight"); ok {
		t.Error("export stores lm_head.weight; it is tied to wte")
	}
}

// TestExportEpsilon: config.json holds layer_norm_epsilon as the shortest
// decimal of the float32 value (1e-05, as transformers writes it, not
// 0.000009999999747378752), and reads back as the same float32, for
// epsilons float32 cannot hold exactly.
func TestExportEpsilon(t *testing.T) {
	for _, tc := range []struct {
		eps  float32
		want string
	}{
		{1e-5, `"layer_norm_epsilon": 1e-05,`},
		{1e-6, `"layer_norm_epsilon": 1e-06,`},
		{0.1, `"layer_norm_epsilon": 0.1,`},
		{3.3e-7, `"layer_norm_epsilon": 3.3e-07,`},
	} {
		cfg := Config{V: 257, MaxT: 8, C: 8, L: 1, NH: 2, Eps: tc.eps}
		dir := t.TempDir()
		if err := ExportHF(dir, cfg, Init(cfg, 1)); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), tc.want) {
			t.Errorf("epsilon %g: config.json does not hold %s:\n%s", tc.eps, tc.want, raw)
		}
		back, err := ReadHFConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		if back.Eps != tc.eps {
			t.Errorf("epsilon %g read back as %g", tc.eps, back.Eps)
		}
	}
}

// TestLoadSharded: a GPT-2 directory whose weights are shards listed by
// model.safetensors.index.json (as save_pretrained writes past
// max_shard_size) loads as the single-file fixture, bit for bit.
func TestLoadSharded(t *testing.T) {
	cfg, vals, err := LoadHF(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := writeHFConfig(dir, cfg); err != nil {
		t.Fatal(err)
	}
	err = hf.ExportFloat32(dir, vals, cfg.Layout(), hf.ExportOptions{DType: backend.F32, ShardBytes: int64(4*len(vals)) / 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, hf.IndexFile)); err != nil {
		t.Fatalf("no index: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); !os.IsNotExist(err) {
		t.Fatalf("a single file beside the shards: %v", err)
	}
	cfg2, vals2, err := LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg2 != cfg || !slices.Equal(vals, vals2) {
		t.Fatal("the sharded directory loads differently")
	}
	// A shard missing: the error names the index and the shard.
	shards, _ := filepath.Glob(filepath.Join(dir, "model-00002-of-*.safetensors"))
	if len(shards) != 1 {
		t.Fatalf("shards: %v", shards)
	}
	if err := os.Remove(shards[0]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadHF(dir); err == nil || !strings.Contains(err.Error(), hf.IndexFile) || !strings.Contains(err.Error(), filepath.Base(shards[0])) {
		t.Errorf("missing shard: %v", err)
	}
}

// TestLoadInto: loading straight into a backend tensor gives LoadHF's
// values, with a stored lm_head.weight equal to wte accepted and one that
// differs (in its last element) refused naming the
// file, leaving the destination as it was.
func TestLoadInto(t *testing.T) {
	cfg, vals, err := LoadHF(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(cpu.Config{Threads: 1})
	defer be.Close()
	s := be.DefaultStream()
	dst, err := be.Alloc("params", len(vals), backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(fixtureDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var tensors []safetensors.Tensor
	for _, name := range f.Names() {
		raw, ti, err := f.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		tensors = append(tensors, safetensors.Tensor{Name: name, DType: ti.DType, Shape: ti.Shape, Data: raw})
	}
	wte := cfg.Layout()[0]
	head := slices.Clone(vals[wte.Offset : wte.Offset+wte.Len()])
	for _, tied := range []bool{true, false} {
		if !tied {
			head[len(head)-1] += 1
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "model.safetensors")
		all := append(slices.Clone(tensors), safetensors.F32Tensor("lm_head.weight", wte.Shape, head))
		if err := safetensors.Write(path, all, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
		if err := backend.Upload(be, s, dst, make([]float32, len(vals))); err != nil {
			t.Fatal(err)
		}
		err := LoadInto(path, cfg, be, s, dst)
		got, derr := backend.Download(be, s, dst)
		if derr != nil {
			t.Fatal(derr)
		}
		switch {
		case tied && err != nil:
			t.Errorf("tied head: %v", err)
		case tied && !slices.Equal(got, vals):
			t.Errorf("LoadInto's values differ from LoadHF's")
		case !tied && (err == nil || !strings.Contains(err.Error(), "untied heads") || !strings.Contains(err.Error(), path)):
			t.Errorf("untied head: error %v, want one naming %s and untied heads", err, path)
		case !tied && slices.ContainsFunc(got, func(x float32) bool { return x != 0 }):
			t.Errorf("a refused load wrote to the destination")
		}
	}
}
