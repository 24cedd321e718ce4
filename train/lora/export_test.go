package lora

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// For the external tests (engine_test.go), which run the adapters in the
// engine and so cannot be in this package (the engine imports it).
var (
	Families    = families
	FixtureArch = fixtureArch
	PEFTFixture = peftFixture
	BaseParams  = baseParams
	OpenST      = openST
	TensorOf    = tensor
	CloseTo     = closeTo
	CloseLogits = closeLogits

	ReadGoAdapterLogits = readGoAdapterLogits
)

// FixtureBatch is reference.safetensors' batch: ids and targets (-1 where
// ignored), B x T, and the targets taken.
func FixtureBatch(t *testing.T, ref *safetensors.File) (B, T int, ids, targets []int32, valid int) {
	b := readBatch(t, ref)
	ids = make([]int32, len(b.ids))
	for i, x := range b.ids {
		ids[i] = int32(x)
	}
	return b.B, b.T, ids, b.targets, b.numValid
}
