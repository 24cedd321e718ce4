package lora

import (
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/<family>/go-adapter/ with WriteAdapter")

// goAdapter is the adapter TestGoAdapter writes for a family: non-default
// targets (one a dotted suffix), an odd rank, alpha / r not a power of two
// and a dropout, A from NewAdapter and B seeded non-zero so the term shows
// in PEFT's logits.
func goAdapter(t *testing.T, family string) *Adapter {
	t.Helper()
	targets := map[string][]string{"gpt2": {"c_attn", "mlp.c_proj"}, "llama": {"q_proj", "v_proj", "down_proj"}}[family]
	ad, err := NewAdapter(fixtureIndex(t, family), Config{R: 3, Alpha: 5, Dropout: 0.05, Targets: targets}, 2026)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(2026, 0xb))
	for _, b := range ad.B {
		for j := range b {
			b[j] = float32((2*rng.Float64() - 1) * 0.1)
		}
	}
	return ad
}

// TestGoAdapter: testdata/<family>/go-adapter/ is what WriteAdapter writes
// today (with -update it is rewritten; then run
// `scripts/fixtures/peft_lora.py --go-adapter` to record PEFT's logits of
// it in go-adapter-logits.json), and go-adapter-logits.json was made from
// these very files.
func TestGoAdapter(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			ad := goAdapter(t, fam)
			committed := filepath.Join("testdata", fam, "go-adapter")
			if *update {
				if err := WriteAdapter(committed, ad, "train/lora/testdata/"+fam+"/base"); err != nil {
					t.Fatal(err)
				}
			}
			dir := t.TempDir()
			if err := WriteAdapter(dir, ad, "train/lora/testdata/"+fam+"/base"); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{ConfigFile, WeightsFile} {
				if !sameFile(t, filepath.Join(dir, name), filepath.Join(committed, name)) {
					t.Errorf("%s/%s differs from what WriteAdapter writes (go test -run TestGoAdapter -update, then peft_lora.py --go-adapter)", committed, name)
				}
			}
			back, err := ReadAdapter(committed, fixtureIndex(t, fam))
			if err != nil {
				t.Fatal(err)
			}
			if back.Cfg.Scale() != float32(5.0/3.0) {
				t.Errorf("scale %g", back.Cfg.Scale())
			}
			logits := readGoAdapterLogits(t, fam)
			if logits.ConfigSHA != sha(t, filepath.Join(committed, ConfigFile)) || logits.ModelSHA != sha(t, filepath.Join(committed, WeightsFile)) {
				t.Error("go-adapter-logits.json was made from other files: run peft_lora.py --go-adapter")
			}
			if len(logits.Shape) != 3 || len(logits.Logits) != logits.Shape[0]*logits.Shape[1]*logits.Shape[2] ||
				len(logits.InputIDs) != logits.InputShape[0]*logits.InputShape[1] {
				t.Errorf("logits %v (%d values), input_ids %v (%d)", logits.Shape, len(logits.Logits), logits.InputShape, len(logits.InputIDs))
			}
		})
	}
}

// goAdapterLogits is testdata/<family>/go-adapter-logits.json: PEFT's
// logits of input_ids with the adapter in go-adapter/, and the SHA-256 of
// that adapter's files it read (peft_lora.py --go-adapter).
type goAdapterLogits struct {
	ConfigSHA  string    `json:"adapter_config_sha256"`
	ModelSHA   string    `json:"adapter_model_sha256"`
	Shape      []int     `json:"logits_shape"`
	Logits     []float64 `json:"logits"`
	InputShape []int     `json:"input_ids_shape"`
	InputIDs   []int64   `json:"input_ids"`
}

func readGoAdapterLogits(t *testing.T, family string) goAdapterLogits {
	t.Helper()
	var g goAdapterLogits
	raw, err := os.ReadFile(filepath.Join("testdata", family, "go-adapter-logits.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// IDs32 is InputIDs as the model's int32 tokens.
func (g goAdapterLogits) IDs32() []int32 {
	ids := make([]int32, len(g.InputIDs))
	for i, x := range g.InputIDs {
		ids[i] = int32(x)
	}
	return ids
}

func sha(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
