// The argument checks every backend makes before it enqueues an op, from
// the op table: the sizes, each tensor's storage kind and element count,
// a quantized matrix's tensors, and the rules of the ops whose arguments
// the counts do not say all of. The CPU and CUDA backends refuse the same
// calls for the same reasons with them; what each adds (its own buffers'
// liveness, the dtype table on CUDA, the fp32-only references on the CPU)
// it checks itself.

package backend

import (
	"fmt"
	"slices"
	"strings"
)

// CheckCall checks call c's arguments against the op table. prefix and
// name begin every error ("cuda: LayerNormForward: ...", "cpu: layernorm
// forward: ..."); live checks that a tensor is a view of the calling
// backend (op and arg name it for errors: it should build nothing unless
// the tensor fails, as it runs for every tensor of every enqueue). skip
// reports a call with nothing to do (no element to touch), which the
// backend should not launch. A rule may drop a tensor the op will not
// read (AdamW's sumSq without clipping, SparseValueGrad's M without Y)
// from c, so that it is neither checked nor used.
func CheckCall(c *Call, prefix, name string, live func(op, arg string, t Tensor) error) (skip bool, err error) {
	d, err := c.Def()
	if err != nil {
		return false, fmt.Errorf("%s: %w", prefix, err)
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%s: %s: %s", prefix, name, fmt.Sprintf(format, a...))
	}
	sig, _ := signature(c.Op)
	ints := 0
	for _, p := range sig.Params {
		if p.Kind != KindInts {
			continue
		}
		v := c.Ints[ints]
		ints++
		switch {
		case v < 1 && slices.Contains(d.positive, p.Name):
			return false, fail("%s=%d, want >= 1", p.Name, v)
		case v < 0:
			return false, fail("%s=%d is negative", p.Name, v)
		}
	}
	for _, W := range c.Quants {
		if err := W.Check(); err != nil {
			return false, fmt.Errorf("%s: %s: %w", prefix, name, err)
		}
		for _, t := range []Tensor{W.Codes, W.Absmax, W.Scale, W.Book} {
			if err := live(name, "W", t); err != nil {
				return false, err
			}
		}
	}
	if d.Rule != nil {
		var why string
		if skip, why = d.Rule(c); why != "" {
			return false, fail("%s", why)
		}
	}
	for i, a := range d.TensorArgs() {
		if err := checkTensor(c, d, a, c.Tensors[i], name, fail, live); err != nil {
			return false, err
		}
	}
	return skip, nil
}

// checkTensor checks one tensor argument: absent only when optional; a
// live view; I32 where its dtype group is, F64 scratch where its group is,
// else fp32 or bf16; exactly its count of elements, or at least it.
func checkTensor(c *Call, d *OpDef, a TensorArg, t Tensor, name string, fail func(string, ...any) error,
	live func(op, arg string, t Tensor) error) error {
	if t.Buf == nil && a.Optional {
		return nil
	}
	fixed, isFixed := DType(0), false // the one dtype of its group, if it has one
	for _, g := range d.Groups {
		if slices.Contains(g.Args, a.Name) && len(g.DTypes) == 1 {
			fixed, isFixed = g.DTypes[0], true
		}
	}
	n := -1
	if a.Count != "" {
		v, err := c.Eval(a.Count)
		if err != nil {
			return fail("%v", err)
		}
		n = int(v)
	}
	if a.AtLeast && isFixed && fixed != I32 { // scratch
		if n == 0 && t.Buf == nil {
			return nil
		}
		if err := live(name, a.Name, t); err != nil {
			return err
		}
		if t.DType != fixed {
			return fail("%s has dtype %v, want %v", a.Name, t.DType, fixed)
		}
		if t.Len() < n {
			return fail("%s has %d elements, the op needs %d (backend.%s)", a.Name, t.Len(), n, strings.Split(a.Count, "(")[0])
		}
		return nil
	}
	if err := live(name, a.Name, t); err != nil {
		return err
	}
	ints := isFixed && fixed == I32
	float := t.DType == F32 || t.DType == BF16
	if ints != (t.DType == I32) || !ints && !float {
		return fail("%s has dtype %v", a.Name, t.DType)
	}
	switch {
	case a.AtLeast && t.Len() < n:
		return fail("%s has %d elements, want at least %d", a.Name, t.Len(), n)
	case !a.AtLeast && n >= 0 && t.Len() != n:
		return fail("%s has %d elements, want %d", a.Name, t.Len(), n)
	}
	return nil
}

// The rules of the ops whose arguments the counts do not say all of
// (OpDef.Rule). Each returns why the call is refused ("" when it is not),
// and may report that there is nothing to do (skip) or drop a tensor the
// op will not read.

// encoderRule: the token table holds whole rows of C (its rows are the
// vocabulary), the position table at least T rows.
func encoderRule(c *Call) (bool, string) {
	T, C := c.Ints[1], c.Ints[2]
	names, tok, pos := [2]string{"wte", "wpe"}, c.Tensors[3], c.Tensors[4]
	if c.Op == "EncoderBackward" {
		names, tok, pos = [2]string{"dwte", "dwpe"}, c.Tensors[0], c.Tensors[1]
	}
	if len(tok.Shape) == 0 || tok.Len()%C != 0 || pos.Buf != nil && pos.Len() < T*C {
		return false, fmt.Sprintf("%s %v / %s %v do not fit C=%d T=%d", names[0], tok.Shape, names[1], pos.Shape, C, T)
	}
	return false, ""
}

// attentionRule: grouped heads, NH a positive multiple of KVH, and a known
// layout.
func attentionRule(c *Call) (bool, string) {
	NH, KVH, layout := c.Ints[2], c.Ints[3], c.Layouts[0]
	if NH <= 0 || KVH <= 0 || NH%KVH != 0 {
		return false, fmt.Sprintf("NH=%d query heads not a positive multiple of KVH=%d key/value heads", NH, KVH)
	}
	if layout != QKVFused && layout != QKVPlanar {
		return false, fmt.Sprintf("unknown qkv layout %v", layout)
	}
	return false, ""
}

// ropeRule: the pairs (i, i+HS/2) are rotated, so HS is even; nothing to
// rotate is nothing to do.
func ropeRule(c *Call) (bool, string) {
	B, T, NH, HS := c.Ints[0], c.Ints[1], c.Ints[2], c.Ints[3]
	if HS%2 != 0 {
		return false, fmt.Sprintf("head size HS=%d is odd", HS)
	}
	return B*T*NH*HS == 0, ""
}

// adamRule: bias correction needs a step of at least 1; sumSq is read only
// to clip, and must be there then.
func adamRule(c *Call) (bool, string) {
	p := c.Adams[0]
	if p.Step < 1 {
		return false, fmt.Sprintf("step %d, want >= 1", p.Step)
	}
	if p.MaxNorm <= 0 {
		c.Tensors[5] = Tensor{} // sumSq: not read
	} else if c.Tensors[5].Buf == nil {
		return false, fmt.Sprintf("MaxNorm %v clips, and sumSq is absent", p.MaxNorm)
	}
	return false, ""
}

// sparseApplyRule: each projector row holds r distinct columns of d.
func sparseApplyRule(c *Call) (bool, string) { return false, rowsFit(c.Ints[3], c.Ints[2]) }

// valueGradRule: as SparseApply's; M is read only with Y.
func valueGradRule(c *Call) (bool, string) {
	if c.Tensors[1].Buf == nil {
		c.Tensors[2] = Tensor{} // M: unused without Y
	} else if c.Tensors[2].Buf == nil {
		return false, "Y is present and M is absent"
	}
	return false, rowsFit(c.Ints[2], c.Ints[1])
}

func rowsFit(r, d int) string {
	if r > d {
		return fmt.Sprintf("r=%d > d=%d", r, d)
	}
	return ""
}

// gemmQRule: W's stored shape is op(W)'s, K x N or, with transW, N x K.
func gemmQRule(c *Call) (bool, string) {
	transW, N, K, W := c.Bools[0], c.Ints[1], c.Ints[2], c.Quants[0]
	rows, cols := K, N
	if transW {
		rows, cols = N, K
	}
	if W.Rows != rows || W.Cols != cols {
		return false, fmt.Sprintf("W is %d x %d, want %d x %d (transW %v, N %d, K %d)", W.Rows, W.Cols, rows, cols, transW, N, K)
	}
	return false, ""
}

// dequantizeRule: the elements asked for lie inside W.
func dequantizeRule(c *Call) (bool, string) {
	W, off, n := c.Quants[0], c.Ints[0], c.Tensors[0].Len()
	if off+n > W.Len() {
		return false, fmt.Sprintf("elements [%d, %d) of a %d x %d matrix", off, off+n, W.Rows, W.Cols)
	}
	return false, ""
}
