package llama2c

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model"
)

const dir = "../testdata/llama2c"

type reference struct {
	Models map[string]struct {
		File     string `json:"file"`
		Header   map[string]int32
		InputIDs []int32 `json:"input_ids"`
		Shape    []int   `json:"logits_shape"`
		Logits   string  `json:"logits_f32le_base64"`
	} `json:"models"`
}

func readReference(t *testing.T) reference {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

func floats(t *testing.T, b64 string) []float32 {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	f := make([]float32, len(b)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return f
}

// TestLogitsMatchTransformers: a .bin model loaded into train/llama gives
// the logits transformers computes with the same weights (the HF twin the
// fixture script wrote the .bin from), tied and untied, with grouped and
// plain attention: the header, the tensor order, the transposes and the
// RoPE permutation are all right.
func TestLogitsMatchTransformers(t *testing.T) {
	ref := readReference(t)
	for name, m := range ref.Models {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, m.File)
			h, err := ReadHeader(path)
			if err != nil {
				t.Fatal(err)
			}
			want := Header{m.Header["dim"], m.Header["hidden_dim"], m.Header["n_layers"], m.Header["n_heads"],
				m.Header["n_kv_heads"], m.Header["vocab_size"], m.Header["seq_len"]}
			if h != want {
				t.Fatalf("header %+v, want %+v", h, want)
			}
			if !IsModel(path) {
				t.Fatal("IsModel = false")
			}
			c, vals, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if c.Tied != (h.Vocab > 0) || c.KVHeads != int(h.KVHeads) {
				t.Fatalf("config %+v from header %+v", c, h)
			}
			T := len(m.InputIDs)
			be := cpu.New(cpu.Config{})
			mm, err := llama.New(be, c, 1, T, backend.F32, model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer mm.Free()
			s := be.DefaultStream()
			if err := backend.Upload(be, s, mm.Params, vals); err != nil {
				t.Fatal(err)
			}
			if err := backend.UploadInt32(be, s, mm.Inputs, m.InputIDs); err != nil {
				t.Fatal(err)
			}
			if err := mm.Forward(s); err != nil {
				t.Fatal(err)
			}
			got, err := backend.Download(be, s, mm.Logits)
			if err != nil {
				t.Fatal(err)
			}
			wantLogits := floats(t, m.Logits)
			if len(got) != len(wantLogits) {
				t.Fatalf("%d logits, want %d", len(got), len(wantLogits))
			}
			worst := 0.0
			for i := range got {
				worst = max(worst, math.Abs(float64(got[i]-wantLogits[i])))
			}
			t.Logf("max abs logit difference %.3g", worst)
			if worst > 1e-4 {
				t.Errorf("max |logit - transformers'| = %.3g > 1e-4", worst)
			}
		})
	}
}

// TestRowPerm: the permutation is the inverse of export.py's
// permute_reverse (view(heads, 2, hs/2, in).transpose(1, 2)): HF row
// h*hs + half*hs/2 + i was written as row h*hs + 2i + half.
func TestRowPerm(t *testing.T) {
	const heads, hs = 3, 8
	seen := map[int]bool{}
	for h := range heads {
		for half := range 2 {
			for i := range hs / 2 {
				hf := h*hs + half*hs/2 + i
				meta := h*hs + 2*i + half
				if got := rowPerm(meta, hs); got != hf {
					t.Errorf("rowPerm(%d) = %d, want %d", meta, got, hf)
				}
				seen[rowPerm(meta, hs)] = true
			}
		}
	}
	if len(seen) != heads*hs {
		t.Errorf("not a permutation: %d rows hit of %d", len(seen), heads*hs)
	}
}

// TestBadFiles: a wrong size, a v1 export, a NaN weight and a bad header
// are errors naming the file and what is wrong.
func TestBadFiles(t *testing.T) {
	good, err := os.ReadFile(filepath.Join(dir, "untied.bin"))
	if err != nil {
		t.Fatal(err)
	}
	nan := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(nan[headerBytes+4*5:], math.Float32bits(float32(math.NaN())))
	v1 := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(v1[0:], magic)
	binary.LittleEndian.PutUint32(v1[4:], 1)
	heads := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(heads[16:], 3) // n_kv_heads 3 does not divide 4
	for _, c := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"short", good[:len(good)-4], "bytes, but the header"},
		{"long", append(append([]byte(nil), good...), 0, 0, 0, 0), "bytes, but the header"},
		{"nan", nan, "token_embedding_table: element 5 is NaN"},
		{"v1", v1, "version 1 export"},
		{"kv heads", heads, "num_key_value_heads=3"},
		{"header", good[:10], "header"},
	} {
		p := filepath.Join(t.TempDir(), "m.bin")
		if err := os.WriteFile(p, c.raw, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := Load(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v, want one naming %s and %q", c.name, err, p, c.want)
		}
		if IsModel(p) && c.name != "nan" {
			t.Errorf("%s: IsModel = true", c.name)
		}
	}
}

// FuzzLoad: any file is refused with an error naming it or loads as a
// model of its header's size; nothing panics, and nothing is allocated
// beyond what the file's own size allows (the header must match it).
func FuzzLoad(f *testing.F) {
	good, err := os.ReadFile(filepath.Join(dir, "tied.bin"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:headerBytes])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		p := filepath.Join(t.TempDir(), "m.bin")
		if err := os.WriteFile(p, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		c, vals, err := Load(p)
		if err != nil {
			if !strings.Contains(err.Error(), p) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if len(vals) != c.NumParams() || int64(len(raw)) != headerBytes+4*fileFloats(c) {
			t.Fatalf("loaded %d values for %d params from %d bytes", len(vals), c.NumParams(), len(raw))
		}
	})
}
