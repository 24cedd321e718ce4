package gpt2

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// TestPackedMatchesUnpacked: a packed batch's per-token losses and
// gradients are those of its documents run alone (--pack), with and
// without recompute.
func TestPackedMatchesUnpacked(t *testing.T) {
	cfg := Config{V: 37, MaxT: 13, C: 16, L: 2, NH: 2, Eps: 1e-5}
	docs := [][]int{{5, 1, 7}, {9, 3}, {13}}
	for _, r := range []model.Recompute{model.RecomputeNone, model.RecomputeLayer} {
		modeltest.CheckPacked(t, cfg, Init(cfg, 7), cfg.V, cfg.L, model.Options{Recompute: r}, 13, docs)
	}
}
