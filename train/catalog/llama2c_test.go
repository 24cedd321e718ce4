package catalog

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/llama2c"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// TestLlama2CExport: a llama2.c model resolves as a LLaMA, loads, and
// exports to a Hugging Face directory whose weights are the loaded ones
// bit for bit and whose tokenizer (a tokenizer.json written from the
// tokenizer.bin) encodes as the tokenizer.bin does.
func TestLlama2CExport(t *testing.T) {
	for _, name := range []string{"untied.bin", "tied.bin"} {
		path := filepath.Join("../testdata/llama2c", name)
		spec, src, err := Resolve(path)
		if err != nil {
			t.Fatal(err)
		}
		if src != path || spec.Family() != "llama" {
			t.Fatalf("Resolve(%s) = %s model, src %q", path, spec.Family(), src)
		}
		vals, err := LoadWeights(spec, src)
		if err != nil {
			t.Fatal(err)
		}
		_, want, err := llama2c.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(vals, want) {
			t.Fatal("LoadWeights differs from llama2c.Load")
		}
		tok, err := Tokenizer(spec, src, "")
		if err != nil {
			t.Fatal(err)
		}
		dir := exportTo(t, spec, vals, src, tok)
		spec2, vals2, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !Equal(spec, spec2) {
			t.Errorf("%s: exported config %+v, loaded %+v", name, spec2, spec)
		}
		if len(vals2) != len(vals) {
			t.Fatalf("%s: exported %d values, loaded %d", name, len(vals2), len(vals))
		}
		for i := range vals {
			if math.Float32bits(vals[i]) != math.Float32bits(vals2[i]) {
				t.Fatalf("%s: exported value %d = %v, loaded %v", name, i, vals2[i], vals[i])
			}
		}
		tok2, err := Tokenizer(spec2, dir, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
			t.Errorf("the export has no tokenizer.json: %v", err)
		}
		for _, s := range []string{"the cat said hello", "Thé! 🙂 new  day\n"} {
			a := append(tokenizer.Prefix(tok), tok.Encode(s)...)
			b := append(tokenizer.Prefix(tok2), tok2.Encode(s)...)
			if !slices.Equal(a, b) {
				t.Errorf("%q: exported tokenizer gives %v, tokenizer.bin %v", s, b, a)
			}
		}
	}
}

// TestLlama2CLoadInto: LoadInto from a llama2.c file writes LoadWeights'
// values into the tensor; a file whose last tensor holds a NaN is
// refused, naming the file and the tensor, and writes nothing.
func TestLlama2CLoadInto(t *testing.T) {
	path := filepath.Join("../testdata/llama2c", "untied.bin")
	spec, src, err := Resolve(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := LoadWeights(spec, src)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(cpu.Config{})
	s := be.DefaultStream()
	dst, err := be.Alloc("params", spec.NumParams(), backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	if err := LoadInto(spec, src, be, s, dst); err != nil {
		t.Fatal(err)
	}
	got, err := backend.Download(be, s, dst)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Error("LoadInto differs from LoadWeights")
	}

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(raw[len(raw)-4:], math.Float32bits(float32(math.NaN())))
	bad := filepath.Join(t.TempDir(), "bad.bin")
	if err := os.WriteFile(bad, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	zero, err := be.Alloc("params", spec.NumParams(), backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	err = LoadInto(spec, bad, be, s, zero)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "wcls") {
		t.Errorf("LoadInto of a NaN in the last tensor: %v, want an error naming %s and wcls", err, bad)
	}
	after, err := backend.Download(be, s, zero)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(after, func(x float32) bool { return x != 0 }) {
		t.Error("a refused file wrote to the destination")
	}
}
