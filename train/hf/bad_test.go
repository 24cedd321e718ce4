package hf

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

var shardNames = []string{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}

// copyDir copies the files of src (not directories) into a new temp dir.
func copyDir(t *testing.T, src string) string {
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// editTensors rewrites the safetensors file at path with edit's tensors.
func editTensors(t *testing.T, path string, edit func([]safetensors.Tensor) []safetensors.Tensor) {
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, n := range f.Names() {
		b, ti, _ := f.Raw(n)
		ts = append(ts, safetensors.Tensor{Name: n, DType: ti.DType, Shape: ti.Shape, Data: slices.Clone(b)})
	}
	if err := safetensors.Write(path, edit(ts), f.Metadata); err != nil {
		t.Fatal(err)
	}
}

// editIndex rewrites dir's index: edit changes its weight_map.
func editIndex(t *testing.T, dir string, edit func(map[string]string)) {
	path := filepath.Join(dir, IndexFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var idx map[string]any
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	wm := map[string]string{}
	for k, v := range idx["weight_map"].(map[string]any) {
		wm[k] = v.(string)
	}
	edit(wm)
	idx["weight_map"] = wm
	out, _ := json.Marshal(idx)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func tensorIndex(ts []safetensors.Tensor, name string) int {
	for i, x := range ts {
		if x.Name == name {
			return i
		}
	}
	panic("no tensor " + name)
}

// TestBadInput: every broken directory is refused with an error naming
// the file and the field (the tensor, the index's weight_map), and the
// destination keeps its values.
func TestBadInput(t *testing.T) {
	cfg := readLlamaConfig(t, fixture)
	layout := llamaLayout(cfg)
	be, s := newCPU(t)
	n, _ := layoutLen(layout)
	sentinel := make([]float32, n)
	for i := range sentinel {
		sentinel[i] = 7
	}
	dst, err := be.Alloc("params", n, backend.BF16)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		src  string
		// edit breaks dir and returns the strings the error must hold
		// (besides those in want).
		edit func(t *testing.T, dir string) []string
	}{
		{"missing shard", fixtureSharded, func(t *testing.T, dir string) []string {
			os.Remove(filepath.Join(dir, shardNames[1]))
			return []string{filepath.Join(dir, IndexFile), "weight_map", shardNames[1], "missing"}
		}},
		{"dot-dot shard", fixtureSharded, func(t *testing.T, dir string) []string {
			// The file exists there: only the path is wrong.
			b, _ := os.ReadFile(filepath.Join(dir, shardNames[1]))
			os.WriteFile(filepath.Join(filepath.Dir(dir), shardNames[1]), b, 0o644)
			editIndex(t, dir, func(wm map[string]string) {
				for k, v := range wm {
					if v == shardNames[1] {
						wm[k] = "../" + v
					}
				}
			})
			return []string{filepath.Join(dir, IndexFile), "weight_map", "../" + shardNames[1], "leaves the model directory"}
		}},
		{"absolute shard", fixtureSharded, func(t *testing.T, dir string) []string {
			abs, _ := filepath.Abs(filepath.Join(dir, shardNames[2]))
			editIndex(t, dir, func(wm map[string]string) {
				for k, v := range wm {
					if v == shardNames[2] {
						wm[k] = abs
					}
				}
			})
			return []string{filepath.Join(dir, IndexFile), "weight_map", abs, "leaves the model directory"}
		}},
		{"symlink out", fixtureSharded, func(t *testing.T, dir string) []string {
			out := filepath.Join(t.TempDir(), "elsewhere.safetensors")
			if err := os.Rename(filepath.Join(dir, shardNames[0]), out); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(out, filepath.Join(dir, shardNames[0])); err != nil {
				t.Skip(err)
			}
			return []string{filepath.Join(dir, IndexFile), "weight_map", shardNames[0], "symbolic link", "outside"}
		}},
		{"wrong shape", fixtureSharded, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, shardNames[0])
			editTensors(t, p, func(ts []safetensors.Tensor) []safetensors.Tensor {
				ts[tensorIndex(ts, "model.layers.0.self_attn.q_proj.weight")].Shape = []int{32, 128}
				return ts
			})
			return []string{p, `"model.layers.0.self_attn.q_proj.weight"`, "shape [32 128]", "needs [64 64]"}
		}},
		{"I64 tensor", fixture, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, SingleFile)
			editTensors(t, p, func(ts []safetensors.Tensor) []safetensors.Tensor {
				i := tensorIndex(ts, "model.layers.1.self_attn.k_proj.weight")
				ts[i] = safetensors.I64Tensor(ts[i].Name, ts[i].Shape, make([]int64, 32*64))
				return ts
			})
			return []string{p, `"model.layers.1.self_attn.k_proj.weight"`, "dtype I64"}
		}},
		{"truncated shard", fixtureSharded, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, shardNames[2])
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-100)
			return []string{p, "truncated"}
		}},
		{"NaN", fixtureSharded, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, shardNames[1])
			editTensors(t, p, func(ts []safetensors.Tensor) []safetensors.Tensor {
				d := ts[tensorIndex(ts, "model.layers.1.self_attn.o_proj.weight")].Data
				d[10], d[11] = 0xc0, 0x7f // element 5: bf16 NaN 0x7fc0
				return ts
			})
			return []string{p, "model.layers.1.self_attn.o_proj.weight holds NaN at element 5", "not finite"}
		}},
		{"Inf", fixture, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, SingleFile)
			editTensors(t, p, func(ts []safetensors.Tensor) []safetensors.Tensor {
				i := tensorIndex(ts, "model.norm.weight")
				v := make([]float32, 64)
				v[63] = float32(math.Inf(-1))
				ts[i] = safetensors.F32Tensor(ts[i].Name, ts[i].Shape, v)
				return ts
			})
			return []string{p, "model.norm.weight holds -Inf at element 63", "not finite"}
		}},
		{"index not JSON", fixtureSharded, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, IndexFile)
			os.WriteFile(p, []byte(`{"weight_map": {`), 0o644)
			return []string{p, "not valid JSON"}
		}},
		{"no weight_map", fixtureSharded, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, IndexFile)
			os.WriteFile(p, []byte(`{"metadata": {"total_size": 266880}}`), 0o644)
			return []string{p, "no weight_map"}
		}},
		{"weight_map not an object", fixtureSharded, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, IndexFile)
			os.WriteFile(p, []byte(`{"weight_map": ["a"]}`), 0o644)
			return []string{p, "weight_map"}
		}},
		{"tensor not in its shard", fixtureSharded, func(t *testing.T, dir string) []string {
			editIndex(t, dir, func(wm map[string]string) { wm["model.norm.weight"] = shardNames[0] })
			return []string{filepath.Join(dir, IndexFile), "weight_map", `"model.norm.weight"`, shardNames[0], "does not contain it"}
		}},
		{"tensor not listed", fixtureSharded, func(t *testing.T, dir string) []string {
			editIndex(t, dir, func(wm map[string]string) { delete(wm, "model.norm.weight") })
			return []string{filepath.Join(dir, IndexFile), "weight_map", `"model.norm.weight"`, "not listed"}
		}},
		{"tensor missing", fixtureSharded, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, shardNames[2])
			editTensors(t, p, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return slices.Delete(ts, tensorIndex(ts, "model.norm.weight"), tensorIndex(ts, "model.norm.weight")+1)
			})
			editIndex(t, dir, func(wm map[string]string) { delete(wm, "model.norm.weight") })
			return []string{filepath.Join(dir, IndexFile), `"model.norm.weight" is missing`}
		}},
		{"unknown tensor", fixture, func(t *testing.T, dir string) []string {
			p := filepath.Join(dir, SingleFile)
			editTensors(t, p, func(ts []safetensors.Tensor) []safetensors.Tensor {
				return append(ts, safetensors.F32Tensor("model.layers.0.self_attn.q_proj.bias", []int{64}, make([]float32, 64)))
			})
			return []string{p, `"model.layers.0.self_attn.q_proj.bias"`, "not a parameter"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, tc.src)
			want := tc.edit(t, dir)
			if err := backend.Upload(be, s, dst, sentinel); err != nil {
				t.Fatal(err)
			}
			c, err := Open(dir)
			if err == nil {
				err = c.Load(be, s, dst, layout, LoadOptions{})
				c.Close()
			}
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			got, _ := backend.Download(be, s, dst)
			if !same(got, sentinel) {
				t.Error("the destination changed")
			}
		})
	}
}

// TestGoodVariants: what a real checkpoint may hold loads: the rotary
// inverse frequencies of older transformers, and the Hugging Face cache's
// layout (snapshot files linking to ../../blobs).
func TestGoodVariants(t *testing.T) {
	cfg := readLlamaConfig(t, fixture)
	layout := llamaLayout(cfg)
	want := expected(t, filepath.Join(fixture, SingleFile), layout, roundBF16)

	dir := copyDir(t, fixtureSharded)
	p := filepath.Join(dir, shardNames[0])
	editTensors(t, p, func(ts []safetensors.Tensor) []safetensors.Tensor {
		return append(ts, safetensors.F32Tensor("model.layers.0.self_attn.rotary_emb.inv_freq", []int{8}, make([]float32, 8)))
	})
	editIndex(t, dir, func(wm map[string]string) { wm["model.layers.0.self_attn.rotary_emb.inv_freq"] = shardNames[0] })
	load := func(dir string) {
		t.Helper()
		c, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		got, err := c.LoadFloat32(layout, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !same(got, want) {
			t.Fatalf("%s loads differently", dir)
		}
	}
	load(dir)

	root := filepath.Join(t.TempDir(), "models--org--tiny")
	snap := filepath.Join(root, "snapshots", "0123abc")
	blobs := filepath.Join(root, "blobs")
	for _, d := range []string{snap, blobs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range append(slices.Clone(shardNames), IndexFile) {
		b, err := os.ReadFile(filepath.Join(fixtureSharded, n))
		if err != nil {
			t.Fatal(err)
		}
		blob := string(rune('a'+i)) + "0f3"
		if err := os.WriteFile(filepath.Join(blobs, blob), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, n)); err != nil {
			t.Skip(err)
		}
	}
	load(snap)
	if _, err := WeightBytes(snap); err != nil {
		t.Error(err)
	}
}

// TestWeightBytesRefuses: WeightBytes checks shard paths as Open does, so
// a memory plan never counts a file outside the directory.
func TestWeightBytesRefuses(t *testing.T) {
	for _, tc := range []struct {
		shard, want string
	}{
		{"../" + shardNames[0], "leaves the model directory"},
		{"/etc/hostname", "leaves the model directory"},
		{"nothere.safetensors", "no such file"},
	} {
		dir := copyDir(t, fixtureSharded)
		editIndex(t, dir, func(wm map[string]string) { wm["model.norm.weight"] = tc.shard })
		_, err := WeightBytes(dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), filepath.Join(dir, IndexFile)) {
			t.Errorf("%s: %v", tc.shard, err)
		}
	}
}

// TestExportRefuses: a wrong value count, dtype or layout is refused
// before a file is written.
func TestExportRefuses(t *testing.T) {
	layout := []model.Param{{Name: "a", Shape: []int{2, 2}, Transposed: true}, {Name: "b", Shape: []int{3}, Offset: 4}}
	for _, tc := range []struct {
		vals   []float32
		layout []model.Param
		opt    ExportOptions
		want   string
	}{
		{make([]float32, 6), layout, ExportOptions{}, "6 values, the layout has 7"},
		{make([]float32, 7), layout, ExportOptions{DType: backend.I32}, "want F32 or BF16"},
		{make([]float32, 7), []model.Param{layout[0], {Name: "b", Shape: []int{3}, Offset: 5}}, ExportOptions{}, "b at offset 5, want 4"},
		{make([]float32, 3), []model.Param{{Name: "c", Shape: []int{3}, Transposed: true}}, ExportOptions{}, "transposed but has shape [3]"},
	} {
		dir := filepath.Join(t.TempDir(), "out")
		err := ExportFloat32(dir, tc.vals, tc.layout, tc.opt)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want %q", err, tc.want)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%q: the directory was created", tc.want)
		}
	}
}
