// Tests of the LSP flag checks and of the d a matrix gets.

package lsp

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model"
)

func TestCheckFlags(t *testing.T) {
	for _, tc := range []struct {
		name       string
		d, r       int
		alpha      float64
		checkEvery int
		want       []string // substrings that must all appear; none: no error
	}{
		{"paper 1B defaults", 512, 16, 0.5, 100, nil},
		{"r equal to d", 8, 8, 0.2, 1, nil},
		{"r larger than d", 8, 16, 0.5, 100, []string{"--r 16 larger than --d 8"}},
		{"d zero: AutoD", 0, 4, 0.5, 100, nil},
		{"d negative", -2, 4, 0.5, 100, []string{"--d -2"}},
		{"r zero", 8, 0, 0.5, 100, []string{"--r 0"}},
		{"alpha zero", 8, 4, 0, 100, []string{"--alpha 0"}},
		{"alpha one", 8, 4, 1, 100, []string{"--alpha 1"}},
		{"alpha NaN", 8, 4, math.NaN(), 100, []string{"--alpha NaN"}},
		{"check-every zero", 8, 4, 0.5, 0, []string{"--check-every 0"}},
		{"all at once", -1, 0, 2, -5, []string{"--d -1", "--r 0", "--alpha 2", "--check-every -5"}},
	} {
		err := CheckFlags(tc.d, tc.r, tc.alpha, tc.checkEvery)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: unexpected error %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", tc.name, err, w)
			}
		}
	}
}

// TestAutoD: without --d (0) each matrix gets a quarter of its shorter
// side, at most MaxAutoD, so that S compresses; matrices sharing an input
// share the smallest; a given d is capped at the sides as before.
func TestAutoD(t *testing.T) {
	for _, tc := range []struct{ d, m, n, want int }{
		{0, 128, 384, 32}, {0, 128, 128, 32}, {0, 768, 2304, 192}, {0, 4096, 11008, 512}, {0, 2, 8, 1},
		{512, 128, 384, 128}, {8, 128, 384, 8},
	} {
		if got := CapD(tc.d, tc.m, tc.n); got != tc.want {
			t.Errorf("CapD(%d, %d, %d) = %d, want %d", tc.d, tc.m, tc.n, got, tc.want)
		}
	}
	// q (64 x 64) and k (64 x 32) read one input and share P.
	x := &model.Index{Mats: []model.Matrix{{Name: "q", M: 64, N: 64}, {Name: "k", M: 64, N: 32}, {Name: "o", M: 64, N: 64, Input: 1}},
		Readers: [][]int{{0, 1}, {2}}}
	d, r := Dims(x, Config{D: 0, R: 16})
	if !slices.Equal(d, []int{8, 8, 16}) || !slices.Equal(r, []int{8, 8, 16}) {
		t.Errorf("Dims(auto) = %v, %v; want d [8 8 16], r [8 8 16]", d, r)
	}
}

// TestProjectorKinds: --projector's values, its checks against --fit
// (each error naming the flags), and the dense kinds' r = d and
// values-only device storage.
func TestProjectorKinds(t *testing.T) {
	var k Kind
	if err := k.Set("svd"); err != nil || k != KindSVD || k.String() != "svd" {
		t.Errorf("Set(svd): %v, %q", err, k)
	}
	if err := k.Set("dense"); err == nil || !strings.Contains(err.Error(), "sparse, svd or gaussian") {
		t.Errorf("Set(dense): %v, want the kinds named", err)
	}
	base := Config{D: 8, R: 2, Alpha: 0.5, CheckEvery: 5, CalibSamples: 4, ProjLR: 0.05}
	for _, tc := range []struct {
		kind  Kind
		noFit bool
		want  string // "": valid
	}{
		{"", true, ""}, {KindSparse, false, ""}, {KindGaussian, true, ""}, {KindSVD, false, ""},
		{KindGaussian, false, "--projector gaussian with --fit"},
		{KindSVD, true, "--projector svd without checks"},
		{"dense", true, "--projector: unknown"},
	} {
		c := base
		c.Projector, c.NoFit = tc.kind, tc.noFit
		err := c.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%q, NoFit %v: %v, want %q", tc.kind, tc.noFit, err, tc.want)
		}
	}
	// q (64 x 64) and k (64 x 32) read one input and share P.
	x := &model.Index{Mats: []model.Matrix{{Name: "q", M: 64, N: 64}, {Name: "k", M: 64, N: 32}, {Name: "o", M: 64, N: 64, Input: 1}},
		Readers: [][]int{{0, 1}, {2}}, Blocks: make([][]int, 1)}
	c := base
	c.Projector = KindGaussian
	d, r := Dims(x, c)
	if !slices.Equal(d, r) {
		t.Errorf("gaussian: d %v, r %v, want r = d", d, r)
	}
	n := count(x, c, 4, InFlight{})
	var want int
	for k, mt := range x.Mats {
		want += mt.N * d[k]
		if x.Readers[mt.Input][0] == k {
			want += mt.M * d[k]
		}
	}
	if n.pInts != 0 || n.pFloats != want {
		t.Errorf("gaussian block storage: %d ints, %d floats; want 0 and %d (P m x d, Q n x d)", n.pInts, n.pFloats, want)
	}
}

// --r sets the sparse projectors' non-zeros: with dense ones a --d below
// the default --r is no error.
func TestDenseKindsIgnoreR(t *testing.T) {
	c := Config{D: 8, R: 16, Alpha: 0.5, CheckEvery: 1, CalibSamples: 4, ProjLR: 0.05, Projector: KindGaussian, NoFit: true}
	if err := c.Validate(); err != nil {
		t.Errorf("gaussian with --d 8 --r 16: %v", err)
	}
	c.Projector = KindSparse
	if err := c.Validate(); err == nil {
		t.Error("sparse with --d 8 --r 16: no error")
	}
}
