// Blocking transfers between Go slices and device tensors through a
// backend's staging buffer: one pinned host buffer of StagingBytes,
// allocated at the first transfer and kept until the backend closes, so
// that no transfer pins and unpins memory (on CUDA, freeing pinned memory
// synchronizes the whole device and would serialize the pipelined
// schedule). Tensors larger than the buffer move in chunks.
//
// The transfers synchronize the stream they run on after every chunk, so
// they belong in set-up, checkpointing, evaluation and the few scalars a
// step reads back (the loss, a norm), not in the pipelined part of a step.
//
// Limits: only the device goroutine may transfer (they enqueue copies);
// one transfer at a time per backend (a mutex serializes them).

package backend

import (
	"fmt"
	"sync"

	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// StagingBytes is the size of a backend's staging buffer: a step's losses
// or norms move in one copy; a checkpoint's parameters in chunks of it.
const StagingBytes = 4 << 20

// Staging is a pinned buffer reused by every blocking transfer of one
// backend (Backend.Staging).
type Staging struct {
	be    Backend
	bytes int

	mu    sync.Mutex
	buf   HostBuffer // nil until the first transfer
	freed bool
}

// NewStaging returns the staging of be with a buffer of the given size (a
// backend implementation calls it once, with StagingBytes). Nothing is
// allocated until the first transfer.
func NewStaging(be Backend, bytes int) *Staging {
	return &Staging{be: be, bytes: max(bytes, 8)}
}

// Free releases the buffer; later transfers are errors. Backends call it
// from Close, when no copy uses the buffer any more.
func (st *Staging) Free() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.buf != nil {
		st.be.FreeHost(st.buf)
		st.buf = nil
	}
	st.freed = true
}

// hostAccesser is how hazard-checking backends (the CPU's test mode) learn
// of host reads and writes of pinned memory.
type hostAccesser interface {
	HostAccess(name string, reads, writes []Range)
}

// move transfers t chunk by chunk on s. For each chunk [off, off+n) of t's
// elements: up (when set) fills the first n elements of the buffer and the
// chunk is copied to the device; or the chunk is copied to the buffer and
// down (when set) reads it. The stream is synchronized after every chunk,
// so the buffer is free again when move returns.
func (st *Staging) move(s Stream, t Tensor, up, down func(h HostBuffer, off, n int)) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.freed {
		return fmt.Errorf("staging of %s: used after the backend was closed", st.be.Name())
	}
	if st.buf == nil {
		h, err := st.be.AllocHost("staging", st.bytes)
		if err != nil {
			return fmt.Errorf("staging: %w", err)
		}
		st.buf = h
	}
	es := t.DType.Size()
	if es == 0 {
		return fmt.Errorf("transfer of %v: unknown dtype", t)
	}
	total, per := t.Len(), st.bytes/es
	ha, _ := st.be.(hostAccesser)
	hostUse := func(n int, write bool) {
		if ha == nil {
			return
		}
		r := []Range{{Buf: st.buf.ID(), Lo: 0, Hi: int64(n * es)}}
		if write {
			ha.HostAccess("staging fill", nil, r)
		} else {
			ha.HostAccess("staging read", r, nil)
		}
	}
	for off := 0; off < total; off += per {
		n := min(per, total-off)
		chunk := t.Slice(off, n)
		if up != nil {
			hostUse(n, true)
			up(st.buf, off, n)
			if err := st.be.CopyH2D(s, chunk, st.buf, 0); err != nil {
				return err
			}
		} else if err := st.be.CopyD2H(s, st.buf, 0, chunk); err != nil {
			return err
		}
		if err := st.be.Synchronize(s); err != nil {
			return err
		}
		if down != nil {
			hostUse(n, false)
			down(st.buf, off, n)
		}
	}
	if total == 0 {
		// Nothing to move; still order the caller after s, as a copy would.
		return st.be.Synchronize(s)
	}
	return nil
}

// Upload copies vals into t (F32, or BF16 rounded to nearest even) and
// waits for the copy.
func (st *Staging) Upload(s Stream, t Tensor, vals []float32) error {
	if len(vals) != t.Len() {
		return fmt.Errorf("upload to %v: %d values for %d elements", t, len(vals), t.Len())
	}
	var up func(h HostBuffer, off, n int)
	switch t.DType {
	case F32:
		up = func(h HostBuffer, off, n int) { copy(h.Float32()[:n], vals[off:off+n]) }
	case BF16:
		up = func(h HostBuffer, off, n int) { bf16.FromFloat32Slice(h.BF16()[:n], vals[off:off+n]) }
	default:
		return fmt.Errorf("upload to %v: not a float tensor", t)
	}
	return st.move(s, t, up, nil)
}

// UploadInt32 copies vals into the I32 tensor t and waits for the copy.
func (st *Staging) UploadInt32(s Stream, t Tensor, vals []int32) error {
	if len(vals) != t.Len() || t.DType != I32 {
		return fmt.Errorf("upload to %v: %d int32 values", t, len(vals))
	}
	return st.move(s, t, func(h HostBuffer, off, n int) { copy(h.Int32()[:n], vals[off:off+n]) }, nil)
}

// DownloadInto copies t (F32 or BF16) into dst, as fp32, after the work
// before it on s.
func (st *Staging) DownloadInto(s Stream, dst []float32, t Tensor) error {
	if len(dst) != t.Len() {
		return fmt.Errorf("download of %v: %d values for %d elements", t, len(dst), t.Len())
	}
	var down func(h HostBuffer, off, n int)
	switch t.DType {
	case F32:
		down = func(h HostBuffer, off, n int) { copy(dst[off:off+n], h.Float32()[:n]) }
	case BF16:
		down = func(h HostBuffer, off, n int) { bf16.ToFloat32Slice(dst[off:off+n], h.BF16()[:n]) }
	default:
		return fmt.Errorf("download of %v: not a float tensor", t)
	}
	return st.move(s, t, nil, down)
}

// Download copies t (F32 or BF16) into a new fp32 slice, after the work
// before it on s.
func (st *Staging) Download(s Stream, t Tensor) ([]float32, error) {
	out := make([]float32, t.Len())
	if err := st.DownloadInto(s, out, t); err != nil {
		return nil, err
	}
	return out, nil
}

// Upload copies vals into t through be's staging buffer and waits.
func Upload(be Backend, s Stream, t Tensor, vals []float32) error {
	return be.Staging().Upload(s, t, vals)
}

// UploadInt32 copies vals into the I32 tensor t through be's staging
// buffer and waits.
func UploadInt32(be Backend, s Stream, t Tensor, vals []int32) error {
	return be.Staging().UploadInt32(s, t, vals)
}

// Download copies t into a new fp32 slice through be's staging buffer,
// after the work before it on s.
func Download(be Backend, s Stream, t Tensor) ([]float32, error) {
	return be.Staging().Download(s, t)
}
