// Fuzzing of the Hugging Face GPT-2 directory reader (config.json and
// model.safetensors): every input either loads and round-trips through
// ExportHF, or is refused with an error that names the directory's file;
// and whatever config.json claims, loading allocates no more than a small
// multiple of the two files' real sizes. The seeds (below and in
// testdata/fuzz/FuzzXxx) run in every `go test`; `make fuzz` mutates them.
//
// Paths: a GPT-2 directory has fixed file names (config.json,
// model.safetensors) and no index, so no path in a file can lead out of the
// directory. The files themselves may be symbolic links, and must stay
// loadable: Hugging Face's own cache stores snapshots/<rev>/model.safetensors
// as a link to ../../blobs/<sha256>, so refusing links (or links that leave
// the directory) would refuse every model downloaded with transformers.
// TestHFCacheLayout checks that such a directory loads.

package gpt2

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/internal/alloc"

	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// Allocation bound for loading: allocSlack bytes plus allocPerByte per byte
// of config.json and model.safetensors together. The weights file is read
// once, each tensor widened to float32 once (at most 2x for BF16/F16), and
// the parameters are allocated once; the layout adds a few hundred bytes per
// tensor, and every tensor costs at least that much header.
const (
	allocSlack   = 1 << 20
	allocPerByte = 64
)

// fuzzCfg is the model of the generated seeds: small enough that the fuzzer
// mutates a few kilobytes.
var fuzzCfg = Config{V: 5, MaxT: 3, C: 2, L: 1, NH: 1, Eps: 1e-5}

// seedDir exports fuzzCfg with deterministic weights, then lets edit change
// the tensors (nil: unchanged), and returns the two files' bytes.
func seedDir(tb testing.TB, cfg Config, edit func([]safetensors.Tensor) []safetensors.Tensor) (config, weights []byte) {
	dir := tb.TempDir()
	vals := make([]float32, fuzzCfg.NumParams())
	for i := range vals {
		vals[i] = float32(i%17) / 16
	}
	if err := ExportHF(dir, fuzzCfg, vals); err != nil {
		tb.Fatal(err)
	}
	if cfg != fuzzCfg {
		if err := writeHFConfig(dir, cfg); err != nil {
			tb.Fatal(err)
		}
	}
	if edit != nil {
		var ts []safetensors.Tensor
		for _, p := range fuzzCfg.Layout() {
			ts = append(ts, safetensors.F32Tensor(p.Name, p.Shape, vals[p.Offset:p.Offset+p.Len()]))
		}
		if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), edit(ts), nil); err != nil {
			tb.Fatal(err)
		}
	}
	return readDir(tb, dir)
}

func readDir(tb testing.TB, dir string) (config, weights []byte) {
	config, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	weights, err = os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		tb.Fatal(err)
	}
	return config, weights
}

// toBF16 rewrites every tensor as BF16 (truncating), as some hub files are.
func toBF16(ts []safetensors.Tensor) []safetensors.Tensor {
	for i, t := range ts {
		v := make([]uint16, len(t.Data)/4)
		for j := range v {
			v[j] = uint16(binary.LittleEndian.Uint32(t.Data[4*j:]) >> 16)
		}
		ts[i] = safetensors.BF16Tensor(t.Name, t.Shape, v)
	}
	return ts
}

// hfConfigSeeds are config.json files: the real one written by transformers
// and broken or hostile variants.
func hfConfigSeeds(tb testing.TB) [][]byte {
	real, err := os.ReadFile(filepath.Join(fixtureDir, "config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	seeds := [][]byte{real}
	for _, s := range []string{
		``,
		`{}`,
		`[]`,
		`{"model_type":"llama","vocab_size":5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1}`,
		`{"vocab_size":5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1}`,
		`{"vocab_size":5,"n_positions":3,"n_embd":3,"n_layer":1,"n_head":2}`,
		`{"vocab_size":5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1,"n_inner":7}`,
		`{"vocab_size":5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1,"activation_function":"relu"}`,
		`{"vocab_size":5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1,"tie_word_embeddings":false}`,
		`{"vocab_size":5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1,"layer_norm_epsilon":-1}`,
		`{"vocab_size":-5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1}`,
		`{"vocab_size":5.5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1}`,
		`{"vocab_size":"5","n_positions":3,"n_embd":2,"n_layer":1,"n_head":1}`,
		`{"vocab_size":99999999999999999999,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1}`,
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

func FuzzHFConfig(f *testing.F) {
	for _, s := range hfConfigSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(checkHFConfig)
}

// sparseWeights makes dir/model.safetensors a 1 GiB file of holes (no
// disk used): ReadHFConfig judges a config against the weights file's size,
// and this one can hold any config of up to half a billion parameters.
func sparseWeights(t *testing.T, dir string) {
	p := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 1<<30); err != nil {
		t.Fatal(err)
	}
}

// checkHFConfig is FuzzHFConfig's property: ReadHFConfig refuses config
// naming the file, or returns a valid Config that writeHFConfig and
// ReadHFConfig carry over unchanged.
func checkHFConfig(t *testing.T, config []byte) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	if err := os.WriteFile(path, config, 0o644); err != nil {
		t.Fatal(err)
	}
	sparseWeights(t, dir)
	var cfg Config
	var err error
	used := alloc.Bytes(func() { cfg, err = ReadHFConfig(dir) })
	if limit := allocPerByte*uint64(len(config)) + allocSlack; used > limit {
		t.Fatalf("a %d-byte config.json allocated %d bytes (limit %d); err = %v", len(config), used, limit, err)
	}
	if err != nil {
		if !strings.Contains(err.Error(), path) {
			t.Fatalf("error %q does not name %s", err, path)
		}
		return
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("ReadHFConfig accepted an invalid config %+v: %v", cfg, err)
	}
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	sparseWeights(t, out)
	if err := writeHFConfig(out, cfg); err != nil {
		t.Fatalf("writing back config %+v: %v", cfg, err)
	}
	again, err := ReadHFConfig(out)
	if err != nil || again != cfg {
		t.Fatalf("config %+v read back as %+v (err %v)", cfg, again, err)
	}
}

func FuzzLoadHF(f *testing.F) {
	add := func(config, weights []byte) { f.Add(config, weights) }
	add(seedDir(f, fuzzCfg, nil))
	add(seedDir(f, fuzzCfg, toBF16))
	// The original hub files use bare names (no "transformer." prefix).
	add(seedDir(f, fuzzCfg, func(ts []safetensors.Tensor) []safetensors.Tensor {
		for i := range ts {
			ts[i].Name = strings.TrimPrefix(ts[i].Name, "transformer.")
		}
		return ts
	}))
	withHead := func(same bool) func([]safetensors.Tensor) []safetensors.Tensor {
		return func(ts []safetensors.Tensor) []safetensors.Tensor {
			head := ts[0]
			head.Name = "lm_head.weight"
			if !same {
				head.Data = slices.Clone(head.Data)
				head.Data[0] ^= 1
			}
			return append(ts, head)
		}
	}
	add(seedDir(f, fuzzCfg, withHead(true)))
	add(seedDir(f, fuzzCfg, withHead(false)))
	add(seedDir(f, fuzzCfg, func(ts []safetensors.Tensor) []safetensors.Tensor { return ts[1:] }))
	add(seedDir(f, fuzzCfg, func(ts []safetensors.Tensor) []safetensors.Tensor {
		ts[2].Shape = []int{ts[2].Shape[0] / 2, 2}
		return ts
	}))
	add(seedDir(f, fuzzCfg, func(ts []safetensors.Tensor) []safetensors.Tensor {
		ts[0] = safetensors.I64Tensor(ts[0].Name, ts[0].Shape, make([]int64, 10))
		return ts
	}))
	c := fuzzCfg
	c.L = 2
	add(seedDir(f, c, nil))
	for _, s := range hfConfigSeeds(f) {
		_, w := seedDir(f, fuzzCfg, nil)
		f.Add(s, w)
	}
	f.Fuzz(checkLoadHF)
}

// TestLoadHFProperties runs FuzzLoadHF's checks on the transformers-written
// fixture (too large a seed for the fuzzer to mutate quickly).
func TestLoadHFProperties(t *testing.T) {
	config, weights := readDir(t, fixtureDir)
	checkLoadHF(t, config, weights)
}

// checkLoadHF is FuzzLoadHF's property: LoadHF refuses the directory with
// an error naming one of its files, or loads it, and ExportHF then LoadHF
// gives the same config and the same parameter bits.
func checkLoadHF(t *testing.T, config, weights []byte) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), weights, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg Config
	var vals []float32
	var err error
	used := alloc.Bytes(func() { cfg, vals, err = LoadHF(dir) })
	size := uint64(len(config) + len(weights))
	if limit := allocPerByte*size + allocSlack; used > limit {
		t.Fatalf("a %d-byte directory allocated %d bytes (limit %d); err = %v", size, used, limit, err)
	}
	if err != nil {
		if !strings.Contains(err.Error(), filepath.Join(dir, "config.json")) &&
			!strings.Contains(err.Error(), filepath.Join(dir, "model.safetensors")) {
			t.Fatalf("error %q names neither file of %s", err, dir)
		}
		return
	}
	if len(vals) != cfg.NumParams() {
		t.Fatalf("%d values for a config of %d parameters", len(vals), cfg.NumParams())
	}
	out := filepath.Join(dir, "export")
	if err := ExportHF(out, cfg, vals); err != nil {
		t.Fatalf("exporting a model that loaded: %v", err)
	}
	cfg2, vals2, err := LoadHF(out)
	if err != nil {
		t.Fatalf("loading the export back: %v", err)
	}
	if cfg2 != cfg || !slices.EqualFunc(vals, vals2, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
		t.Fatalf("the round trip changed the model (config %+v, now %+v)", cfg, cfg2)
	}
}

// TestHFCacheLayout loads a directory laid out as Hugging Face's cache:
// snapshots/<rev>/{config.json,model.safetensors} are symbolic links to
// ../../blobs/<hash>, outside the snapshot directory. Such links must keep
// working (see the file comment).
func TestHFCacheLayout(t *testing.T) {
	config, weights := readDir(t, fixtureDir)
	root := t.TempDir()
	blobs := filepath.Join(root, "blobs")
	snap := filepath.Join(root, "snapshots", "0123abc")
	for _, d := range []string{blobs, snap} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, b := range map[string][]byte{"config.json": config, "model.safetensors": weights} {
		blob := name + ".blob"
		if err := os.WriteFile(filepath.Join(blobs, blob), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, name)); err != nil {
			t.Skipf("no symbolic links here: %v", err)
		}
	}
	cfg, vals, err := LoadHF(snap)
	if err != nil {
		t.Fatal(err)
	}
	want, wantVals, err := LoadHF(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != want || !slices.Equal(vals, wantVals) {
		t.Fatal("the linked directory loads differently from the fixture")
	}
}

// layer_norm_epsilon that float32 cannot hold is refused rather than
// replaced (1e-50 used to become the default 1e-5, 1e300 became +Inf and
// broke the export: FuzzHFConfig); a missing or null one is GPT-2's 1e-5.
func TestHFConfigEpsilon(t *testing.T) {
	base := `{"vocab_size":5,"n_positions":3,"n_embd":2,"n_layer":1,"n_head":1`
	for _, tc := range []struct {
		extra, want string
		eps         float32
	}{
		{``, "", 1e-5},
		{`,"layer_norm_epsilon":null`, "", 1e-5},
		{`,"layer_norm_epsilon":1e-6`, "", 1e-6},
		{`,"layer_norm_epsilon":1e300`, "outside float32's range", 0},
		{`,"layer_norm_epsilon":1e-50`, "outside float32's range", 0},
		{`,"layer_norm_epsilon":0`, "must be positive", 0},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(base+tc.extra+"}"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, w := seedDir(t, fuzzCfg, nil)
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), w, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := ReadHFConfig(dir)
		switch {
		case tc.want == "" && (err != nil || cfg.Eps != tc.eps):
			t.Errorf("%s: eps %g, err %v; want %g", tc.extra, cfg.Eps, err, tc.eps)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err %v, want %q", tc.extra, err, tc.want)
		}
	}
}

// A config.json claiming a huge model next to a small weights file is
// refused before anything of the claimed size is allocated: by the file's
// size (n_embd = 1e12 overflows, n_layer = 1e9 needs terabytes), or by its
// tensor count (n_layer = 2000 in a file of the right size but one tensor,
// which would otherwise build a 24000-entry layout first).
func TestHugeConfigRefusedBeforeAllocation(t *testing.T) {
	_, tiny := seedDir(t, fuzzCfg, nil)
	big := filepath.Join(t.TempDir(), "big.safetensors")
	if err := safetensors.Write(big, []safetensors.Tensor{{Name: "blob", DType: safetensors.U8, Shape: []int{1 << 17}, Data: make([]byte, 1<<17)}}, nil); err != nil {
		t.Fatal(err)
	}
	oneTensor, err := os.ReadFile(big)
	if err != nil {
		t.Fatal(err)
	}
	base := `{"vocab_size":%d,"n_positions":3,"n_embd":%d,"n_layer":%d,"n_head":1}`
	for _, tc := range []struct {
		config  string
		weights []byte
		want    string
	}{
		{fmt.Sprintf(base, 5, 1000000000000, 1), tiny, "overflows"},
		{fmt.Sprintf(base, 5, 2, 1000000000), tiny, "holds"},
		{fmt.Sprintf(base, math.MaxInt, 2, 1), tiny, "overflows"},
		{fmt.Sprintf(base, 5, 1000000, 1), tiny, "holds"},
		{fmt.Sprintf(base, 1, 1, 2000), oneTensor, "too few for n_layer=2000"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tc.config), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), tc.weights, 0o644); err != nil {
			t.Fatal(err)
		}
		var err error
		used := alloc.Bytes(func() { _, _, err = LoadHF(dir) })
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: err = %v, want one naming %s and saying %q", tc.config, err, dir, tc.want)
		}
		if limit := 4*uint64(len(tc.weights)) + allocSlack; used > limit {
			t.Errorf("%s: refusing it allocated %d bytes (limit %d)", tc.config, used, limit)
		}
	}
}

// paramCount agrees with the layout wherever the layout can be built.
func TestParamCount(t *testing.T) {
	cfgs := []Config{fuzzCfg, {V: 1, MaxT: 1, C: 1, L: 3, NH: 1, Eps: 1}}
	for _, name := range Presets() {
		c, _ := Preset(name)
		cfgs = append(cfgs, c)
	}
	for _, c := range cfgs {
		if n, ok := paramCount(c); !ok || n != c.NumParams() {
			t.Errorf("%+v: paramCount %d %v, NumParams %d", c, n, ok, c.NumParams())
		}
	}
}
