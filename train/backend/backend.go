// The Backend interface, its storage types and tensor views.

package backend

import (
	"fmt"
	"time"
)

// DType is a storage type. Arithmetic is always fp32; bf16 is converted at
// load and rounded to nearest even at store.
type DType uint8

// Storage types.
const (
	F32  DType = iota // IEEE binary32
	BF16              // bfloat16, the top half of a binary32
	I32               // token ids and targets
	// F64 is for scratch only (SumSquares' work): no model tensor and no
	// flag has it, and no op computes on it.
	F64
)

// Size is the number of bytes of one element.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16:
		return 2
	case F64:
		return 8
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "fp32"
	case BF16:
		return "bf16"
	case I32:
		return "i32"
	case F64:
		return "fp64"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseDType reads "fp32"/"f32"/"float32" or "bf16"/"bfloat16".
func ParseDType(s string) (DType, error) {
	switch s {
	case "fp32", "f32", "float32":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	}
	return F32, fmt.Errorf("unknown dtype %q (want fp32 or bf16)", s)
}

// Buffer is one device allocation. Tensors are views into it.
type Buffer interface {
	// ID is unique among the live buffers of a backend.
	ID() int
	// Name says what the buffer holds, for errors and memory reports.
	Name() string
	// Bytes is the size of the allocation.
	Bytes() int64
}

// HostBuffer is pinned (page-locked) host memory that device copies read and
// write. Host code may touch it only when ordered after the copies that use
// it (Synchronize, or EventSynchronize on an event recorded after them).
type HostBuffer interface {
	// ID is unique among the live host buffers of a backend.
	ID() int
	Bytes() []byte
	Float32() []float32
	Int32() []int32
	// BF16 views the bytes as bfloat16 values (raw uint16 bits), the
	// model dtype's storage, so no caller builds its own unsafe view.
	BF16() []uint16
}

// Tensor is a view (buffer, element offset, shape, dtype) into a device
// allocation. It is a value; slicing it never copies.
type Tensor struct {
	Buf   Buffer
	Off   int // in elements of DType
	Shape []int
	DType DType
}

// Len is the number of elements.
func (t Tensor) Len() int {
	n := 1
	for _, s := range t.Shape {
		n *= s
	}
	return n
}

// Bytes is the size of the view.
func (t Tensor) Bytes() int64 { return int64(t.Len()) * int64(t.DType.Size()) }

// Slice returns the contiguous view of n elements starting at element off of
// t, shaped as shape (which must hold n elements; empty means [n]).
func (t Tensor) Slice(off, n int, shape ...int) Tensor {
	if len(shape) == 0 {
		shape = []int{n}
	}
	return Tensor{Buf: t.Buf, Off: t.Off + off, Shape: shape, DType: t.DType}
}

// Reshape returns the same elements with another shape.
func (t Tensor) Reshape(shape ...int) Tensor {
	return Tensor{Buf: t.Buf, Off: t.Off, Shape: shape, DType: t.DType}
}

// Range is the byte range of the view, for hazard checks.
func (t Tensor) Range() Range {
	lo := int64(t.Off) * int64(t.DType.Size())
	return Range{Buf: t.Buf.ID(), Lo: lo, Hi: lo + t.Bytes()}
}

func (t Tensor) String() string {
	name := "<nil>"
	if t.Buf != nil {
		name = t.Buf.Name()
	}
	return fmt.Sprintf("%s[%d:]%v%v", name, t.Off, t.Shape, t.DType)
}

// Range is a byte range [Lo, Hi) of one buffer. Device buffers have
// positive ids; host buffers negative ones, so both share one space.
type Range struct {
	Buf    int
	Lo, Hi int64
}

// Overlaps reports whether two ranges share a byte.
func (r Range) Overlaps(o Range) bool { return r.Buf == o.Buf && r.Lo < o.Hi && o.Lo < r.Hi }

// Stream is an ordered queue of device work.
type Stream interface{ Name() string }

// Event marks a point in a stream.
type Event interface{ Name() string }

// MemStats reports device memory.
type MemStats struct {
	InUse, HighWater, Budget int64 // bytes; Budget 0 means unlimited
}

// Traffic counts bytes moved across the host-device link.
type Traffic struct {
	H2D, D2H int64
}

// AdamParams are the hyperparameters of one AdamW update.
type AdamParams struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	Step                               int // 1-based, for bias correction
	// MaxNorm > 0 clips: the gradient is scaled by min(1,
	// MaxNorm/(||g||+1e-6)), as torch's clip_grad_norm_ and the host Adam,
	// with ||g||^2 read from the SumSq tensor passed to AdamW.
	MaxNorm float32
}

// QKVLayout is how an attention op finds q, k and v in its qkv tensor.
type QKVLayout uint8

// The layouts of qkv.
const (
	// QKVFused: each position's q, k and v side by side, [B,T,(NH+2*KVH)*HS].
	QKVFused QKVLayout = iota
	// QKVPlanar: all of q [B,T,NH*HS], then all of k, then all of v
	// ([B,T,KVH*HS] each).
	QKVPlanar
)

func (l QKVLayout) String() string {
	switch l {
	case QKVFused:
		return "fused"
	case QKVPlanar:
		return "planar"
	}
	return fmt.Sprintf("QKVLayout(%d)", uint8(l))
}

// QKVIndex locates q, k and v in a qkv tensor of some layout: query head
// h of position p (= b*T + t) starts at element QBase + p*QRow + h*HS, key
// head g at KBase + p*KVRow + g*HS, value head g at VBase + p*KVRow +
// g*HS.
type QKVIndex struct {
	QBase, KBase, VBase int
	QRow, KVRow         int
}

// Index is l's QKVIndex for B*T positions of NH query and KVH key/value
// heads of HS.
func (l QKVLayout) Index(BT, NH, KVH, HS int) QKVIndex {
	if l == QKVPlanar {
		k := BT * NH * HS
		return QKVIndex{QBase: 0, KBase: k, VBase: k + BT*KVH*HS, QRow: NH * HS, KVRow: KVH * HS}
	}
	row := (NH + 2*KVH) * HS
	return QKVIndex{QBase: 0, KBase: NH * HS, VBase: (NH + KVH) * HS, QRow: row, KVRow: row}
}

// Backend is the device the model runs on. All ops are asynchronous: they
// are enqueued on a stream and return at once; argument errors (shapes,
// dtypes) are returned immediately, failures while running at Synchronize.
// The package doc says which goroutine may call which method.
type Backend interface {
	Name() string

	// Memory.
	Alloc(name string, n int, dt DType) (Tensor, error) // a new zeroed buffer as a 1-D tensor
	Free(t Tensor)                                      // frees t's whole buffer
	MemStats() MemStats
	AllocHost(name string, bytes int) (HostBuffer, error)
	FreeHost(h HostBuffer)
	Traffic() Traffic
	// Staging is the backend's pinned staging buffer, owned by the
	// backend and freed by Close: the blocking transfers (Upload,
	// Download) go through it instead of pinning memory per call.
	Staging() *Staging

	// Streams and events.
	DefaultStream() Stream // the backend's own; it cannot be destroyed
	NewStream(name string) (Stream, error)
	// DestroyStream releases s once the work enqueued on it has run (as
	// cudaStreamDestroy); s may not be used afterwards.
	DestroyStream(s Stream) error
	NewEvent(name string) (Event, error)
	// DestroyEvent releases e; waits already enqueued on it still end
	// when its record is reached. e may not be used afterwards.
	DestroyEvent(e Event) error
	// Record marks the point s has reached: work enqueued on s before it.
	// It fails on an event or stream that is not this backend's or was
	// destroyed, and after Close.
	Record(e Event, s Stream) error
	Wait(s Stream, e Event) error
	Synchronize(s Stream) error     // waits for s; returns its first async error
	EventSynchronize(e Event) error // host waits for the latest record of e
	// ElapsedTime is the device time from the latest record of start to
	// the latest record of end (cudaEventElapsedTime): both must have been
	// recorded and have completed (EventSynchronize first), or it is an
	// error.
	ElapsedTime(start, end Event) (time.Duration, error)
	Close() error // synchronizes every stream and releases everything

	// Copies between device tensors and pinned host memory (byte offsets
	// into the host buffer). The element type is the tensor's.
	CopyH2D(s Stream, dst Tensor, src HostBuffer, srcOff int) error
	CopyD2H(s Stream, dst HostBuffer, dstOff int, src Tensor) error
	CopyD2D(s Stream, dst, src Tensor) error // same length; converts dtypes

	Ops
}

// DeviceHeadroom is the device memory a GPU backend leaves to CUDA itself
// (launch resources, library workspaces) when its arena takes the free
// memory without a --device-mem: the larger of 256 MiB and 1/20 of the
// free memory. The CUDA backend sizes its arena by it and the planner
// plans a card's budget by it, so that a plan that fits is a run that
// starts.
func DeviceHeadroom(free int64) int64 { return max(256<<20, free/20) }
