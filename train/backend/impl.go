// Pieces that every backend implementation needs alike: the typed views
// of raw memory behind HostBuffer's views and the CPU backend's tensors,
// the memory of a host buffer with those views, the sticky first
// asynchronous error, and the checks of the tensors a backend is given.

package backend

import (
	"fmt"
	"sync"
	"unsafe"
)

// Float32View views b as float32 values, without copying; b must be
// 4-byte aligned.
func Float32View(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// Int32View views b as int32 values, without copying; b must be 4-byte
// aligned.
func Int32View(b []byte) []int32 {
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// BF16View views b as bfloat16 values (raw uint16 bits), without copying;
// b must be 2-byte aligned.
func BF16View(b []byte) []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}

// HostBytes is a host buffer's memory with HostBuffer's views of it (all
// but ID): a backend's host buffer embeds it, set to its memory, which
// must be 4-byte aligned.
type HostBytes []byte

func (m HostBytes) Bytes() []byte      { return m }
func (m HostBytes) Float32() []float32 { return Float32View(m) }
func (m HostBytes) Int32() []int32     { return Int32View(m) }
func (m HostBytes) BF16() []uint16     { return BF16View(m) }

// StickyError keeps the first error a backend's asynchronous work reports:
// as in CUDA, it is sticky, and later errors do not replace it. It is safe
// for concurrent use; the zero value keeps none.
type StickyError struct {
	mu    sync.Mutex
	first error
}

// Set keeps err unless an error is kept already.
func (s *StickyError) Set(err error) {
	s.mu.Lock()
	if s.first == nil {
		s.first = err
	}
	s.mu.Unlock()
}

// Err is the error kept, or nil.
func (s *StickyError) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// ViewCheck is a backend's check that the tensors it is given are views
// inside its live buffers with a known dtype: anything else would give a
// kernel (or the CPU backend's loops) memory that is not, or no longer,
// the tensor's. The CPU and CUDA backends share it, so that they refuse
// the same tensors for the same reasons.
type ViewCheck struct {
	Prefix string // begins every error: "cpu", "cuda"
	Kind   string // names the backend's buffers: "CPU", "CUDA"
	// Buffer is what the backend knows of t's buffer; ok is false when
	// it is not a buffer of the backend's kind.
	Buffer func(t Tensor) (st BufferState, ok bool)
}

// BufferState is what a backend knows of a tensor's buffer.
type BufferState struct {
	Bytes   int64 // the buffer's size
	Foreign bool  // another backend's
	Live    bool  // allocated and not freed
	Closed  bool  // the backend is closed
}

// Error says why t is not a view inside a live buffer of the backend with
// a known dtype, or nil if it is one.
func (v ViewCheck) Error(t Tensor) error {
	u, ok := v.Buffer(t)
	if !ok {
		return fmt.Errorf("tensor %v is not a %s buffer", t, v.Kind)
	}
	if t.DType.Size() == 0 {
		return fmt.Errorf("tensor %v has unknown dtype %v", t, t.DType)
	}
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("tensor %v has a negative shape", t)
		}
	}
	if t.Off < 0 || int64(t.Off)*int64(t.DType.Size())+t.Bytes() > u.Bytes {
		return fmt.Errorf("view %v outside its buffer of %d bytes", t, u.Bytes)
	}
	switch {
	case u.Foreign:
		return fmt.Errorf("tensor %v belongs to another backend", t)
	case u.Closed:
		return fmt.Errorf("tensor %v: backend is closed", t)
	case !u.Live:
		return fmt.Errorf("tensor %v: its buffer was freed", t)
	}
	return nil
}

// Tensor is Error's verdict on t, named what.
func (v ViewCheck) Tensor(what string, t Tensor) error {
	if err := v.Error(t); err != nil {
		return fmt.Errorf("%s: %s: %w", v.Prefix, what, err)
	}
	return nil
}

// Arg is Tensor for argument arg of op (CheckCall's live check): it builds
// no name unless t fails.
func (v ViewCheck) Arg(op, arg string, t Tensor) error {
	if err := v.Error(t); err != nil {
		return fmt.Errorf("%s: %s %s: %w", v.Prefix, op, arg, err)
	}
	return nil
}

// Copy checks the tensors of CopyD2D, op: dst and src are views of src's
// length, both of a float dtype (fp32 or bf16) or both I32.
func (v ViewCheck) Copy(op string, dst, src Tensor) error {
	ints := src.DType == I32
	for _, a := range []struct {
		name string
		t    Tensor
	}{{"dst", dst}, {"src", src}} {
		if err := v.Tensor(op+" "+a.name, a.t); err != nil {
			return err
		}
		float := a.t.DType == F32 || a.t.DType == BF16
		if ints != (a.t.DType == I32) || !ints && !float {
			return fmt.Errorf("%s: %s: %s has dtype %v", v.Prefix, op, a.name, a.t.DType)
		}
		if a.t.Len() != src.Len() {
			return fmt.Errorf("%s: %s: %s has %d elements, want %d", v.Prefix, op, a.name, a.t.Len(), src.Len())
		}
	}
	return nil
}
