// The recorded ops: each validates its arguments, records one Op with its
// FLOPs and bytes (see the package doc for how they are counted) and, when
// wrapping, forwards to the inner backend.

package trace

import (
	"errors"
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
)

// do checks args, forwards (when wrapping) and records op on success, so
// that a wrapped backend's list holds exactly the ops it ran.
func (b *Backend) do(s backend.Stream, op Op, args []arg, fwd func() error) error {
	if err := b.check(s, op.Method, args...); err != nil {
		return err
	}
	for _, v := range op.Shapes {
		for _, d := range v {
			if d < 0 {
				return fmt.Errorf("trace: %s: negative dimension in %v", op.Method, v)
			}
		}
	}
	var ev [2]backend.Event
	if b.inner != nil {
		if b.timed {
			var err error
			if ev[0], err = b.mark(s); err != nil {
				return err
			}
		}
		if err := fwd(); err != nil {
			return err
		}
		if b.timed {
			var err error
			if ev[1], err = b.mark(s); err != nil {
				return err
			}
		}
	}
	i := b.record(s, op)
	if ev[1] != nil {
		b.mu.Lock()
		b.pending = append(b.pending, timing{i, ev})
		b.mu.Unlock()
	}
	return nil
}

// timing is an op's pair of events, resolved by Times.
type timing struct {
	op int // its index counting the ops Reset dropped
	ev [2]backend.Event
}

// mark records a new event on s.
func (b *Backend) mark(s backend.Stream) (backend.Event, error) {
	e, err := b.inner.NewEvent("trace timing")
	if err != nil {
		return nil, fmt.Errorf("trace: timing: %w", err)
	}
	if err := b.inner.Record(e, s); err != nil {
		_ = b.inner.DestroyEvent(e) // the record's error is the one to report
		return nil, fmt.Errorf("trace: timing: %w", err)
	}
	return e, nil
}

// Times waits for the ops recorded so far by WrapTimed to run, sets each
// one's Seconds from its events and returns them (Recorded with times).
func (b *Backend) Times() ([]Op, error) {
	b.mu.Lock()
	pending := b.pending
	b.pending = nil
	b.mu.Unlock()
	var errs []error
	for _, p := range pending {
		if err := b.inner.EventSynchronize(p.ev[1]); err != nil {
			errs = append(errs, err)
			continue
		}
		d, err := b.inner.ElapsedTime(p.ev[0], p.ev[1])
		if err != nil {
			errs = append(errs, err)
		} else {
			b.mu.Lock()
			if i := p.op - b.dropped; i >= 0 && i < len(b.ops) { // not Reset since
				b.ops[i].Seconds = d.Seconds()
			}
			b.mu.Unlock()
		}
		errs = append(errs, b.inner.DestroyEvent(p.ev[0]), b.inner.DestroyEvent(p.ev[1]))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("trace: timing: %w", err)
	}
	return b.Recorded(), nil
}

func dims(op string, vals ...int) error {
	for _, v := range vals {
		if v < 0 {
			return fmt.Errorf("trace: %s: negative dimension %d", op, v)
		}
	}
	return nil
}

// hostLen is the size of a host buffer without giving a traced one memory.
func hostLen(h backend.HostBuffer) int {
	if x, ok := h.(*hostBuffer); ok {
		return x.bytes
	}
	return len(h.Bytes())
}

// op records one call of an op from the op table (backend.OpDef): its
// tensors checked against the counts the table gives, its FLOPs, family
// and dtype as the table says, its bytes those its hazard declaration
// touches (hazard.Of), and forwarded, when wrapping, to the inner backend.
// It is the backend's OpsFunc.
func (b *Backend) op(s backend.Stream, c *backend.Call) error {
	d, err := c.Def()
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := dims(c.Op, c.Ints...); err != nil {
		return err
	}
	for _, W := range c.Quants {
		if err := W.Check(); err != nil {
			return fmt.Errorf("trace: %s: %w", c.Op, err)
		}
	}
	var args []arg
	for _, ta := range d.TensorArgs() {
		t, err := c.Tensor(ta.Name)
		if err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		n := int64(-1)
		if ta.Count != "" {
			if n, err = c.Eval(ta.Count); err != nil {
				return fmt.Errorf("trace: %w", err)
			}
		}
		args = append(args, arg{name: ta.Name, t: t, n: int(n), optional: ta.Optional})
	}
	op := Op{Method: c.Op, Family: Family(d.Family)}
	if d.FLOPs != "" {
		f, err := c.Eval(d.FLOPs)
		if err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		op.FLOPs = float64(f)
	}
	acc, err := hazard.Of(c)
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	op.Bytes = acc.Bytes()
	main, err := c.Tensor(d.DType)
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	op.DType = main.DType
	// Shapes: every tensor parameter's, a quantized matrix's by its codes.
	ti, qi := 0, 0
	for _, p := range c.Params() {
		switch p.Kind {
		case backend.KindTensors:
			op.Shapes = append(op.Shapes, shapes(c.Tensors[ti])...)
			ti++
		case backend.KindQuants:
			op.Shapes = append(op.Shapes, shapes(c.Quants[qi].Codes)...)
			qi++
		}
	}
	op.Gemm = gemmArgs(c)
	return b.do(s, op, args, func() error { return c.Run(b.inner, s) })
}

// gemmArgs is the layout and sizes of an op that is a product (one with M,
// N and K: Gemm, GemmQ, DenseGemm, DenseApply), zero for any other.
func gemmArgs(c *backend.Call) GemmArgs {
	M, okM := c.Int("M")
	N, okN := c.Int("N")
	K, okK := c.Int("K")
	if !okM || !okN || !okK {
		return GemmArgs{}
	}
	return GemmArgs{TransA: c.Bool("transA"), TransB: c.Bool("transB") || c.Bool("transW"), M: M, N: N, K: K}
}

// CopyH2D implements backend.Backend.
func (b *Backend) CopyH2D(s backend.Stream, dst backend.Tensor, src backend.HostBuffer, srcOff int) error {
	if src == nil || srcOff < 0 || srcOff+int(dst.Bytes()) > hostLen(src) {
		return fmt.Errorf("trace: CopyH2D: %d bytes at %d out of a host buffer of %d", dst.Bytes(), srcOff, lenOr0(src))
	}
	op := Op{Method: "CopyH2D", Family: Copy, DType: dst.DType, Shapes: shapes(dst), Bytes: by(dst), Link: H2D}
	err := b.do(s, op, []arg{need("dst", dst, -1)}, func() error { return b.inner.CopyH2D(s, dst, src, srcOff) })
	if err == nil && b.inner == nil {
		b.mu.Lock()
		b.traffic.H2D += dst.Bytes()
		b.mu.Unlock()
	}
	return err
}

// CopyD2H implements backend.Backend.
func (b *Backend) CopyD2H(s backend.Stream, dst backend.HostBuffer, dstOff int, src backend.Tensor) error {
	if dst == nil || dstOff < 0 || dstOff+int(src.Bytes()) > hostLen(dst) {
		return fmt.Errorf("trace: CopyD2H: %d bytes at %d out of a host buffer of %d", src.Bytes(), dstOff, lenOr0(dst))
	}
	op := Op{Method: "CopyD2H", Family: Copy, DType: src.DType, Shapes: shapes(src), Bytes: by(src), Link: D2H}
	err := b.do(s, op, []arg{need("src", src, -1)}, func() error { return b.inner.CopyD2H(s, dst, dstOff, src) })
	if err == nil && b.inner == nil {
		b.mu.Lock()
		b.traffic.D2H += src.Bytes()
		b.mu.Unlock()
	}
	return err
}

// CopyD2D implements backend.Backend.
func (b *Backend) CopyD2D(s backend.Stream, dst, src backend.Tensor) error {
	op := Op{Method: "CopyD2D", Family: Copy, DType: src.DType, Shapes: shapes(dst, src), Bytes: hazard.CopyD2D(dst, src).Bytes()}
	return b.do(s, op, []arg{need("dst", dst, -1), need("src", src, dst.Len())}, func() error { return b.inner.CopyD2D(s, dst, src) })
}

func lenOr0(h backend.HostBuffer) int {
	if h == nil {
		return 0
	}
	return hostLen(h)
}

var _ backend.Backend = (*Backend)(nil)
