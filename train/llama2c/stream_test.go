package llama2c

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// refLoad is the whole-file reader Each replaced: every float of the
// file at once, each tensor then copied to its parameter, transposed and
// rows permuted where the layout says.
func refLoad(t *testing.T, path string) []float32 {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ReadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	f := make([]float32, (len(raw)-headerBytes)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[headerBytes+4*i:]))
	}
	layout := c.Layout()
	byName := map[string]model.Param{}
	for _, p := range layout {
		byName[p.Name] = p
	}
	vals := make([]float32, c.NumParams())
	pos := 0
	put := func(name string, perm bool) {
		p := byName[name]
		src := f[pos : pos+p.Len()]
		pos += p.Len()
		dst := vals[p.Offset : p.Offset+p.Len()]
		if !p.Transposed {
			copy(dst, src)
			return
		}
		in, out := p.Shape[0], p.Shape[1]
		for o := range out {
			to := o
			if perm {
				to = rowPerm(o, c.HS())
			}
			for k := range in {
				dst[k*out+to] = src[o*in+k]
			}
		}
	}
	put("model.embed_tokens.weight", false)
	for _, s := range []struct {
		hf   string
		perm bool
	}{{"input_layernorm.weight", false}, {"self_attn.q_proj.weight", true}, {"self_attn.k_proj.weight", true},
		{"self_attn.v_proj.weight", false}, {"self_attn.o_proj.weight", false}, {"post_attention_layernorm.weight", false},
		{"mlp.gate_proj.weight", false}, {"mlp.down_proj.weight", false}, {"mlp.up_proj.weight", false}} {
		for l := range c.NumLayers {
			put(fmt.Sprintf("model.layers.%d.%s", l, s.hf), s.perm)
		}
	}
	put("model.norm.weight", false)
	pos += c.MaxPos * c.HS()
	if !c.Tied {
		put("lm_head.weight", false)
	}
	return vals
}

// TestEach: Load, and Each's tensors placed by their parameters, are the
// whole-file reader's values bit for bit, whatever the read chunk (a
// few floats crosses every tensor's boundary); Each hands every
// parameter once, in a buffer within LoadBytes.
func TestEach(t *testing.T) {
	defer func(n int) { readChunk = n }(readChunk)
	for _, name := range []string{"untied.bin", "tied.bin"} {
		path := filepath.Join(dir, name)
		want := refLoad(t, path)
		for _, chunk := range []int{12, 4096, 1 << 20} {
			readChunk = chunk
			c, vals, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(f32bits(vals), f32bits(want)) {
				t.Errorf("%s, chunk %d: Load differs from the whole-file reader", name, chunk)
			}
			got := make([]float32, c.NumParams())
			seen := map[string]bool{}
			_, err = Each(path, func(p model.Param, v []float32) error {
				if seen[p.Name] || len(v) != p.Len() || int64(readChunk)+4*int64(cap(v)) > LoadBytes(c) {
					t.Errorf("%s: %d values (cap %d), seen before %v; LoadBytes %d", p.Name, len(v), cap(v), seen[p.Name], LoadBytes(c))
				}
				seen[p.Name] = true
				copy(got[p.Offset:], v)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(seen) != len(c.Layout()) || !slices.Equal(f32bits(got), f32bits(want)) {
				t.Errorf("%s, chunk %d: Each handed %d of %d parameters, values equal: %v", name, chunk,
					len(seen), len(c.Layout()), slices.Equal(f32bits(got), f32bits(want)))
			}
			if _, err := Check(path); err != nil {
				t.Errorf("%s: Check: %v", name, err)
			}
		}
	}
}

// TestCheckLastTensor: a NaN in the file's last tensor is found by
// Check, naming the file, the tensor and the element; Each has handed
// every tensor before it by then, which is why a loader checks first.
func TestCheckLastTensor(t *testing.T) {
	good, err := os.ReadFile(filepath.Join(dir, "untied.bin"))
	if err != nil {
		t.Fatal(err)
	}
	bad := slices.Clone(good)
	binary.LittleEndian.PutUint32(bad[len(bad)-8:], math.Float32bits(float32(math.Inf(-1))))
	p := filepath.Join(t.TempDir(), "m.bin")
	if err := os.WriteFile(p, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	var c llama.Config
	c, err = Check(p)
	last := c.Vocab*c.Hidden - 2
	if want := fmt.Sprintf("wcls: element %d is -Inf", last); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p) {
		t.Errorf("Check: %v, want an error naming %s and %q", err, p, want)
	}
	n := 0
	if _, err := Each(p, func(model.Param, []float32) error { n++; return nil }); err == nil || n != len(c.Layout())-1 {
		t.Errorf("Each: %v after %d tensors, want an error after %d", err, n, len(c.Layout())-1)
	}
}

func f32bits(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, x := range v {
		b[i] = math.Float32bits(x)
	}
	return b
}
