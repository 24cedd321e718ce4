// Blocking helpers that move whole tensors between Go slices and the
// device through a temporary pinned buffer. They synchronize the stream, so
// they belong in set-up, checkpointing and evaluation, not in the step.

package backend

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// Upload copies vals into t (F32 or BF16, rounded to nearest even) and waits.
func Upload(be Backend, s Stream, t Tensor, vals []float32) error {
	if len(vals) != t.Len() {
		return fmt.Errorf("upload to %v: %d values for %d elements", t, len(vals), t.Len())
	}
	h, err := be.AllocHost("upload", int(t.Bytes()))
	if err != nil {
		return err
	}
	defer be.FreeHost(h)
	switch t.DType {
	case F32:
		copy(h.Float32(), vals)
	case BF16:
		bf16.FromFloat32Slice(h.BF16(), vals)
	default:
		return fmt.Errorf("upload to %v: not a float tensor", t)
	}
	if err := be.CopyH2D(s, t, h, 0); err != nil {
		return err
	}
	return be.Synchronize(s)
}

// UploadInt32 copies vals into the I32 tensor t and waits.
func UploadInt32(be Backend, s Stream, t Tensor, vals []int32) error {
	if len(vals) != t.Len() || t.DType != I32 {
		return fmt.Errorf("upload to %v: %d int32 values", t, len(vals))
	}
	h, err := be.AllocHost("upload", int(t.Bytes()))
	if err != nil {
		return err
	}
	defer be.FreeHost(h)
	copy(h.Int32(), vals)
	if err := be.CopyH2D(s, t, h, 0); err != nil {
		return err
	}
	return be.Synchronize(s)
}

// Download copies t (F32 or BF16) into a new fp32 slice, after waiting for
// the work before it on s.
func Download(be Backend, s Stream, t Tensor) ([]float32, error) {
	h, err := be.AllocHost("download", int(t.Bytes()))
	if err != nil {
		return nil, err
	}
	defer be.FreeHost(h)
	if err := be.CopyD2H(s, h, 0, t); err != nil {
		return nil, err
	}
	if err := be.Synchronize(s); err != nil {
		return nil, err
	}
	out := make([]float32, t.Len())
	switch t.DType {
	case F32:
		copy(out, h.Float32())
	case BF16:
		bf16.ToFloat32Slice(out, h.BF16())
	default:
		return nil, fmt.Errorf("download of %v: not a float tensor", t)
	}
	return out, nil
}
