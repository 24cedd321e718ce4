package gpt2

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// refInit is Init as it was before InitEach: the whole model filled in
// one slice, from one generator. InitEach must draw the same bits.
func refInit(cfg Config, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0x6770_7432))
	vals := make([]float32, cfg.NumParams())
	for _, p := range cfg.Layout() {
		v := vals[p.Offset : p.Offset+p.Len()]
		switch {
		case strings.HasSuffix(p.Name, "ln_1.weight"), strings.HasSuffix(p.Name, "ln_2.weight"), strings.HasSuffix(p.Name, "ln_f.weight"):
			for i := range v {
				v[i] = 1
			}
		case len(p.Shape) == 2:
			std := 0.02
			if strings.HasSuffix(p.Name, "c_proj.weight") {
				std /= math.Sqrt(2 * float64(cfg.L))
			}
			for i := range v {
				v[i] = float32(rng.NormFloat64() * std)
			}
		}
	}
	return vals
}

// TestInitEach: Init and InitEach give the bits of the whole-model
// initialisation, InitEach parameter by parameter in Layout order within
// model.InitBytes (modeltest.CheckInitEach), for a small config and gpt2.
func TestInitEach(t *testing.T) {
	small := Config{V: 257, MaxT: 16, C: 8, L: 2, NH: 2, Eps: 1e-5}
	gpt2, err := Preset("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{small, gpt2} {
		modeltest.CheckInitEach(t, c, 7, refInit(c, 7))
	}
}
