package model

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// fake is an Arch with a given layout, for NewIndex.
type fake struct {
	layout []Param
	layers int
	mats   []Matrix
}

func (f fake) Layout() []Param    { return f.layout }
func (f fake) Layers() int        { return f.layers }
func (f fake) Matrices() []Matrix { return f.mats }
func (f fake) NumParams() int {
	last := f.layout[len(f.layout)-1]
	return last.Offset + last.Len()
}
func (f fake) MemoryWith(int, int, backend.DType, Options) Memory { return Memory{} }
func (f fake) NewModel(backend.Backend, int, int, backend.DType, Options) (Model, error) {
	return nil, nil
}

// twoBlocks: an embedding, two blocks of (q, k, bias, o) where q and k
// read one input and o another, and a final norm.
func twoBlocks() fake {
	f := fake{layers: 2, mats: []Matrix{
		{Name: "q", Slot: 0, M: 4, N: 4, Input: 0},
		{Name: "k", Slot: 1, M: 4, N: 2, Input: 0},
		{Name: "o", Slot: 3, M: 2, N: 4, Input: 1},
	}}
	off := 0
	add := func(name string, layer int, shape ...int) {
		p := Param{Name: name, Shape: shape, Offset: off, Layer: layer}
		off += p.Len()
		f.layout = append(f.layout, p)
	}
	add("emb", -1, 10, 4)
	for l := range 2 {
		add("q", l, 4, 4)
		add("k", l, 4, 2)
		add("bias", l, 4)
		add("o", l, 2, 4)
	}
	add("norm", -1, 4)
	return f
}

func TestNewIndex(t *testing.T) {
	x, err := NewIndex(twoBlocks())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(x.Outside, []int{0, 9}) || !slices.Equal(x.Blocks[1], []int{5, 6, 7, 8}) {
		t.Errorf("outside %v, block 1 %v", x.Outside, x.Blocks[1])
	}
	if !slices.Equal(x.MatParam[1], []int{5, 6, 8}) || x.Inputs != 2 || !slices.Equal(x.InputM, []int{4, 2}) {
		t.Errorf("matrices of block 1 %v, %d inputs of widths %v", x.MatParam[1], x.Inputs, x.InputM)
	}
	if len(x.Readers) != 2 || !slices.Equal(x.Readers[0], []int{0, 1}) || !slices.Equal(x.Readers[1], []int{2}) {
		t.Errorf("readers %v", x.Readers)
	}
	if x.IsMat[7] || !x.IsMat[8] || x.MatrixElems() != 2*(16+8+8) {
		t.Errorf("IsMat %v, %d matrix elements", x.IsMat, x.MatrixElems())
	}
}

func TestNewIndexErrors(t *testing.T) {
	for _, tc := range []struct {
		edit func(*fake)
		want string
	}{
		{func(f *fake) { f.layers = 0 }, "blocks"},
		{func(f *fake) { f.layout[3].Offset++ }, "offset"},
		{func(f *fake) { f.layout[2].Layer = 1 }, "block order"},
		{func(f *fake) { f.layout[1].Layer = 2 }, "in block 2"},
		{func(f *fake) { f.mats[2].Input = 3 }, "order of first use"},
		{func(f *fake) { f.mats[1].M = 2; f.mats[1].N = 4 }, "width"},
		{func(f *fake) { f.mats[2].Slot = 2 }, "want 2 x 4"},
		{func(f *fake) { f.mats[2].Slot = 4 }, "slot 4"},
	} {
		f := twoBlocks()
		tc.edit(&f)
		if _, err := NewIndex(f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error with %q, got %v", tc.want, err)
		}
	}
}

func TestGradOffsets(t *testing.T) {
	f := twoBlocks()
	offs, n := GradOffsets(f.layout, nil)
	for i, p := range f.layout {
		if offs[i] != p.Offset {
			t.Errorf("%s: offset %d without skips, want %d", p.Name, offs[i], p.Offset)
		}
	}
	if n != f.NumParams() {
		t.Errorf("%d elements, want %d", n, f.NumParams())
	}
	x, err := NewIndex(f)
	if err != nil {
		t.Fatal(err)
	}
	offs, n = GradOffsets(f.layout, func(i int) bool { return x.IsMat[i] })
	// emb 40 | bias 4 | bias 4 | norm 4: the matrices left out.
	if want := []int{0, -1, -1, 40, -1, -1, -1, 44, -1, 48}; !slices.Equal(offs, want) || n != 52 {
		t.Errorf("offsets %v (%d elements), want %v (52)", offs, n, want)
	}
}

// TestRecomputeKept: which activations each setting keeps per block, with
// and without hooks, and the flag spellings.
func TestRecomputeKept(t *testing.T) {
	attn := Act{Shape: []int{2, 3}, Block: Attention}
	attnIn := Act{Shape: []int{2, 3}, Block: Attention, MatrixInput: true}
	mlp := Act{Shape: []int{4}, Block: MLP, F32: true}
	out := Act{Shape: []int{5}, Block: Output}
	for _, tc := range []struct {
		r      Recompute
		hooked bool
		want   [4]bool // attn, attnIn, mlp, out
	}{
		{RecomputeNone, false, [4]bool{true, true, true, true}},
		{RecomputeNone, true, [4]bool{true, false, true, true}},
		{RecomputeAttn, false, [4]bool{false, false, true, true}},
		{RecomputeAttn, true, [4]bool{false, false, true, true}},
		{RecomputeLayer, false, [4]bool{false, false, false, true}},
		{RecomputeLayer, true, [4]bool{false, false, false, true}},
	} {
		for i, a := range []Act{attn, attnIn, mlp, out} {
			if got := tc.r.Kept(a, tc.hooked); got != tc.want[i] {
				t.Errorf("%v, hooked %v, act %d: kept %v, want %v", tc.r, tc.hooked, i, got, tc.want[i])
			}
		}
	}
	// Three blocks under attn: attn and attnIn shared (6 + 6), mlp (fp32)
	// and out per block (3 x 4, 3 x 5).
	if d, s := ActSizes([]Act{attn, attnIn, mlp, out}, 3, RecomputeAttn, false); d != 6+6+15 || s != 12 {
		t.Errorf("ActSizes = %d, %d; want 27, 12", d, s)
	}
	for _, r := range Recomputes {
		var got Recompute
		if err := got.Set(r.String()); err != nil || got != r {
			t.Errorf("Set(%q) = %v, %v", r.String(), got, err)
		}
	}
	if _, err := ParseRecompute("mlp"); err == nil {
		t.Error(`ParseRecompute("mlp") accepted`)
	}
}

// TestChecked: Checked computes sizes exactly until one overflows, which
// it notes and keeps, and Int refuses the result after it.
func TestChecked(t *testing.T) {
	var k Checked
	if n, ok := k.Int(k.Add(k.Mul(3, 4), 5)); !ok || n != 17 {
		t.Errorf("3*4+5 = %d, %v; want 17, true", n, ok)
	}
	if got := k.Mul(math.MaxInt64/2+1, 2); got != 0 || !k.Overflow {
		t.Errorf("an overflowing Mul: %d, overflow %v", got, k.Overflow)
	}
	if n, ok := k.Int(1); ok {
		t.Errorf("Int after an overflow: %d, true", n)
	}
	k = Checked{}
	if got := k.Add(math.MaxInt64, 1); got != 0 || !k.Overflow {
		t.Errorf("an overflowing Add: %d, overflow %v", got, k.Overflow)
	}
}
