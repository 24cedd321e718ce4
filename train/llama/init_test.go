package llama

import (
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// refInit is Init as it was before InitEach: the whole model filled in
// one slice, from one generator. InitEach must draw the same bits.
func refInit(c Config, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0x6c6c_616d_61))
	vals := make([]float32, c.NumParams())
	std := c.initRange()
	for _, p := range c.Layout() {
		v := vals[p.Offset : p.Offset+p.Len()]
		if len(p.Shape) == 1 {
			for i := range v {
				v[i] = 1
			}
			continue
		}
		for i := range v {
			v[i] = float32(rng.NormFloat64() * std)
		}
	}
	return vals
}

// TestInitEach: Init and InitEach give the bits of the whole-model
// initialisation, InitEach parameter by parameter in Layout order within
// model.InitBytes (modeltest.CheckInitEach), for a tied and an untied
// model.
func TestInitEach(t *testing.T) {
	tiny, err := Preset("llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	tied := hookCfg
	tied.Tied = true
	for _, c := range []Config{hookCfg, tied, tiny} {
		modeltest.CheckInitEach(t, c, 3, refInit(c, 3))
	}
}
