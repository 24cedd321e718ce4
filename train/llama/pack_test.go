package llama

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// TestPackedMatchesUnpacked: a packed batch's per-token losses and
// gradients are those of its documents run alone (--pack), for LLaMA's
// grouped-query heads and Qwen2's q, k, v biases, with and without
// recompute.
func TestPackedMatchesUnpacked(t *testing.T) {
	docs := [][]int{{5, 1, 7}, {9, 3}, {13}}
	for _, bias := range []bool{false, true} {
		cfg := hookCfg
		cfg.QKVBias = bias
		for _, r := range []model.Recompute{model.RecomputeNone, model.RecomputeLayer} {
			modeltest.CheckPacked(t, cfg, cfg.Init(7), cfg.Vocab, cfg.NumLayers, model.Options{Recompute: r}, 13, docs)
		}
	}
}
