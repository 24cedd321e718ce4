package lora

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// The fixtures under testdata/ come from scripts/fixtures/peft_lora.py
// (PEFT itself); go-adapter/ is written by TestGoAdapter -update.

var families = []string{"gpt2", "llama"}

// fixtureIndex is the layout index of testdata/<family>/base.
func fixtureIndex(t *testing.T, family string) *model.Index {
	t.Helper()
	_, idx := fixtureArch(t, family)
	return idx
}

// fixtureAdapter reads testdata/<family>/<name>, an adapter of idx's
// model (name "adapter": PEFT's; "go-adapter": one this package wrote).
func fixtureAdapter(t *testing.T, family, name string, idx *model.Index) *Adapter {
	t.Helper()
	ad, err := ReadAdapter(filepath.Join("testdata", family, name), idx)
	if err != nil {
		t.Fatal(err)
	}
	return ad
}

// fixtureArch is testdata/<family>/base's architecture and its index.
func fixtureArch(t *testing.T, family string) (model.Arch, *model.Index) {
	t.Helper()
	dir := filepath.Join("testdata", family, "base")
	var arch model.Arch
	var err error
	switch family {
	case "gpt2":
		arch, err = gpt2.ReadHFConfig(dir)
	case "llama":
		arch, err = llama.ReadHFConfig(dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	idx, err := model.NewIndex(arch)
	if err != nil {
		t.Fatal(err)
	}
	return arch, idx
}

func openST(t *testing.T, path string) *safetensors.File {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func tensor(t *testing.T, f *safetensors.File, name string) ([]float32, []int) {
	t.Helper()
	v, shape, err := f.Float32(name)
	if err != nil {
		t.Fatal(err)
	}
	return v, shape
}

// inOut is an HF matrix in this project's in x out layout: Conv1D's as
// stored, Linear's (out x in) transposed.
func inOut(v []float32, shape []int, transposed bool) []float32 {
	if !transposed {
		return slices.Clone(v)
	}
	out, in := shape[0], shape[1]
	w := make([]float32, len(v))
	for o := range out {
		for i := range in {
			w[i*out+o] = v[o*in+i]
		}
	}
	return w
}

func TestReadPEFTAdapter(t *testing.T) {
	want := map[string]struct {
		targets []string
		sites   int
		fanIn   bool
		first   string
	}{
		"gpt2":  {[]string{"c_attn", "c_proj", "c_fc"}, 8, true, "transformer.h.0.attn.c_attn"},
		"llama": {[]string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, 14, false, "model.layers.0.self_attn.q_proj"},
	}
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			idx := fixtureIndex(t, fam)
			dir := filepath.Join("testdata", fam, "adapter")
			ad, err := ReadAdapter(dir, idx)
			if err != nil {
				t.Fatal(err)
			}
			w := want[fam]
			if ad.Cfg.R != 4 || ad.Cfg.Alpha != 8 || ad.Cfg.Dropout != 0 || ad.Cfg.Scale() != 2 {
				t.Errorf("config %+v, want r 4, alpha 8, dropout 0, scale 2", ad.Cfg)
			}
			got := slices.Clone(ad.Cfg.Targets)
			slices.Sort(got)
			wt := slices.Clone(w.targets)
			slices.Sort(wt)
			if !slices.Equal(got, wt) {
				t.Errorf("targets %v, want %v", ad.Cfg.Targets, w.targets)
			}
			if len(ad.Sites) != w.sites || ad.Sites[0].Module != w.first {
				t.Fatalf("%d sites starting at %s, want %d starting at %s", len(ad.Sites), ad.Sites[0].Module, w.sites, w.first)
			}
			f := openST(t, filepath.Join(dir, WeightsFile))
			if n := len(f.Names()); n != 2*len(ad.Sites) {
				t.Errorf("file has %d tensors, adapter %d sites", n, len(ad.Sites))
			}
			for i, s := range ad.Sites {
				if s.FanInFanOut != w.fanIn {
					t.Errorf("%s: FanInFanOut %t", s.Module, s.FanInFanOut)
				}
				a, ashape := tensor(t, f, KeyA(s))
				b, bshape := tensor(t, f, KeyB(s))
				if !slices.Equal(ashape, []int{4, s.M}) || !slices.Equal(bshape, []int{s.N, 4}) {
					t.Errorf("%s: shapes %v %v for a %d x %d matrix", s.Module, ashape, bshape, s.M, s.N)
				}
				if !slices.Equal(a, ad.A[i]) || !slices.Equal(b, ad.B[i]) {
					t.Errorf("%s: A or B differs from the file", s.Module)
				}
				// PEFT's lora_A is Kaiming-uniform with bound 1/sqrt(in),
				// the bound Init uses: every value inside, the largest near it.
				bound := 1 / math.Sqrt(float64(s.M))
				var top float64
				for _, x := range a {
					top = max(top, math.Abs(float64(x)))
				}
				if top > bound || top < 0.8*bound {
					t.Errorf("%s: max |A| %g, PEFT's bound 1/sqrt(%d) = %g", s.Module, top, s.M, bound)
				}
			}
		})
	}
}

func TestMergeMatchesPEFT(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			idx := fixtureIndex(t, fam)
			ad := fixtureAdapter(t, fam, "adapter", idx)
			base := openST(t, filepath.Join("testdata", fam, "base", "model.safetensors"))
			merged := openST(t, filepath.Join("testdata", fam, "merged.safetensors"))
			if n := len(merged.Names()); n != len(ad.Sites) {
				t.Fatalf("merged.safetensors has %d tensors, %d sites", n, len(ad.Sites))
			}
			var worst float64
			for i, s := range ad.Sites {
				p := idx.Layout[idx.MatParam[s.Layer][s.K]]
				v, shape := tensor(t, base, s.Module+".weight")
				w := inOut(v, shape, p.Transposed)
				w0 := slices.Clone(w)
				if err := Merge(w, s, ad.A[i], ad.B[i], ad.Cfg.Scale()); err != nil {
					t.Fatal(err)
				}
				mv, mshape := tensor(t, merged, s.Module+".weight")
				want := inOut(mv, mshape, p.Transposed)
				changed := 0
				for e := range w {
					// The tolerance scales with the terms' size, not the
					// sum's, which may cancel.
					ii, j := e/s.N, e%s.N
					var term float64
					for k := range ad.Cfg.R {
						term += math.Abs(float64(ad.A[i][k*s.M+ii]) * float64(ad.B[i][j*ad.Cfg.R+k]))
					}
					size := math.Abs(float64(w0[e])) + float64(ad.Cfg.Scale())*term
					d := math.Abs(float64(w[e]) - float64(want[e]))
					if d > 1e-6*size+1e-12 {
						t.Fatalf("%s[%d][%d]: merged %g, PEFT %g (base %g)", s.Module, ii, j, w[e], want[e], w0[e])
					}
					worst = max(worst, d/max(size, 1e-30))
					if w[e] != w0[e] {
						changed++
					}
				}
				if changed < len(w)/2 {
					t.Errorf("%s: the merge changed %d of %d elements", s.Module, changed, len(w))
				}
			}
			t.Logf("largest difference from PEFT, relative to the terms: %.2g", worst)
		})
	}
}

func TestMergeDeterministicAndChecked(t *testing.T) {
	s := Site{Module: "m", M: 3, N: 2}
	a := []float32{1, 2, 3, 4, 5, 6} // r = 2: A = [[1 2 3] [4 5 6]]
	b := []float32{1, 0, 0, 1}       // B = I
	w := make([]float32, 6)
	if err := Merge(w, s, a, b, 0.5); err != nil {
		t.Fatal(err)
	}
	// w[i][j] = 0.5 * sum_k A[k][i] B[j][k] = 0.5 * A[j][i].
	if want := []float32{0.5, 2, 1, 2.5, 1.5, 3}; !slices.Equal(w, want) {
		t.Errorf("merge %v, want %v", w, want)
	}
	for _, c := range []struct {
		name    string
		w, a, b []float32
	}{
		{"base", make([]float32, 5), a, b},
		{"A", w, a[:5], b},
		{"B", w, a, b[:3]},
	} {
		if err := Merge(c.w, s, c.a, c.b, 1); err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: err %v, want one naming %s", c.name, err, c.name)
		}
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			idx := fixtureIndex(t, fam)
			ad := fixtureAdapter(t, fam, "adapter", idx)
			ad.Cfg.Dropout = 0.05
			dir := filepath.Join(t.TempDir(), "out")
			// A file of the user's in the directory stays.
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("mine"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := WriteAdapter(dir, ad, "some/base"); err != nil {
				t.Fatal(err)
			}
			back, err := ReadAdapter(dir, idx)
			if err != nil {
				t.Fatal(err)
			}
			if back.BaseModel != "some/base" || back.Cfg.R != ad.Cfg.R || back.Cfg.Alpha != ad.Cfg.Alpha ||
				back.Cfg.Dropout != 0.05 || !slices.Equal(back.Cfg.Targets, ad.Cfg.Targets) || !slices.Equal(back.Sites, ad.Sites) {
				t.Errorf("read back %+v %q, wrote %+v", back.Cfg, back.BaseModel, ad.Cfg)
			}
			for i := range ad.Sites {
				if !sameBits(back.A[i], ad.A[i]) || !sameBits(back.B[i], ad.B[i]) {
					t.Errorf("%s: tensors differ after the round trip", ad.Sites[i].Module)
				}
			}
			if b, err := os.ReadFile(filepath.Join(dir, "README.md")); err != nil || string(b) != "mine" {
				t.Errorf("README.md: %q, %v", b, err)
			}
			// PEFT's own fields, with PEFT's types.
			raw, err := os.ReadFile(filepath.Join(dir, ConfigFile))
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{`"peft_type": "LORA"`, `"task_type": "CAUSAL_LM"`, `"r": 4,`, `"lora_alpha": 8,`,
				`"lora_dropout": 0.05,`, `"bias": "none"`, `"inference_mode": true`, `"init_lora_weights": true`,
				`"use_rslora": false`, `"use_dora": false`, `"base_model_name_or_path": "some/base"`,
				`"fan_in_fan_out": ` + map[string]string{"gpt2": "true", "llama": "false"}[fam]} {
				if !bytes.Contains(raw, []byte(want)) {
					t.Errorf("%s lacks %s:\n%s", ConfigFile, want, raw)
				}
			}
			// Writing again gives the same bytes.
			dir2 := filepath.Join(t.TempDir(), "again")
			if err := WriteAdapter(dir2, back, "some/base"); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{ConfigFile, WeightsFile} {
				if !sameFile(t, filepath.Join(dir, name), filepath.Join(dir2, name)) {
					t.Errorf("%s differs between two writes", name)
				}
			}
		})
	}
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

func TestWriteAdapterRefuses(t *testing.T) {
	idx := fixtureIndex(t, "gpt2")
	good := func() *Adapter {
		ad, err := ReadAdapter(filepath.Join("testdata", "gpt2", "adapter"), idx)
		if err != nil {
			t.Fatal(err)
		}
		return ad
	}
	for _, c := range []struct {
		name   string
		change func(a *Adapter)
		want   string
	}{
		{"short A", func(a *Adapter) { a.A[1] = a.A[1][:3] }, "A has 3 elements"},
		{"NaN", func(a *Adapter) { a.B[0][2] = float32(math.NaN()) }, "element 2 is NaN"},
		{"no targets", func(a *Adapter) { a.Cfg.Targets = nil }, "no target modules"},
		{"rank", func(a *Adapter) { a.Cfg.R = 0 }, "--lora-r"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ad := good()
			c.change(ad)
			dir := filepath.Join(t.TempDir(), "out")
			err := WriteAdapter(dir, ad, "")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one containing %q", err, c.want)
			}
			if _, serr := os.Stat(dir); !os.IsNotExist(serr) {
				t.Errorf("a refused write made %s", dir)
			}
		})
	}
}

// copyAdapter copies testdata/<family>/adapter to a temp directory and
// lets edit change the parsed adapter_config.json.
func copyAdapter(t *testing.T, family string, edit func(cfg map[string]any)) string {
	t.Helper()
	src := filepath.Join("testdata", family, "adapter")
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(src, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), out, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(filepath.Join(src, WeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, WeightsFile), w, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestReadAdapterRefusesConfig(t *testing.T) {
	set := func(k string, v any) func(map[string]any) { return func(c map[string]any) { c[k] = v } }
	cases := []struct {
		family, field string
		edit          func(map[string]any)
	}{
		{"gpt2", "peft_type", set("peft_type", "IA3")},
		{"gpt2", "peft_type", func(c map[string]any) { delete(c, "peft_type") }},
		{"gpt2", "task_type", set("task_type", "SEQ_CLS")},
		{"gpt2", "use_rslora", set("use_rslora", true)},
		{"gpt2", "use_dora", set("use_dora", true)},
		{"gpt2", "lora_bias", set("lora_bias", true)},
		{"gpt2", "rank_pattern", set("rank_pattern", map[string]any{"c_attn": 8})},
		{"gpt2", "alpha_pattern", set("alpha_pattern", map[string]any{"c_fc": 4})},
		{"gpt2", "modules_to_save", set("modules_to_save", []any{"lm_head"})},
		{"gpt2", "bias", set("bias", "lora_only")},
		{"gpt2", "bias", set("bias", "all")},
		{"gpt2", "target_modules", set("target_modules", ".*attn.*")},
		{"gpt2", "target_modules", set("target_modules", "all-linear")},
		{"gpt2", "target_modules", set("target_modules", []any{"c_attn", "q_proj"})},
		{"gpt2", "target_modules", set("target_modules", nil)},
		{"gpt2", "target_modules", set("target_modules", []any{})},
		{"gpt2", "layers_to_transform", set("layers_to_transform", []any{0})},
		{"gpt2", "layers_to_transform", set("layers_to_transform", 1)},
		{"gpt2", "layers_to_transform", set("layers_to_transform", 0)},
		{"gpt2", "layers_pattern", set("layers_pattern", "h")},
		{"gpt2", "fan_in_fan_out", set("fan_in_fan_out", false)},
		{"llama", "fan_in_fan_out", set("fan_in_fan_out", true)},
		{"gpt2", "r", set("r", 0)},
		{"gpt2", "r", set("r", 2.5)},
		{"gpt2", "lora_alpha", set("lora_alpha", -1)},
		{"gpt2", "lora_dropout", set("lora_dropout", 1)},
		{"gpt2", "init_lora_weights", set("init_lora_weights", "pissa")},
		{"gpt2", "init_lora_weights", set("init_lora_weights", "loftq")},
		{"gpt2", "layer_replication", set("layer_replication", []any{[]any{0, 2}})},
		{"gpt2", "exclude_modules", set("exclude_modules", []any{"c_fc"})},
		{"gpt2", "trainable_token_indices", set("trainable_token_indices", []any{1, 2})},
		{"gpt2", "target_parameters", set("target_parameters", []any{"mlp.experts"})},
		{"gpt2", "some_future_field", set("some_future_field", true)},
		{"llama", "target_modules", set("target_modules", []any{"q_proj", "lm_head"})},
	}
	for _, c := range cases {
		t.Run(c.family+"/"+c.field, func(t *testing.T) {
			idx := fixtureIndex(t, c.family)
			dir := copyAdapter(t, c.family, c.edit)
			_, err := ReadAdapter(dir, idx)
			if err == nil {
				t.Fatal("read, want an error")
			}
			msg := err.Error()
			if !strings.Contains(msg, filepath.Join(dir, ConfigFile)) || !strings.Contains(msg, c.field) {
				t.Errorf("%v: want the file and %s named", err, c.field)
			}
		})
	}
	// Unset fields of any kind, and PEFT's harmless ones, are read.
	ok := func(c map[string]any) {
		c["layers_to_transform"], c["rank_pattern"], c["modules_to_save"] = []any{}, map[string]any{}, nil
		c["some_future_field"], c["init_lora_weights"], c["task_type"] = nil, "gaussian", nil
		c["revision"], c["loftq_config"] = "main", map[string]any{"loftq_bits": 4}
		delete(c, "lora_dropout")
	}
	if _, err := ReadAdapter(copyAdapter(t, "gpt2", ok), fixtureIndex(t, "gpt2")); err != nil {
		t.Errorf("unset fields: %v", err)
	}
}

func TestReadAdapterRefusesTensors(t *testing.T) {
	idx := fixtureIndex(t, "llama")
	src := openST(t, filepath.Join("testdata", "llama", "adapter", WeightsFile))
	sites, err := Sites(idx, Config{R: 4, Alpha: 8, Targets: DefaultTargets("llama")})
	if err != nil {
		t.Fatal(err)
	}
	keyQ := KeyA(sites[0])
	// rewrite writes the fixture's tensors through change, which may drop
	// (return false), reshape or convert one, or add others.
	rewrite := func(t *testing.T, change func(ts []safetensors.Tensor) []safetensors.Tensor) string {
		dir := copyAdapter(t, "llama", nil)
		var ts []safetensors.Tensor
		for _, name := range src.Names() {
			v, shape := tensor(t, src, name)
			ts = append(ts, safetensors.F32Tensor(name, shape, v))
		}
		if err := safetensors.Write(filepath.Join(dir, WeightsFile), change(ts), nil); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, c := range []struct {
		name, want string
		change     func(ts []safetensors.Tensor) []safetensors.Tensor
	}{
		{"missing", keyQ + " is missing", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Name == keyQ })
		}},
		{"extra", "lm_head.lora_A.weight", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return append(ts, safetensors.F32Tensor("base_model.model.lm_head.lora_A.weight", []int{4, 32}, make([]float32, 128)))
		}},
		{"bias", "q_proj.lora_B.bias", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return append(ts, safetensors.F32Tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", []int{32}, make([]float32, 32)))
		}},
		{"rank", keyQ + " is [2 64]", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == keyQ {
					ts[i].Shape = []int{2, 64}
				}
			}
			return ts
		}},
		{"transposed", keyQ + " is [32 4]", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == keyQ {
					ts[i].Shape = []int{32, 4}
				}
			}
			return ts
		}},
		{"int", "dtype I64", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == keyQ {
					ts[i] = safetensors.I64Tensor(keyQ, []int{4, 32}, make([]int64, 128))
				}
			}
			return ts
		}},
		{"inf", "is +Inf", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == keyQ {
					v := make([]float32, 128)
					v[5] = float32(math.Inf(1))
					ts[i] = safetensors.F32Tensor(keyQ, []int{4, 32}, v)
				}
			}
			return ts
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := rewrite(t, c.change)
			_, err := ReadAdapter(dir, idx)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), filepath.Join(dir, WeightsFile)) {
				t.Fatalf("err %v, want one naming the file and %q", err, c.want)
			}
		})
	}
	t.Run("no file", func(t *testing.T) {
		dir := copyAdapter(t, "llama", nil)
		if err := os.Rename(filepath.Join(dir, WeightsFile), filepath.Join(dir, "adapter_model.bin")); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadAdapter(dir, idx); err == nil || !strings.Contains(err.Error(), "adapter_model.bin") {
			t.Fatalf("err %v, want one about adapter_model.bin", err)
		}
	})
}

// TestReadAdapterHalf: fp16 and bf16 adapters are read, widened exactly.
func TestReadAdapterHalf(t *testing.T) {
	idx := fixtureIndex(t, "gpt2")
	ad, err := ReadAdapter(filepath.Join("testdata", "gpt2", "adapter"), idx)
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		dir := copyAdapter(t, "gpt2", nil)
		var ts []safetensors.Tensor
		for i, s := range ad.Sites {
			ts = append(ts, half(KeyA(s), []int{4, s.M}, ad.A[i], dt), half(KeyB(s), []int{s.N, 4}, ad.B[i], dt))
		}
		if err := safetensors.Write(filepath.Join(dir, WeightsFile), ts, nil); err != nil {
			t.Fatal(err)
		}
		got, err := ReadAdapter(dir, idx)
		if err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		for i := range ad.Sites {
			for j, x := range got.B[i] {
				if d := math.Abs(float64(x - ad.B[i][j])); d > 1e-2*math.Abs(float64(ad.B[i][j]))+1e-4 {
					t.Fatalf("%s: B[%d][%d] %g, want about %g", dt, i, j, x, ad.B[i][j])
				}
			}
		}
	}
}

// half encodes v as dt (BF16 by truncation, F16 by rounding through
// float16's bit layout for the small normal values of the fixture).
func half(name string, shape []int, v []float32, dt safetensors.DType) safetensors.Tensor {
	data := make([]byte, 2*len(v))
	for i, x := range v {
		var h uint16
		if dt == safetensors.BF16 {
			h = uint16(math.Float32bits(x) >> 16)
		} else {
			h = f16(x)
		}
		data[2*i], data[2*i+1] = byte(h), byte(h>>8)
	}
	return safetensors.Tensor{Name: name, DType: dt, Shape: shape, Data: data}
}

// f16 is x as an IEEE half (normal range only, mantissa truncated; a
// value too small for a normal half becomes zero, within the test's 1e-4).
func f16(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	if x == 0 || exp <= 0 {
		return sign
	}
	return sign | uint16(exp)<<10 | uint16((b>>13)&0x3ff)
}

func TestSitesFamilies(t *testing.T) {
	g := fixtureIndex(t, "gpt2")
	sites, err := Sites(g, Config{R: 2, Alpha: 2, Targets: []string{"c_proj"}})
	if err != nil {
		t.Fatal(err)
	}
	var mods []string
	for _, s := range sites {
		mods = append(mods, s.Module)
	}
	want := []string{"transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_proj", "transformer.h.1.attn.c_proj", "transformer.h.1.mlp.c_proj"}
	if !slices.Equal(mods, want) {
		t.Errorf("c_proj: %v, want %v", mods, want)
	}
	if s := sites[1]; s.M != 128 || s.N != 32 || !s.FanInFanOut || s.Layer != 0 || s.K != 3 {
		t.Errorf("mlp.c_proj site %+v", s)
	}
	if s, err := Sites(g, Config{R: 2, Alpha: 2, Targets: []string{"mlp.c_proj"}}); err != nil || len(s) != 2 {
		t.Errorf("mlp.c_proj: %d sites, %v", len(s), err)
	}
	all, err := Sites(g, Config{R: 2, Alpha: 2, Targets: DefaultTargets("gpt2")})
	if err != nil || len(all) != 8 {
		t.Errorf("gpt2 defaults: %d sites, %v", len(all), err)
	}
	l := fixtureIndex(t, "llama")
	all, err = Sites(l, Config{R: 2, Alpha: 2, Targets: DefaultTargets("llama")})
	if err != nil || len(all) != 14 {
		t.Fatalf("llama defaults: %d sites, %v", len(all), err)
	}
	if s := all[1]; s.Module != "model.layers.0.self_attn.k_proj" || s.M != 32 || s.N != 16 || s.FanInFanOut {
		t.Errorf("k_proj site %+v", s)
	}
	_, err = Sites(l, Config{R: 2, Alpha: 2, Targets: []string{"q_proj", "c_attn"}})
	if err == nil || !strings.Contains(err.Error(), "no module c_attn (") {
		t.Errorf("unknown target: %v", err)
	}
}

func TestInit(t *testing.T) {
	const m, r = 50, 8
	a := make([]float32, m*r)
	if err := Init(rand.New(rand.NewPCG(1, 2)), a, m, r); err != nil {
		t.Fatal(err)
	}
	b := make([]float32, m*r)
	if err := Init(rand.New(rand.NewPCG(1, 2)), b, m, r); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, b) {
		t.Error("two draws from one seed differ")
	}
	bound := 1 / math.Sqrt(m)
	var sum, sq, top float64
	for _, x := range a {
		v := float64(x)
		sum, sq, top = sum+v, sq+v*v, max(top, math.Abs(v))
	}
	n := float64(len(a))
	// U(-b, b): mean 0, variance b^2/3.
	if top > bound || top < 0.95*bound || math.Abs(sum/n) > 0.1*bound || math.Abs(sq/n/(bound*bound/3)-1) > 0.2 {
		t.Errorf("max %g mean %g var %g, want U(-%g, %g)", top, sum/n, sq/n, bound, bound)
	}
	if Init(nil, a, m, r) == nil || Init(rand.New(rand.NewPCG(1, 2)), a[:3], m, r) == nil {
		t.Error("a nil source or a wrong length was accepted")
	}
	ad, err := NewAdapter(fixtureIndex(t, "llama"), Config{R: 2, Alpha: 4, Targets: []string{"v_proj", "down_proj"}}, 9)
	if err != nil {
		t.Fatal(err)
	}
	if len(ad.Sites) != 4 || ad.Sites[1].Module != "model.layers.0.mlp.down_proj" {
		t.Fatalf("sites %+v", ad.Sites)
	}
	for i, s := range ad.Sites {
		if len(ad.A[i]) != 2*s.M || len(ad.B[i]) != s.N*2 || slices.ContainsFunc(ad.B[i], func(x float32) bool { return x != 0 }) {
			t.Errorf("%s: A %d, B %d elements, B not all zero", s.Module, len(ad.A[i]), len(ad.B[i]))
		}
	}
}

func TestPyNumber(t *testing.T) {
	for _, c := range []struct {
		v       float64
		integer bool
		want    string
	}{
		{16, true, "16"}, {16.5, true, "16.5"}, {0, false, "0.0"}, {0.05, false, "0.05"},
		{1e-5, false, "1e-05"}, {1e16, false, "1e+16"}, {8, false, "8.0"}, {0.1, false, "0.1"},
	} {
		got, err := pyNumber{c.v, c.integer}.MarshalJSON()
		if err != nil || string(got) != c.want {
			t.Errorf("%v (integer %t): %s, %v; want %s (Python's json)", c.v, c.integer, got, err, c.want)
		}
	}
	if _, err := (pyNumber{math.NaN(), false}).MarshalJSON(); err == nil {
		t.Error("NaN was written")
	}
}

func TestMergeAllRefusesAnotherModel(t *testing.T) {
	ad, err := ReadAdapter(filepath.Join("testdata", "gpt2", "adapter"), fixtureIndex(t, "gpt2"))
	if err != nil {
		t.Fatal(err)
	}
	idx := fixtureIndex(t, "llama")
	last := idx.Layout[len(idx.Layout)-1]
	err = MergeAll(make([]float32, last.Offset+last.Len()), idx, ad)
	if err == nil || !strings.Contains(err.Error(), "transformer.h.0.attn.c_attn") {
		t.Errorf("a GPT-2 adapter merged into a LLaMA: %v", err)
	}
}

// TestMergeFetchMatchesMergeAll: an export's stream through MergeFetch, in
// chunks that start and end inside rows and matrices, gives MergeAll's
// weights bit for bit.
func TestMergeFetchMatchesMergeAll(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			_, idx := fixtureArch(t, fam)
			ad := fixtureAdapter(t, fam, "adapter", idx)
			base := baseParams(t, fam, idx)
			want := slices.Clone(base)
			if err := MergeAll(want, idx, ad); err != nil {
				t.Fatal(err)
			}
			fetch, err := MergeFetch(func(off int, dst []float32) error { copy(dst, base[off:]); return nil }, idx, ad)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float32, len(base))
			for off, chunk := 0, 1; off < len(got); off, chunk = off+chunk, chunk*3%1000+7 {
				n := min(chunk, len(got)-off)
				if err := fetch(off, got[off:off+n]); err != nil {
					t.Fatal(err)
				}
			}
			if !sameBits(got, want) {
				t.Fatal("the merged stream differs from MergeAll")
			}
			if sameBits(got, base) {
				t.Fatal("nothing was merged")
			}
		})
	}
}
