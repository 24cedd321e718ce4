// Package trace is a Backend that records every op it is given, with its
// shapes, FLOPs and bytes, instead of running it: the planner builds the
// engine's real step graph on it and costs each op (train/plan). Alone
// (New) it has no memory behind device allocations, so a 7B model costs
// nothing to "allocate"; wrapped around a real backend (Wrap) it records
// and forwards, which is how tests check that the ops it records are the
// ops the real backend runs.
//
// FLOPs count a multiply-add as two; Bytes are the bytes an op reads plus
// those it writes as its train/hazard declaration names them
// (hazard.Access.Bytes: a tensor read and written counts twice, whole
// tensors as declared), the count train/calibrate measures its
// efficiencies against; a copy across the link counts its payload once.
// Attention's FLOPs are those of its causal half (flash style: the masked
// blocks are skipped).
//
// Limits: host buffers get memory only when host code first reads or
// writes them (Bytes, Float32, ...), so host code must not run on large
// ones (the planner never runs host nodes). Events carry no time:
// ElapsedTime is an error.
package trace

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Family is an op family: ops of a family share an efficiency in the cost
// model.
type Family string

// The families.
const (
	Gemm        Family = "gemm"
	Attention   Family = "attention"
	Norm        Family = "norm"
	Activation  Family = "activation"
	Elementwise Family = "elementwise"
	Sparse      Family = "sparse" // LSP compress, S and apply
	Dense       Family = "dense"  // dense projectors' fp32 products (DenseGemm, DenseApply)
	Embedding   Family = "embedding"
	Loss        Family = "loss"
	Adam        Family = "adam"
	Reduce      Family = "reduce"
	Copy        Family = "copy"
)

// Families lists every family, in a fixed order (timeline legends).
func Families() []Family {
	return []Family{Gemm, Attention, Norm, Activation, Elementwise, Sparse, Dense, Embedding, Loss, Adam, Reduce, Copy}
}

// ByFamily sums ops' Seconds per family: the seconds and the op count of
// each family, and the seconds of every op together.
func ByFamily(ops []Op) (sec map[Family]float64, count map[Family]int, total float64) {
	sec, count = map[Family]float64{}, map[Family]int{}
	for _, o := range ops {
		sec[o.Family] += o.Seconds
		count[o.Family]++
		total += o.Seconds
	}
	return sec, count, total
}

// Dir is the direction of a copy across the host-device link.
type Dir uint8

// Directions; NoLink is a device-to-device copy or not a copy.
const (
	NoLink Dir = iota
	H2D
	D2H
)

// Op is one recorded op.
type Op struct {
	Node   int    // the node being run (SetNode) when it was enqueued; -1 before any
	Stream string // the stream's name
	Method string // the Backend method
	Family Family
	DType  backend.DType // of the op's main operand (the GEMM's A, the input)
	Shapes [][]int       // the tensor arguments' shapes, in the method's order
	FLOPs  float64
	Bytes  int64 // read plus written
	Link   Dir   // copies across the link: their direction (Bytes the payload)
	// Gemm is a Gemm's layout and sizes (zero for other ops).
	Gemm GemmArgs
	// Seconds is the op's time on its stream when recorded by WrapTimed,
	// once Times has read it (0 otherwise).
	Seconds float64
}

// GemmArgs is one Gemm call's layout and sizes: C[M,N] = op(A) op(B).
type GemmArgs struct {
	TransA, TransB bool
	M, N, K        int
}

// LowRank reports whether o is a GEMM one of whose sizes is r. With r
// lora's rank it picks out the adapters' GEMMs (train/lora: each of the
// forward's and the backward's has r as M, N or K), so that the planner
// and the profile can say what the unfused adapter path costs; a model
// GEMM is taken for one only when a model size or the token count equals
// r.
func (o Op) LowRank(r int) bool {
	g := o.Gemm
	return o.Family == Gemm && r > 0 && (g.M == r || g.N == r || g.K == r)
}

// Backend records ops; see the package doc.
type Backend struct {
	backend.OpsFunc // the ops, each recorded by op (ops.go)

	inner backend.Backend // nil: no memory behind anything
	timed bool            // WrapTimed: time every op with events

	pending []timing // WrapTimed: events not yet read (Times)
	dropped int      // ops Reset has forgotten

	mu      sync.Mutex
	ops     []Op
	node    int
	nextID  int
	live    map[int]int64 // device buffer id -> bytes (New only)
	inUse   int64
	high    int64
	traffic backend.Traffic
	def     *stream
	staging *backend.Staging
	closed  bool
}

// New returns a recording backend with no memory behind its allocations.
func New() *Backend {
	b := &Backend{node: -1, live: map[int]int64{}}
	b.OpsFunc = b.op
	b.def = &stream{name: "compute", owner: b}
	b.staging = backend.NewStaging(b, backend.StagingBytes)
	return b
}

// Wrap returns a backend that records every op and copy and forwards it to
// inner, which does the work (and owns memory, streams and events).
func Wrap(inner backend.Backend) *Backend {
	b := &Backend{inner: inner, node: -1}
	b.OpsFunc = b.op
	return b
}

// WrapTimed is Wrap that also times every op with events: it records an
// event on the op's stream before forwarding it and another after, and
// Times reads the elapsed time between them into Op.Seconds: the op's run
// on its stream, whatever the host did meanwhile (on the CPU backend the
// two records cost well under a microsecond each). inner must time events
// (ElapsedTime). Nothing is synchronized: the schedule runs as it would.
func WrapTimed(inner backend.Backend) *Backend {
	b := &Backend{inner: inner, node: -1, timed: true}
	b.OpsFunc = b.op
	return b
}

// SetNode attributes the ops enqueued from now on to node i.
func (b *Backend) SetNode(i int) {
	b.mu.Lock()
	b.node = i
	b.mu.Unlock()
}

// Recorded returns a copy of the ops recorded so far.
func (b *Backend) Recorded() []Op {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Op(nil), b.ops...)
}

// Reset forgets the ops recorded so far.
func (b *Backend) Reset() {
	b.mu.Lock()
	b.dropped += len(b.ops)
	b.ops = nil
	b.mu.Unlock()
}

// record appends op and returns its index counting the ops Reset dropped.
func (b *Backend) record(s backend.Stream, op Op) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	op.Node = b.node
	if s != nil {
		op.Stream = s.Name()
	}
	b.ops = append(b.ops, op)
	return b.dropped + len(b.ops) - 1
}

// Name implements backend.Backend.
func (b *Backend) Name() string {
	if b.inner != nil {
		return "trace(" + b.inner.Name() + ")"
	}
	return "trace"
}

// buffer is a device allocation with nothing behind it.
type buffer struct {
	id    int
	name  string
	bytes int64
	owner *Backend
}

func (x *buffer) ID() int      { return x.id }
func (x *buffer) Name() string { return x.name }
func (x *buffer) Bytes() int64 { return x.bytes }

// hostBuffer gets memory the first time host code touches it.
type hostBuffer struct {
	id    int
	bytes int
	once  sync.Once
	mem   []byte
}

func (h *hostBuffer) ID() int { return h.id }

func (h *hostBuffer) Bytes() []byte {
	h.once.Do(func() {
		// 8-byte aligned, for the float32 and int32 views.
		w := make([]uint64, (h.bytes+7)/8)
		h.mem = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), h.bytes)
	})
	return h.mem
}

func (h *hostBuffer) Float32() []float32 { return backend.Float32View(h.Bytes()) }
func (h *hostBuffer) Int32() []int32     { return backend.Int32View(h.Bytes()) }
func (h *hostBuffer) BF16() []uint16     { return backend.BF16View(h.Bytes()) }

type stream struct {
	name  string
	owner *Backend
	dead  bool
}

func (s *stream) Name() string { return s.name }

type event struct {
	name  string
	owner *Backend
	dead  bool
}

func (e *event) Name() string { return e.name }

var errClosed = errors.New("trace: backend is closed")

// Alloc implements backend.Backend.
func (b *Backend) Alloc(name string, n int, dt backend.DType) (backend.Tensor, error) {
	if b.inner != nil {
		return b.inner.Alloc(name, n, dt)
	}
	if n < 0 || dt.Size() == 0 {
		return backend.Tensor{}, fmt.Errorf("trace: alloc %s: %d elements of %v", name, n, dt)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return backend.Tensor{}, errClosed
	}
	b.nextID++
	x := &buffer{id: b.nextID, name: name, bytes: int64(n) * int64(dt.Size()), owner: b}
	b.live[x.id] = x.bytes
	b.inUse += x.bytes
	b.high = max(b.high, b.inUse)
	return backend.Tensor{Buf: x, Shape: []int{n}, DType: dt}, nil
}

// Free implements backend.Backend.
func (b *Backend) Free(t backend.Tensor) {
	if b.inner != nil {
		b.inner.Free(t)
		return
	}
	if t.Buf == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n, ok := b.live[t.Buf.ID()]; ok {
		b.inUse -= n
		delete(b.live, t.Buf.ID())
	}
}

// MemStats implements backend.Backend: the bytes allocated, as if they
// were real.
func (b *Backend) MemStats() backend.MemStats {
	if b.inner != nil {
		return b.inner.MemStats()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return backend.MemStats{InUse: b.inUse, HighWater: b.high}
}

// AllocHost implements backend.Backend.
func (b *Backend) AllocHost(name string, bytes int) (backend.HostBuffer, error) {
	if b.inner != nil {
		return b.inner.AllocHost(name, bytes)
	}
	if bytes < 0 {
		return nil, fmt.Errorf("trace: alloc host %s: %d bytes", name, bytes)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	return &hostBuffer{id: -b.nextID, bytes: bytes}, nil
}

// FreeHost implements backend.Backend.
func (b *Backend) FreeHost(h backend.HostBuffer) {
	if b.inner != nil {
		b.inner.FreeHost(h)
	}
}

// Traffic implements backend.Backend: the link bytes recorded.
func (b *Backend) Traffic() backend.Traffic {
	if b.inner != nil {
		return b.inner.Traffic()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.traffic
}

// Staging implements backend.Backend.
func (b *Backend) Staging() *backend.Staging {
	if b.inner != nil {
		return b.inner.Staging()
	}
	return b.staging
}

// DefaultStream implements backend.Backend.
func (b *Backend) DefaultStream() backend.Stream {
	if b.inner != nil {
		return b.inner.DefaultStream()
	}
	return b.def
}

// NewStream implements backend.Backend.
func (b *Backend) NewStream(name string) (backend.Stream, error) {
	if b.inner != nil {
		return b.inner.NewStream(name)
	}
	return &stream{name: name, owner: b}, nil
}

// DestroyStream implements backend.Backend.
func (b *Backend) DestroyStream(s backend.Stream) error {
	if b.inner != nil {
		return b.inner.DestroyStream(s)
	}
	x, err := b.stream(s)
	if err != nil {
		return err
	}
	if x == b.def {
		return errors.New("trace: the default stream cannot be destroyed")
	}
	x.dead = true
	return nil
}

func (b *Backend) stream(s backend.Stream) (*stream, error) {
	x, ok := s.(*stream)
	if !ok || x.owner != b {
		return nil, fmt.Errorf("trace: stream %v is not this backend's", s)
	}
	if x.dead {
		return nil, fmt.Errorf("trace: stream %s was destroyed", x.name)
	}
	return x, nil
}

func (b *Backend) event(e backend.Event) (*event, error) {
	x, ok := e.(*event)
	if !ok || x.owner != b {
		return nil, fmt.Errorf("trace: event %v is not this backend's", e)
	}
	if x.dead {
		return nil, fmt.Errorf("trace: event %s was destroyed", x.name)
	}
	return x, nil
}

// NewEvent implements backend.Backend.
func (b *Backend) NewEvent(name string) (backend.Event, error) {
	if b.inner != nil {
		return b.inner.NewEvent(name)
	}
	return &event{name: name, owner: b}, nil
}

// DestroyEvent implements backend.Backend.
func (b *Backend) DestroyEvent(e backend.Event) error {
	if b.inner != nil {
		return b.inner.DestroyEvent(e)
	}
	x, err := b.event(e)
	if err != nil {
		return err
	}
	x.dead = true
	return nil
}

// Record implements backend.Backend.
func (b *Backend) Record(e backend.Event, s backend.Stream) error {
	if b.inner != nil {
		return b.inner.Record(e, s)
	}
	if _, err := b.event(e); err != nil {
		return err
	}
	_, err := b.stream(s)
	return err
}

// Wait implements backend.Backend.
func (b *Backend) Wait(s backend.Stream, e backend.Event) error {
	if b.inner != nil {
		return b.inner.Wait(s, e)
	}
	if _, err := b.event(e); err != nil {
		return err
	}
	_, err := b.stream(s)
	return err
}

// Synchronize implements backend.Backend.
func (b *Backend) Synchronize(s backend.Stream) error {
	if b.inner != nil {
		return b.inner.Synchronize(s)
	}
	_, err := b.stream(s)
	return err
}

// EventSynchronize implements backend.Backend.
func (b *Backend) EventSynchronize(e backend.Event) error {
	if b.inner != nil {
		return b.inner.EventSynchronize(e)
	}
	_, err := b.event(e)
	return err
}

// ElapsedTime implements backend.Backend; a tracer has no clock.
func (b *Backend) ElapsedTime(start, end backend.Event) (time.Duration, error) {
	if b.inner != nil {
		return b.inner.ElapsedTime(start, end)
	}
	return 0, errors.New("trace: events carry no time (nothing runs)")
}

// Close implements backend.Backend.
func (b *Backend) Close() error {
	if b.inner != nil {
		return b.inner.Close()
	}
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.staging.Free()
	return nil
}

// check validates the stream (New only) and that every tensor holds n
// elements within its buffer, as the CPU backend does before it enqueues.
func (b *Backend) check(s backend.Stream, op string, args ...arg) error {
	if b.inner == nil {
		if _, err := b.stream(s); err != nil {
			return fmt.Errorf("trace: %s: %w", op, err)
		}
	}
	for _, a := range args {
		t := a.t
		if t.Buf == nil {
			if a.optional {
				continue
			}
			return fmt.Errorf("trace: %s: %s has no buffer", op, a.name)
		}
		if t.DType.Size() == 0 {
			return fmt.Errorf("trace: %s: %s has dtype %v", op, a.name, t.DType)
		}
		if t.Off < 0 || int64(t.Off+t.Len())*int64(t.DType.Size()) > t.Buf.Bytes() {
			return fmt.Errorf("trace: %s: %s (%v) runs past its buffer of %d bytes", op, a.name, t, t.Buf.Bytes())
		}
		if a.n >= 0 && t.Len() < a.n {
			return fmt.Errorf("trace: %s: %s has %d elements, want %d", op, a.name, t.Len(), a.n)
		}
	}
	return nil
}

// arg is a tensor argument and the elements the op needs of it (-1: any).
type arg struct {
	name     string
	t        backend.Tensor
	n        int
	optional bool // an absent tensor (nil Buf) is allowed
}

func need(name string, t backend.Tensor, n int) arg { return arg{name: name, t: t, n: n} }
func maybe(name string, t backend.Tensor, n int) arg {
	return arg{name: name, t: t, n: n, optional: true}
}

// shapes lists the tensors' shapes (nil for an absent one).
func shapes(ts ...backend.Tensor) [][]int {
	out := make([][]int, len(ts))
	for i, t := range ts {
		if t.Buf != nil {
			out[i] = append([]int(nil), t.Shape...)
		}
	}
	return out
}

// by is the bytes of whole tensors.
func by(ts ...backend.Tensor) int64 {
	var s int64
	for _, t := range ts {
		if t.Buf != nil {
			s += t.Bytes()
		}
	}
	return s
}
