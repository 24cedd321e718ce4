package lora

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// mergedParams are testdata/<family>/base's weights in Layout order (this
// project's in x out matrices) with ad merged into them.
func mergedParams(t *testing.T, family string, idx *model.Index, ad *Adapter) []float32 {
	t.Helper()
	vals := baseParams(t, family, idx)
	if err := MergeAll(vals, idx, ad); err != nil {
		t.Fatal(err)
	}
	return vals
}

// baseParams is testdata/<family>/base's parameters in idx's layout.
func baseParams(t *testing.T, family string, idx *model.Index) []float32 {
	t.Helper()
	f := openST(t, filepath.Join("testdata", family, "base", "model.safetensors"))
	last := idx.Layout[len(idx.Layout)-1]
	vals := make([]float32, last.Offset+last.Len())
	for _, p := range idx.Layout {
		v, shape := tensor(t, f, p.Name)
		copy(vals[p.Offset:], inOut(v, shape, p.Transposed))
	}
	return vals
}

// forward runs arch's fp32 forward on the CPU backend and returns the
// logits [B*T*V].
func forward(t *testing.T, arch model.Arch, params []float32, ids []int64, B, T int) []float32 {
	t.Helper()
	in := make([]int32, len(ids))
	for i, x := range ids {
		in[i] = int32(x)
	}
	return modeltest.Logits(t, arch, params, in, B, T)
}

// closeLogits requires |got - want| <= 1e-5 * (the largest |want| + |want|).
func closeLogits(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d logits, want %d", what, len(got), len(want))
	}
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	var worst float64
	for i, w := range want {
		d := math.Abs(float64(got[i]) - w)
		if !(d <= 1e-5*(scale+math.Abs(w))) {
			t.Fatalf("%s: logit %d: %.8g, PEFT %.8g", what, i, got[i], w)
		}
		worst = max(worst, d)
	}
	t.Logf("%s: largest difference from PEFT %.2g (largest logit %.3g)", what, worst, scale)
}

// TestMergedForwardMatchesPEFT: the base model with an adapter merged in
// (Merge) gives PEFT's logits through this project's own forward, for
// PEFT's adapter (reference.safetensors) and for the Go-written one
// (go-adapter-logits.json): the adapter files, the layouts and the merge
// agree with PEFT end to end.
func TestMergedForwardMatchesPEFT(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			arch, idx := fixtureArch(t, fam)
			ref := openST(t, filepath.Join("testdata", fam, "reference.safetensors"))
			ids, shape, err := ref.Int64("input_ids")
			if err != nil {
				t.Fatal(err)
			}
			B, T := shape[0], shape[1]
			want32, _ := tensor(t, ref, "logits")
			want := make([]float64, len(want32))
			for i, x := range want32 {
				want[i] = float64(x)
			}

			ad := fixtureAdapter(t, fam, "adapter", idx)
			closeLogits(t, "PEFT's adapter", forward(t, arch, mergedParams(t, fam, idx, ad), ids, B, T), want)

			goAd := fixtureAdapter(t, fam, "go-adapter", idx)
			rec := readGoAdapterLogits(t, fam)
			closeLogits(t, "Go's adapter", forward(t, arch, mergedParams(t, fam, idx, goAd), rec.InputIDs, B, T), rec.Logits)
		})
	}
}
