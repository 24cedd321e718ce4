package gpt2

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model"
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

// TestInitEach: Init and InitEach's values, gathered in the order they
// come, are the bits of the whole-model initialisation; InitEach hands
// the parameters in Layout order in a buffer of model.InitBytes, and
// stops at fn's error.
func TestInitEach(t *testing.T) {
	small := Config{V: 257, MaxT: 16, C: 8, L: 2, NH: 2, Eps: 1e-5}
	gpt2, err := Preset("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{small, gpt2} {
		want := refInit(c, 7)
		if got := c.Init(7); !slices.Equal(bits(got), bits(want)) {
			t.Errorf("%+v: Init differs from the whole-model initialisation", c)
		}
		var got []float32
		layout := c.Layout()
		k := 0
		err := c.InitEach(7, func(p model.Param, v []float32) error {
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
		if !slices.Equal(bits(got), bits(want)) {
			t.Errorf("%+v: InitEach's values differ from the whole-model initialisation", c)
		}
	}
	stop := errors.New("stop")
	n := 0
	if err := small.InitEach(1, func(model.Param, []float32) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("InitEach with a failing fn: %v after %d calls, want stop after 1", err, n)
	}
}

func bits(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, x := range v {
		b[i] = math.Float32bits(x)
	}
	return b
}
