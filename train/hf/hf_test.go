package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// The PyTorch-written tiny LLaMA (GQA: 4 heads, 2 kv heads): fp32 single
// file, bf16 in three shards with an index, fp16 single file.
const (
	fixture        = "../testdata/llama-tiny-gqa"
	fixtureSharded = fixture + "/bf16-sharded"
	fixtureF16     = fixture + "/fp16"
)

// llamaConfig is the part of a LLaMA config.json the layout needs.
type llamaConfig struct {
	Hidden    int  `json:"hidden_size"`
	Inter     int  `json:"intermediate_size"`
	Layers    int  `json:"num_hidden_layers"`
	Heads     int  `json:"num_attention_heads"`
	KVHeads   int  `json:"num_key_value_heads"`
	HeadDim   int  `json:"head_dim"`
	Vocab     int  `json:"vocab_size"`
	TiedEmbed bool `json:"tie_word_embeddings"`
}

func readLlamaConfig(t testing.TB, dir string) llamaConfig {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c llamaConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if c.HeadDim == 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	return c
}

// llamaLayout is written here by hand, independently of train/llama: the
// Hugging Face names, our in x out shapes, Linear weights transposed.
func llamaLayout(c llamaConfig) []model.Param {
	var ps []model.Param
	off := 0
	add := func(name string, layer int, transposed bool, shape ...int) {
		p := model.Param{Name: name, Shape: shape, Offset: off, Layer: layer, Transposed: transposed}
		ps = append(ps, p)
		off += p.Len()
	}
	C, q, kv := c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	add("model.embed_tokens.weight", -1, false, c.Vocab, C)
	for l := range c.Layers {
		pre := fmt.Sprintf("model.layers.%d.", l)
		add(pre+"input_layernorm.weight", l, false, C)
		add(pre+"self_attn.q_proj.weight", l, true, C, q)
		add(pre+"self_attn.k_proj.weight", l, true, C, kv)
		add(pre+"self_attn.v_proj.weight", l, true, C, kv)
		add(pre+"self_attn.o_proj.weight", l, true, q, C)
		add(pre+"post_attention_layernorm.weight", l, false, C)
		add(pre+"mlp.gate_proj.weight", l, true, C, c.Inter)
		add(pre+"mlp.up_proj.weight", l, true, C, c.Inter)
		add(pre+"mlp.down_proj.weight", l, true, c.Inter, C)
	}
	add("model.norm.weight", -1, false, C)
	add("lm_head.weight", -1, true, C, c.Vocab)
	return ps
}

var tiedHead = LoadOptions{Tied: map[string]string{"lm_head.weight": "model.embed_tokens.weight"}}

// expected builds the layout's values straight from a file's tensors
// (widened by package safetensors, transposed here element by element),
// each passed through round.
func expected(t testing.TB, path string, layout []model.Param, round func(float32) float32) []float32 {
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := layoutLen(layout)
	out := make([]float32, n)
	for _, p := range layout {
		v, shape, err := f.Float32(p.Name)
		if err != nil {
			t.Fatal(err)
		}
		dst := out[p.Offset : p.Offset+p.Len()]
		if p.Transposed {
			in, o := p.Shape[0], p.Shape[1]
			if !slices.Equal(shape, []int{o, in}) {
				t.Fatalf("%s: file shape %v", p.Name, shape)
			}
			for i := range in {
				for j := range o {
					dst[i*o+j] = round(v[j*in+i])
				}
			}
		} else {
			for i, x := range v {
				dst[i] = round(x)
			}
		}
	}
	return out
}

func same(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func roundBF16(x float32) float32 { return bf16.ToFloat32(bf16.FromFloat32(x)) }

// roundF16 rounds to the nearest binary16, ties to even (as torch's
// .half()), in float64 arithmetic; the fixture has no values beyond f16's
// range.
func roundF16(x float32) float32 {
	v := float64(x)
	if v == 0 {
		return x
	}
	_, e := math.Frexp(v) // v = m * 2^e, 0.5 <= |m| < 1
	q := math.Ldexp(1, e-11)
	if e-1 < -14 {
		q = math.Ldexp(1, -24) // subnormal spacing
	}
	return float32(math.RoundToEven(v/q) * q)
}

func identity(x float32) float32 { return x }

func newCPU(t testing.TB) (*cpu.Backend, backend.Stream) {
	be := cpu.New(cpu.Config{})
	t.Cleanup(func() { be.Close() })
	return be, be.DefaultStream()
}

// TestLoadFixtures: the fp32, sharded bf16 and fp16 copies of the same
// model load into the layout as the fp32 values, rounded as their dtype
// rounds them; on the CPU backend into F32 and BF16 tensors too.
func TestLoadFixtures(t *testing.T) {
	cfg := readLlamaConfig(t, fixture)
	layout := llamaLayout(cfg)
	fp32 := filepath.Join(fixture, SingleFile)
	for _, tc := range []struct {
		dir   string
		round func(float32) float32
	}{
		{fixture, identity},
		{fixtureSharded, roundBF16},
		{fixtureF16, roundF16},
	} {
		want := expected(t, fp32, layout, tc.round)
		c, err := Open(tc.dir)
		if err != nil {
			t.Fatal(err)
		}
		if tc.dir == fixtureSharded && (c.Index == "" || len(c.Files()) != 3) {
			t.Fatalf("%s: index %q, files %v", tc.dir, c.Index, c.Files())
		}
		got, err := c.LoadFloat32(layout, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !same(got, want) {
			t.Errorf("%s: LoadFloat32 differs from the fp32 source rounded", tc.dir)
		}
		be, s := newCPU(t)
		for _, dt := range []backend.DType{backend.F32, backend.BF16} {
			dst, err := be.Alloc("params", len(want), dt)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Load(be, s, dst, layout, LoadOptions{}); err != nil {
				t.Fatal(err)
			}
			back, err := backend.Download(be, s, dst)
			if err != nil {
				t.Fatal(err)
			}
			w := want
			if dt == backend.BF16 {
				w = make([]float32, len(want))
				for i, x := range want {
					w[i] = roundBF16(x)
				}
			}
			if !same(back, w) {
				t.Errorf("%s: Load into %v differs", tc.dir, dt)
			}
			be.Free(dst)
		}
		c.Close()
	}
}

// loadTied opens the tied LLaMA fixture (closed when the test ends) and
// loads its values with the head read from the embedding (tiedHead).
func loadTied(t *testing.T) (llamaConfig, []model.Param, *Checkpoint, []float32) {
	t.Helper()
	dir := "../testdata/llama-tiny-tied"
	cfg := readLlamaConfig(t, dir)
	layout := llamaLayout(cfg)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	vals, err := c.LoadFloat32(layout, tiedHead)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, layout, c, vals
}

// TestLoadTied: a checkpoint without lm_head.weight loads with the Tied
// option, the head read from the embedding; without it, the error names
// the missing tensor.
func TestLoadTied(t *testing.T) {
	cfg, layout, c, got := loadTied(t)
	emb, _, err := c.Float32("model.embed_tokens.weight")
	if err != nil {
		t.Fatal(err)
	}
	head := layout[len(layout)-1]
	V, C := cfg.Vocab, cfg.Hidden
	for i := range C {
		for j := range V {
			if got[head.Offset+i*V+j] != emb[j*C+i] {
				t.Fatalf("head[%d][%d] is not the embedding's [%d][%d]", i, j, j, i)
			}
		}
	}
	if _, err := c.LoadFloat32(layout, LoadOptions{}); err == nil || !strings.Contains(err.Error(), `"lm_head.weight" is missing`) {
		t.Errorf("untied load of a tied checkpoint: %v", err)
	}
}

// TestExportRoundTrip: exporting the fp32 fixture's values in fp32 gives
// its tensors back bit for bit (names, Hugging Face shapes, bytes); in
// bf16, sharded, the bf16 fixture's; and each export loads back to the
// same bits, from host values and from a device tensor.
func TestExportRoundTrip(t *testing.T) {
	cfg := readLlamaConfig(t, fixture)
	layout := llamaLayout(cfg)
	c, err := Open(fixture)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := c.LoadFloat32(layout, LoadOptions{})
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	be, s := newCPU(t)
	for _, tc := range []struct {
		dt     backend.DType
		shard  int64
		shards int
		ref    string // the fixture file(s) the export must equal tensor by tensor
	}{
		{backend.F32, 0, 1, fixture},
		{backend.F32, 200_000, 3, fixture},
		{backend.BF16, 0, 1, fixtureSharded},
		{backend.BF16, 100_000, 3, fixtureSharded},
	} {
		name := fmt.Sprintf("%v-shard%d", tc.dt, tc.shard)
		opt := ExportOptions{DType: tc.dt, ShardBytes: tc.shard}
		host := filepath.Join(t.TempDir(), "host")
		if err := ExportFloat32(host, vals, layout, opt); err != nil {
			t.Fatal(err)
		}
		dev := filepath.Join(t.TempDir(), "dev")
		src, err := be.Alloc("params", len(vals), tc.dt)
		if err != nil {
			t.Fatal(err)
		}
		if err := backend.Upload(be, s, src, vals); err != nil {
			t.Fatal(err)
		}
		if err := Export(dev, be, s, src, layout, opt); err != nil {
			t.Fatal(err)
		}
		sameFiles(t, host, dev)
		for _, out := range []string{host, dev} {
			got, err := Open(out)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(got.Files()); n != tc.shards || (n > 1) != (got.Index != "") {
				t.Errorf("%s: %d files, index %q; want %d", name, n, got.Index, tc.shards)
			}
			ref, err := Open(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Names(), ref.Names()) {
				t.Errorf("%s: tensors %v, the fixture has %v", name, got.Names(), ref.Names())
			}
			for _, n := range ref.Names() {
				a, _ := rawOf(t, got, n)
				b, _ := rawOf(t, ref, n)
				if string(a) != string(b) {
					t.Errorf("%s: tensor %s differs from the fixture's bytes", name, n)
				}
			}
			ref.Close()
			back, err := got.LoadFloat32(layout, LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := vals
			if tc.dt == backend.BF16 {
				want = expected(t, filepath.Join(fixture, SingleFile), layout, roundBF16)
			}
			if !same(back, want) {
				t.Errorf("%s: %s loads back differently", name, out)
			}
			dst, err := be.Alloc("back", len(vals), tc.dt)
			if err != nil {
				t.Fatal(err)
			}
			if err := got.Load(be, s, dst, layout, LoadOptions{}); err != nil {
				t.Fatal(err)
			}
			a, _ := backend.Download(be, s, dst)
			b, _ := backend.Download(be, s, src)
			if !same(a, b) {
				t.Errorf("%s: device round trip changed bits", name)
			}
			be.Free(dst)
			got.Close()
		}
		be.Free(src)
		if tc.shards > 1 {
			checkIndex(t, dev, int64(len(vals)*tc.dt.Size()))
		}
	}
}

// checkIndex checks the index as save_pretrained writes it: total_size and
// a weight_map naming model-0000i-of-0000N files.
func checkIndex(t *testing.T, dir string, total int64) {
	raw, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	var idx struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	if idx.Metadata["total_size"] != total {
		t.Errorf("total_size %d, want %d", idx.Metadata["total_size"], total)
	}
	for n, f := range idx.WeightMap {
		if !isShardName(f) || !strings.HasSuffix(f, "-of-00003.safetensors") {
			t.Errorf("%s in %q", n, f)
		}
	}
}

func rawOf(t testing.TB, c *Checkpoint, name string) ([]byte, safetensors.TensorInfo) {
	f := c.where[name]
	if f == nil {
		t.Fatalf("no %s", name)
	}
	b, ti, err := f.Raw(name)
	if err != nil {
		t.Fatal(err)
	}
	return b, ti
}

// TestExportReplacesStale: a single-file export over a sharded one (and the
// reverse) leaves only the new weights, so from_pretrained cannot pick up
// the old ones; tokenizer files are copied along.
func TestExportReplacesStale(t *testing.T) {
	layout := []model.Param{{Name: "a", Shape: []int{3, 2}}, {Name: "b", Shape: []int{4}, Offset: 6}}
	vals := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	dir := t.TempDir()
	if err := ExportFloat32(dir, vals, layout, ExportOptions{ShardBytes: 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model-00002-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
	if err := ExportFloat32(dir, vals, layout, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != SingleFile {
		t.Errorf("after a single-file export over a sharded one: %v", ents)
	}
	if err := ExportFloat32(dir, vals, layout, ExportOptions{ShardBytes: 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SingleFile)); !os.IsNotExist(err) {
		t.Errorf("model.safetensors left beside the new shards: %v", err)
	}
	src := t.TempDir()
	for _, n := range []string{"tokenizer.json", "merges.txt", "unrelated.bin"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := CopyTokenizerFiles(src, dir)
	if err != nil || !slices.Equal(got, []string{"tokenizer.json", "merges.txt"}) {
		t.Fatalf("copied %v, %v", got, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "merges.txt")); string(b) != "merges.txt" {
		t.Errorf("merges.txt holds %q", b)
	}
}

// TestWeightBytes counts the shards of an index, the single file otherwise.
func TestWeightBytes(t *testing.T) {
	for _, dir := range []string{fixture, fixtureSharded} {
		c, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		for _, f := range c.Files() {
			st, _ := os.Stat(f)
			want += st.Size()
		}
		c.Close()
		got, err := WeightBytes(dir)
		if err != nil || got != want {
			t.Errorf("%s: WeightBytes %d, %v; want %d", dir, got, err, want)
		}
	}
	if _, err := WeightBytes(t.TempDir()); err == nil {
		t.Error("WeightBytes of an empty directory")
	}
}

// binaryF32 is the little-endian encoding of v.
func binaryF32(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bf16Value(b uint16) float32 { return bf16.ToFloat32(b) }

// TestSmallChunks runs the loads and the export round trips with chunks
// and transposition blocks of a few elements, so that every boundary (a
// chunk ending mid-row, a block of one row, a last partial block) is
// crossed.
func TestSmallChunks(t *testing.T) {
	defer func(c, b int) { chunkElems, blockElems = c, b }(chunkElems, blockElems)
	sizes := [][2]int{{1, 1}, {5, 37}, {64, 64 * 3}, {1000, 100}}
	if testing.Short() { // one odd size: the race detector makes tiny chunks slow
		sizes = [][2]int{{7, 50}}
	}
	for _, sz := range sizes {
		chunkElems, blockElems = sz[0], sz[1]
		t.Run(fmt.Sprintf("chunk%d-block%d", sz[0], sz[1]), func(t *testing.T) {
			TestLoadFixtures(t)
			TestExportRoundTrip(t)
		})
		if t.Failed() {
			return
		}
	}
}

// TestExportTied: the tied fixture exported without its head (Skip) holds
// exactly the fixture's tensors, and loads back with Tied.
func TestExportTied(t *testing.T) {
	_, layout, c, vals := loadTied(t)
	be, s := newCPU(t)
	src, err := be.Alloc("params", len(vals), backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.Upload(be, s, src, vals); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	skip := func(p model.Param) bool { return p.Name == "lm_head.weight" }
	if err := Export(out, be, s, src, layout, ExportOptions{Skip: skip}); err != nil {
		t.Fatal(err)
	}
	got, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !slices.Equal(got.Names(), c.Names()) {
		t.Fatalf("exported %v, the fixture has %v", got.Names(), c.Names())
	}
	for _, n := range c.Names() {
		a, _ := rawOf(t, got, n)
		b, _ := rawOf(t, c, n)
		if string(a) != string(b) {
			t.Errorf("%s differs from the fixture", n)
		}
	}
	back, err := got.LoadFloat32(layout, tiedHead)
	if err != nil || !same(back, vals) {
		t.Fatalf("tied export loads back differently (%v)", err)
	}
}

// SameValues compares two tensors chunk by chunk, across dtypes (a bf16
// copy of fp32 values that bf16 holds exactly is the same), finds a
// difference in the last chunk, and refuses a tensor of another dtype
// naming it.
func TestSameValues(t *testing.T) {
	defer func(c int) { chunkElems = c }(chunkElems)
	chunkElems = 3
	v := []float32{1, 2, 3, 4, 5, 6, 7, 0.5}
	w := slices.Clone(v)
	w[7] = 0.25
	h := make([]uint16, len(v))
	bf16.FromFloat32Slice(h, v)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	ts := []safetensors.Tensor{safetensors.F32Tensor("a", []int{8}, v), safetensors.BF16Tensor("b", []int{8}, h),
		safetensors.F32Tensor("c", []int{8}, w), safetensors.I64Tensor("d", []int{8}, make([]int64, 8))}
	if err := safetensors.Write(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	c, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		a, b string
		want bool
	}{{"a", "b", true}, {"a", "c", false}, {"b", "c", false}} {
		if got, err := c.SameValues(tc.a, tc.b); err != nil || got != tc.want {
			t.Errorf("SameValues(%s, %s) = %v, %v; want %v", tc.a, tc.b, got, err, tc.want)
		}
	}
	if _, err := c.SameValues("a", "d"); err == nil || !strings.Contains(err.Error(), `"d"`) {
		t.Errorf("an I64 tensor: %v", err)
	}
}
