// Fuzzing of the shard index (model.safetensors.index.json), the one file
// of a Hugging Face directory whose content names other files: every index
// either opens, every tensor it lists then found in a shard inside the
// directory, or is refused with an error naming the index; and a shard
// path never leads out of the directory, whatever the JSON says. The seeds
// run in every `go test`; `make fuzz` mutates them.

package hf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/internal/alloc"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// fuzzShards writes the directory every FuzzIndex input is tried in: two
// small shards (a.safetensors: x, y; sub/b.safetensors: z), a file
// outside it (../out.safetensors, holding x) and a link to it
// (link.safetensors), so that escaping indexes have something to find.
func fuzzShards(tb testing.TB) string {
	root := tb.TempDir()
	dir := filepath.Join(root, "model")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		tb.Fatal(err)
	}
	write := func(path string, ts ...safetensors.Tensor) {
		if err := safetensors.Write(path, ts, map[string]string{"format": "pt"}); err != nil {
			tb.Fatal(err)
		}
	}
	x := safetensors.F32Tensor("x", []int{2}, []float32{1, 2})
	write(filepath.Join(dir, "a.safetensors"), x, safetensors.BF16Tensor("y", []int{1}, []uint16{0x3f80}))
	write(filepath.Join(dir, "sub", "b.safetensors"), safetensors.F32Tensor("z", []int{1}, []float32{3}))
	out := filepath.Join(root, "out.safetensors")
	write(out, x)
	if err := os.Symlink(out, filepath.Join(dir, "link.safetensors")); err != nil {
		tb.Skip(err)
	}
	return dir
}

func FuzzIndex(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"total_size":14},"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"sub/b.safetensors"}}`,
		`{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"sub/./b.safetensors"}}`,
		`{"weight_map":{"x":"a.safetensors","y":"a.safetensors"}}`,
		`{"weight_map":{"x":"../out.safetensors"}}`,
		`{"weight_map":{"x":"link.safetensors"}}`,
		`{"weight_map":{"x":"/etc/passwd"}}`,
		`{"weight_map":{"x":"sub/../../model/a.safetensors","y":"a.safetensors","z":"sub/b.safetensors"}}`,
		`{"weight_map":{"x":"missing.safetensors"}}`,
		`{"weight_map":{"x":"sub/b.safetensors","y":"a.safetensors","z":"sub/b.safetensors"}}`,
		`{"weight_map":{"x":""}}`,
		`{"weight_map":{"":"a.safetensors"}}`,
		`{"weight_map":{}}`,
		`{"weight_map":null}`,
		`{"weight_map":[1]}`,
		`{"weight_map":{"x":1}}`,
		`{"metadata":{}}`,
		`{"weight_map":{"x":"a.safetensors"}} {}`,
		`{"weight_map":{"x":"a.safetensors"`,
		`[]`,
		`null`,
		``,
		`{"weight_map":{"x":"a.safetensors","x":"sub/b.safetensors"}}`,
		"{\"weight_map\":{\"x\":\"a.safetensors\\u0000\"}}",
		`{"weight_map":{"x":"."}}`,
		`{"weight_map":{"x":"sub"}}`,
	} {
		f.Add([]byte(s))
	}
	// The PyTorch-written index of the sharded fixture (its shards are
	// not in the fuzz directory: every name is then a missing shard).
	if b, err := os.ReadFile(filepath.Join(fixtureSharded, IndexFile)); err == nil {
		f.Add(b)
	}
	dir := fuzzShards(f)
	f.Fuzz(func(t *testing.T, index []byte) { checkIndexInput(t, dir, index) })
}

// checkIndexInput is FuzzIndex's property for one index.
func checkIndexInput(t *testing.T, dir string, index []byte) {
	path := filepath.Join(dir, IndexFile)
	if err := os.WriteFile(path, index, 0o644); err != nil {
		t.Fatal(err)
	}
	var c *Checkpoint
	var err error
	used := alloc.Bytes(func() { c, err = Open(dir) })
	if limit := 64*uint64(len(index)) + 1<<20; used > limit {
		t.Fatalf("a %d-byte index allocated %d bytes (limit %d); err = %v", len(index), used, limit, err)
	}
	wm, perr := ParseIndex(index)
	if err != nil {
		if !strings.Contains(err.Error(), path) {
			t.Fatalf("error %q does not name %s", err, path)
		}
		if _, werr := WeightBytes(dir); perr != nil && werr == nil {
			t.Fatalf("WeightBytes accepts an index ParseIndex refuses (%v)", perr)
		}
		return
	}
	defer c.Close()
	if perr != nil {
		t.Fatalf("Open accepted an index ParseIndex refuses: %v", perr)
	}
	if c.Index != path || len(c.Names()) != len(wm) {
		t.Fatalf("opened %d tensors of %d listed (index %q)", len(c.Names()), len(wm), c.Index)
	}
	var total int64
	realDir, _ := filepath.EvalSymlinks(dir)
	for _, f := range c.Files() {
		real, err := filepath.EvalSymlinks(f)
		if err != nil || !within(realDir, real) {
			t.Fatalf("opened %s (%s), outside %s", f, real, realDir)
		}
		st, _ := os.Stat(f)
		total += st.Size()
	}
	for name, shard := range wm {
		if _, file, ok := c.Info(name); !ok || file != filepath.Join(dir, shard) {
			t.Fatalf("tensor %q listed in %q found in %q", name, shard, file)
		}
	}
	if wb, err := WeightBytes(dir); err != nil || wb != total {
		t.Fatalf("WeightBytes %d, %v; the opened shards hold %d", wb, err, total)
	}
}
