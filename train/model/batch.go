// batch.go: the one way callers other than the engine's staging (the
// evaluation, generation without a cache, the projector check) fill a
// model's batch buffers, so that a packed model (Options.Packed) never runs
// on stale positions.

package model

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// UploadBatch uploads inputs and, unless nil, targets into bufs (B*T each,
// rows of T). A packed model (bufs.Positions present) also gets positions:
// pos, or 0..T-1 in every row for an unpacked batch (pos nil), which are
// the unpacked model's results. An unpacked model refuses positions.
func UploadBatch(be backend.Backend, s backend.Stream, bufs Buffers, T int, inputs, targets, pos []int32) error {
	if err := backend.UploadInt32(be, s, bufs.Inputs, inputs); err != nil {
		return fmt.Errorf("model: inputs: %w", err)
	}
	if targets != nil {
		if err := backend.UploadInt32(be, s, bufs.Targets, targets); err != nil {
			return fmt.Errorf("model: targets: %w", err)
		}
	}
	switch {
	case bufs.Positions.Buf == nil && pos != nil:
		return fmt.Errorf("model: a batch of packed rows for a model built without Options.Packed")
	case bufs.Positions.Buf == nil:
		return nil
	case pos == nil:
		if T <= 0 {
			return fmt.Errorf("model: rows of T=%d", T)
		}
		pos = make([]int32, len(inputs))
		for i := range pos {
			pos[i] = int32(i % T)
		}
	}
	if err := backend.UploadInt32(be, s, bufs.Positions, pos); err != nil {
		return fmt.Errorf("model: positions: %w", err)
	}
	return nil
}
