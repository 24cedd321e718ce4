package catalog

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// TestWriteExportCheck writes, when LSP_EXPORT_CHECK names a directory,
// the export of the Hugging Face directory LSP_EXPORT_SRC (any family;
// default the GPT-2 fixture) as the run writes it (Export), with the
// logits this implementation computes on random tokens in
// lsp_check.safetensors, for `scripts/fixtures/gpt2_tiny.py` or
// `llama_tiny.py --check-export DIR` to compare with transformers. It is
// a tool for that hand-run check, skipped otherwise.
func TestWriteExportCheck(t *testing.T) {
	dir := os.Getenv("LSP_EXPORT_CHECK")
	if dir == "" {
		t.Skip("set LSP_EXPORT_CHECK=DIR (and LSP_EXPORT_SRC=HF_DIR) to write an export for the PyTorch check")
	}
	src := os.Getenv("LSP_EXPORT_SRC")
	if src == "" {
		src = filepath.Join("..", "testdata", "gpt2-tiny")
	}
	spec, vals, err := Load(src)
	if err != nil {
		t.Fatal(err)
	}
	B, T := 2, min(spec.MaxSeqLen(), 24)
	rng := rand.New(rand.NewPCG(5, 6))
	ids := make([]int32, B*T)
	ids64 := make([]int64, B*T)
	for i := range ids {
		ids[i] = int32(rng.IntN(spec.VocabSize()))
		ids64[i] = int64(ids[i])
	}
	logits := modeltest.Logits(t, spec, vals, ids, B, T)
	if err := Export(spec, dir, vals, src, nil); err != nil {
		t.Fatal(err)
	}
	err = safetensors.Write(filepath.Join(dir, "lsp_check.safetensors"), []safetensors.Tensor{
		safetensors.I64Tensor("input_ids", []int{B, T}, ids64),
		safetensors.F32Tensor("logits", []int{B, T, spec.VocabSize()}, logits),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
}
