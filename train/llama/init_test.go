package llama

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model"
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

// TestInitEach: Init and InitEach's values, gathered in the order they
// come, are the bits of the whole-model initialisation, for a tied and
// an untied model; InitEach hands the parameters in Layout order in a
// buffer of model.InitBytes.
func TestInitEach(t *testing.T) {
	tiny, err := Preset("llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	tied := hookCfg
	tied.Tied = true
	for _, c := range []Config{hookCfg, tied, tiny} {
		want := refInit(c, 3)
		if got := c.Init(3); !slices.Equal(f32bits(got), f32bits(want)) {
			t.Errorf("%+v: Init differs from the whole-model initialisation", c)
		}
		var got []float32
		layout := c.Layout()
		k := 0
		err := c.InitEach(3, func(p model.Param, v []float32) error {
			if p.Name != layout[k].Name || len(v) != p.Len() || 4*int64(cap(v)) > model.InitBytes(c) {
				t.Fatalf("parameter %d: %s of %d values (cap %d), want %s of %d within %d bytes",
					k, p.Name, len(v), cap(v), layout[k].Name, layout[k].Len(), model.InitBytes(c))
			}
			k++
			got = append(got, v...)
			return nil
		})
		if err != nil || k != len(layout) {
			t.Fatalf("InitEach: %v after %d of %d parameters", err, k, len(layout))
		}
		if !slices.Equal(f32bits(got), f32bits(want)) {
			t.Errorf("%+v: InitEach's values differ from the whole-model initialisation", c)
		}
	}
}

func f32bits(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, x := range v {
		b[i] = math.Float32bits(x)
	}
	return b
}
