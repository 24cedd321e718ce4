package catalog

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// llamaFixtures are the LLaMA family's PyTorch fixtures: LLaMA, and Qwen2
// (model_type qwen2: q, k and v biases).
var llamaFixtures = []string{"llama-tiny-gqa", "llama-tiny-rope3", "llama-tiny-tied", "qwen2-tiny-gqa", "qwen2-tiny-tied"}

func fixture(name string) string { return filepath.Join("..", "testdata", name) }

// TestResolveLLaMADirs: the fixtures' directories resolve to the LLaMA
// family, as llama.ReadHFConfig reads them, and their weights load by
// every route the run takes with the values the file holds.
func TestResolveLLaMADirs(t *testing.T) {
	for _, name := range llamaFixtures {
		t.Run(name, func(t *testing.T) {
			dir := fixture(name)
			spec, src, err := Resolve(dir)
			if err != nil {
				t.Fatal(err)
			}
			want, err := llama.ReadHFConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			if src != dir || spec.Family() != "llama" || !Equal(spec, want) {
				t.Fatalf("Resolve(%s) = %+v, %q; want %+v from %s", dir, spec, src, want, dir)
			}
			if n := ContextName(spec); n != "max_position_embeddings" {
				t.Errorf("ContextName = %q", n)
			}
			vals, err := LoadWeights(spec, dir)
			if err != nil {
				t.Fatal(err)
			}
			ck, err := hf.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			for _, p := range spec.Layout() {
				raw, shape, err := ck.Float32(p.Name)
				if err != nil {
					t.Fatal(err)
				}
				got := vals[p.Offset : p.Offset+p.Len()]
				if p.Transposed {
					raw = modeltest.Transpose(raw, shape[0], shape[1])
				}
				if !slices.Equal(got, raw) {
					t.Fatalf("%s: loaded values differ from the file's", p.Name)
				}
			}
			be := cpu.New(cpu.Config{Threads: 1})
			defer be.Close()
			for _, dt := range []backend.DType{backend.F32, backend.BF16} {
				dst, err := be.Alloc("params", spec.NumParams(), dt)
				if err != nil {
					t.Fatal(err)
				}
				if err := LoadInto(spec, dir, be, be.DefaultStream(), dst); err != nil {
					t.Fatal(err)
				}
				got, err := backend.Download(be, be.DefaultStream(), dst)
				if err != nil {
					t.Fatal(err)
				}
				for i, v := range vals {
					if dt == backend.BF16 {
						v = bf16.ToFloat32(bf16.FromFloat32(v))
					}
					if math.Float32bits(got[i]) != math.Float32bits(v) {
						t.Fatalf("%v: element %d loaded as %v, want %v", dt, i, got[i], v)
					}
				}
				be.Free(dst)
			}
		})
	}
}

// TestLLaMASharded: the bf16 shards of the gqa fixture, and the Qwen2
// fixtures' bf16 saves, load as their fp32 files rounded to bf16.
func TestLLaMASharded(t *testing.T) {
	for _, dir := range []string{"llama-tiny-gqa/bf16-sharded", "qwen2-tiny-gqa/bf16", "qwen2-tiny-tied/bf16"} {
		spec, vals, err := Load(fixture(filepath.Dir(dir)))
		if err != nil {
			t.Fatal(err)
		}
		sspec, svals, err := Load(fixture(dir))
		if err != nil {
			t.Fatal(err)
		}
		if !Equal(spec, sspec) {
			t.Fatalf("%s reads as %+v, the original as %+v", dir, sspec, spec)
		}
		for i, v := range vals {
			if want := bf16.ToFloat32(bf16.FromFloat32(v)); svals[i] != want {
				t.Fatalf("%s: element %d: %v, want %v", dir, i, svals[i], want)
			}
		}
	}
}

// TestLLaMAExportRoundTrip: an export reads back as the same spec and
// the same values, leaves a tied head out as save_pretrained does, and
// carries the source's tokenizer files.
func TestLLaMAExportRoundTrip(t *testing.T) {
	for _, name := range llamaFixtures {
		t.Run(name, func(t *testing.T) {
			spec, vals, err := Load(fixture(name))
			if err != nil {
				t.Fatal(err)
			}
			src := t.TempDir()
			tc := []byte(`{"model_max_length": 64}`)
			if err := os.WriteFile(filepath.Join(src, "tokenizer_config.json"), tc, 0o644); err != nil {
				t.Fatal(err)
			}
			out := exportTo(t, spec, vals, src, nil)
			spec2, vals2, err := Load(out)
			if err != nil {
				t.Fatal(err)
			}
			if !Equal(spec, spec2) || !slices.Equal(vals, vals2) {
				t.Fatalf("export of %s reads back as another model", name)
			}
			ck, err := hf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			_, _, hasHead := ck.Info("lm_head.weight")
			if tied := spec.(llama.Config).Tied; hasHead == tied {
				t.Errorf("tied %v, export has lm_head.weight: %v", tied, hasHead)
			}
			if got, err := os.ReadFile(filepath.Join(out, "tokenizer_config.json")); err != nil || string(got) != string(tc) {
				t.Errorf("tokenizer_config.json not carried along: %q, %v", got, err)
			}
		})
	}
}
