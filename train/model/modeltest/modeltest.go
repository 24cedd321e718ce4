// Package modeltest holds checks that the tests of every model family
// share.
package modeltest

import (
	"errors"
	"math"
	"slices"
	"sort"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// CheckActViews checks a model's per-block activation views (views[l][i]:
// block l's acts[i], from model.CarveActs) against the recompute setting
// r: each view has its act's shape; a kept act has a view of its own in
// every block, one that is not kept is the same view in every block; no
// two distinct views overlap. It returns the elements the distinct views
// hold in the model dtype and in fp32, for the caller to compare with its
// allocations.
func CheckActViews(t *testing.T, acts []model.Act, views [][]backend.Tensor, r model.Recompute, hooked bool) (data, stats int) {
	t.Helper()
	type key struct {
		buf backend.Buffer
		off int
	}
	seen := map[key]backend.Tensor{}
	for l, vs := range views {
		if len(vs) != len(acts) {
			t.Fatalf("block %d has %d activation views, want %d", l, len(vs), len(acts))
		}
		for i, v := range vs {
			a := acts[i]
			if v.Len() != a.Len() {
				t.Errorf("block %d act %d: %d elements, want %d", l, i, v.Len(), a.Len())
			}
			same := l > 0 && v.Buf == views[0][i].Buf && v.Off == views[0][i].Off
			switch kept := r.Kept(a, hooked); {
			case kept && same:
				t.Errorf("block %d act %d (%v): shares block 0's view, but %v keeps it per block", l, i, a.Shape, r)
			case !kept && l > 0 && !same:
				t.Errorf("block %d act %d (%v): a view of its own, but %v shares it", l, i, a.Shape, r)
			}
			k := key{v.Buf, v.Off}
			if _, ok := seen[k]; ok {
				continue
			}
			seen[k] = v
			if a.F32 {
				stats += v.Len()
			} else {
				data += v.Len()
			}
		}
	}
	distinct := make([]backend.Tensor, 0, len(seen))
	for _, v := range seen {
		distinct = append(distinct, v)
	}
	sort.Slice(distinct, func(i, j int) bool { return distinct[i].Off < distinct[j].Off })
	end := map[backend.Buffer]int{}
	for _, v := range distinct {
		if v.Off < end[v.Buf] {
			t.Errorf("activation view at %d overlaps the one before it (ends at %d)", v.Off, end[v.Buf])
		}
		end[v.Buf] = v.Off + v.Len()
	}
	return data, stats
}

// WithRecompute is every option set of opts under every recompute setting.
func WithRecompute(opts []model.Options) []model.Options {
	var out []model.Options
	for _, o := range opts {
		for _, r := range model.Recomputes {
			o.Recompute = r
			out = append(out, o)
		}
	}
	return out
}

// CheckInitEach checks a spec's streaming initialisation against want,
// the whole-model initialisation of seed as the family drew it before
// (a reference copy kept by its test): Init and InitEach give its bits;
// InitEach hands every parameter in Layout order, in a buffer within
// model.InitBytes, and stops at fn's error.
func CheckInitEach(t *testing.T, s model.Spec, seed uint64, want []float32) {
	t.Helper()
	if got := s.Init(seed); !slices.Equal(bitsOf(got), bitsOf(want)) {
		t.Errorf("%+v: Init differs from the whole-model initialisation", s)
	}
	var got []float32
	layout := s.Layout()
	k := 0
	err := s.InitEach(seed, func(p model.Param, v []float32) error {
		if p.Name != layout[k].Name || len(v) != p.Len() || 4*int64(cap(v)) > model.InitBytes(s) {
			t.Fatalf("parameter %d: %s of %d values (cap %d), want %s of %d within %d bytes",
				k, p.Name, len(v), cap(v), layout[k].Name, layout[k].Len(), model.InitBytes(s))
		}
		k++
		got = append(got, v...)
		return nil
	})
	if err != nil || k != len(layout) {
		t.Fatalf("InitEach: %v after %d of %d parameters", err, k, len(layout))
	}
	if !slices.Equal(bitsOf(got), bitsOf(want)) {
		t.Errorf("%+v: InitEach's values differ from the whole-model initialisation", s)
	}
	stop := errors.New("stop")
	n := 0
	if err := s.InitEach(seed, func(model.Param, []float32) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("InitEach after fn's error: %v after %d calls, want stop after 1", err, n)
	}
}

// bitsOf is v's bit patterns, so that equal NaNs compare equal and -0
// differs from 0.
func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

// ActAllocs are a model's activation allocations and the views it carved
// from them, for CheckActAllocs.
type ActAllocs struct {
	Acts      []model.Act        // one block's activations (the family's blockActs)
	Views     [][]backend.Tensor // Views[l][i]: block l's Acts[i]
	Recompute model.Recompute
	Hooked    bool
	// Data (model dtype) and Stats (fp32) hold every activation: the
	// blocks' and OuterData's and OuterStats', those outside the blocks.
	Data, Stats           backend.Tensor
	OuterData, OuterStats []backend.Tensor
	// Grad holds the activation gradients GradViews, in DType, the model
	// dtype (half the bytes at bf16); Scratch is the backward's scratch.
	Grad      backend.Tensor
	GradViews []backend.Tensor
	Scratch   backend.Tensor
	DType     backend.DType
}

// CheckActAllocs: the activation views fill their allocations exactly (a
// plan that merely agrees with an oversized allocation fails here), and
// each block keeps its own view of an activation exactly when the hooks
// and the recompute setting say so (CheckActViews). It returns the bytes
// of the activations and of the activation gradients and scratch, the
// parts CheckMemoryWith compares with the plan.
func CheckActAllocs(t *testing.T, a ActAllocs) (acts, actGrads int64) {
	t.Helper()
	nd, ns := CheckActViews(t, a.Acts, a.Views, a.Recompute, a.Hooked)
	for _, v := range a.OuterData {
		nd += v.Len()
	}
	for _, v := range a.OuterStats {
		ns += v.Len()
	}
	if nd != a.Data.Len() || ns != a.Stats.Len() {
		t.Errorf("activation views hold %d and %d fp32 elements, allocations %d and %d", nd, ns, a.Data.Len(), a.Stats.Len())
	}
	if a.Grad.DType != a.DType {
		t.Errorf("activation gradients in %v, model in %v", a.Grad.DType, a.DType)
	}
	n := 0
	for _, v := range a.GradViews {
		n += v.Len()
	}
	if n != a.Grad.Len() {
		t.Errorf("activation gradients: views hold %d elements, allocation %d", n, a.Grad.Len())
	}
	return a.Data.Bytes() + a.Stats.Bytes(), a.Grad.Bytes() + a.Scratch.Bytes()
}

// CheckIndex: the index of a family's layout (model.NewIndex) puts
// matrix k of block l where the family's matrixParam says, and marks as
// matrices the parameters its isMatrix does, no more.
func CheckIndex(t *testing.T, x *model.Index, matrixParam func(l, k int) int, isMatrix func(i int) bool) {
	t.Helper()
	for l := range x.Blocks {
		for k, mt := range x.Mats {
			if i, want := x.MatParam[l][k], matrixParam(l, k); i != want {
				t.Errorf("index: matrix %s of block %d at %d, MatrixParam says %d", mt.Name, l, i, want)
			}
		}
	}
	for i := range x.Layout {
		if x.IsMat[i] != isMatrix(i) {
			t.Errorf("index: IsMat[%d] = %v, isMatrix says %v", i, x.IsMat[i], isMatrix(i))
		}
	}
}
