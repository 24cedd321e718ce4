// What each op of the Backend contract reads and writes: the op table's
// declarations (backend.OpDef's Reads and Writes) as an Access (Of), and
// the copies', which are not ops of the table. The CPU backend's hazard
// mode and Wrap both use them. Use them only with arguments the op
// accepted (scratch must hold what the op uses): they slice, they do not
// check. Optional tensors (nil Buf) touch nothing; what an op touches only
// for some arguments (C of a Gemm with beta != 0) is declared only then,
// so that a legal schedule is not flagged.

package hazard

import "github.com/lsp-offload/lsp-offload/train/backend"

// Access is what one op reads and writes, named for hazard reports.
type Access struct {
	Name          string
	Reads, Writes []backend.Range
}

// Bytes is the bytes the access reads plus the bytes it writes: a range
// both read and written counts twice (write-allocate is not counted, as in
// STREAM). It is the one byte count of an op that the planner's tracer
// (train/trace) and the CPU calibration (train/calibrate) share, so that
// an efficiency measured by the one applies to the ops recorded by the
// other. Declarations name whole tensors: an op that touches part of one
// (the encoder's rows of the token table) is counted in full.
func (a Access) Bytes() int64 {
	var n int64
	for _, r := range a.Reads {
		n += r.Hi - r.Lo
	}
	for _, r := range a.Writes {
		n += r.Hi - r.Lo
	}
	return n
}

// ranges lists the ranges of the tensors that are present.
func ranges(ts ...backend.Tensor) []backend.Range {
	out := make([]backend.Range, 0, len(ts))
	for _, t := range ts {
		if t.Buf != nil {
			out = append(out, t.Range())
		}
	}
	return out
}

// Of is what a call reads and writes, as the op table declares it
// (backend.OpDef's Reads and Writes).
func Of(c *backend.Call) (Access, error) {
	d, err := c.Def()
	if err != nil {
		return Access{}, err
	}
	reads, writes, err := c.Uses()
	if err != nil {
		return Access{}, err
	}
	return Access{d.Short, reads, writes}, nil
}

// HostRange is the range of n bytes at off of a host buffer.
func HostRange(h backend.HostBuffer, off, n int) backend.Range {
	return backend.Range{Buf: h.ID(), Lo: int64(off), Hi: int64(off + n)}
}

func CopyD2D(dst, src backend.Tensor) Access { return Access{"copy d2d", ranges(src), ranges(dst)} }

func CopyH2D(dst backend.Tensor, src backend.HostBuffer, srcOff int) Access {
	return Access{"copy h2d", []backend.Range{HostRange(src, srcOff, int(dst.Bytes()))}, ranges(dst)}
}

func CopyD2H(dst backend.HostBuffer, dstOff int, src backend.Tensor) Access {
	return Access{"copy d2h", ranges(src), []backend.Range{HostRange(dst, dstOff, int(src.Bytes()))}}
}
