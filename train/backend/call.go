// Calls: one op's arguments as data, so that a face of the ops that does
// the same for every op (the hazard wrapper, the tracer, the backends'
// checks) is written once against the op table (optable.go) instead of
// once per op. The per-op code that packs and unpacks a Call (Calls,
// OpsFunc's methods, Call.Run) is generated from the table (ops_gen.go).

package backend

//go:generate go run ./internal/opgen/cmd

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Call is one call of an Ops method: its name and its arguments after the
// stream, each in the field of its type, in the method's order.
type Call struct {
	Op      string
	Tensors []Tensor
	Ints    []int
	Floats  []float32
	Bools   []bool
	U64s    []uint64
	U32s    []uint32
	Quants  []Quant
	Layouts []QKVLayout
	Adams   []AdamParams
}

// OpsFunc implements Ops by handing every call to one function (its
// methods are generated, ops_gen.go). A backend that treats every op
// alike embeds one; the hazard wrapper embeds it above the backend it
// wraps, so that its ops are the ones promoted.
type OpsFunc func(s Stream, c *Call) error

var _ Ops = OpsFunc(nil)

// Kind is the Call field a parameter is held in.
type Kind uint8

// The kinds of parameters, one per Call field.
const (
	KindTensors Kind = iota
	KindInts
	KindFloats
	KindBools
	KindU64s
	KindU32s
	KindQuants
	KindLayouts
	KindAdams
)

// ParamDef is one parameter of an op after its stream.
type ParamDef struct {
	Name string
	Kind Kind
}

// Signature is one Ops method's parameters.
type Signature struct {
	Op     string
	Params []ParamDef
}

// Def is the call's entry in the op table.
func (c *Call) Def() (*OpDef, error) { return LookupOp(c.Op) }

// Tensor is the tensor parameter called name.
func (c *Call) Tensor(name string) (Tensor, error) {
	k, i, err := c.param(name)
	if err != nil {
		return Tensor{}, err
	}
	if k != KindTensors {
		return Tensor{}, fmt.Errorf("%s: %s is not a tensor", c.Op, name)
	}
	return c.Tensors[i], nil
}

// Params is the parameters of the call's op, in order (nil for an op not
// in the table).
func (c *Call) Params() []ParamDef {
	sig, err := signature(c.Op)
	if err != nil {
		return nil
	}
	return sig.Params
}

// Int is the int parameter called name; false when the op has none.
func (c *Call) Int(name string) (int, bool) {
	k, i, err := c.param(name)
	if err != nil || k != KindInts {
		return 0, false
	}
	return c.Ints[i], true
}

// Bool is the bool parameter called name; false when the op has none.
func (c *Call) Bool(name string) bool {
	k, i, err := c.param(name)
	return err == nil && k == KindBools && c.Bools[i]
}

// param finds a parameter's kind and its index in that kind's field.
func (c *Call) param(name string) (Kind, int, error) {
	i, ok := opIndex[c.Op]
	if !ok {
		return 0, 0, fmt.Errorf("%s: no such op", c.Op)
	}
	if r, ok := opParams[i][name]; ok {
		return r.kind, r.idx, nil
	}
	return 0, 0, fmt.Errorf("%s: no parameter %s", c.Op, name)
}

// paramRef is where a Call holds a parameter: its field and index there.
type paramRef struct {
	kind Kind
	idx  int
}

// opParams is, for each op (opIndex), where its Calls hold each of its
// parameters, worked out once: a call's checks look parameters up by name
// many times, on every enqueue.
var opParams = func() []map[string]paramRef {
	out := make([]map[string]paramRef, len(opSignatures))
	for i, s := range opSignatures {
		n := map[Kind]int{}
		out[i] = map[string]paramRef{}
		for _, p := range s.Params {
			out[i][p.Name] = paramRef{p.Kind, n[p.Kind]}
			n[p.Kind]++
		}
	}
	return out
}()

func signature(op string) (*Signature, error) {
	if i, ok := opIndex[op]; ok {
		return &opSignatures[i], nil
	}
	return nil, fmt.Errorf("%s: no such op", op)
}

// opIndex is each op's index in opSignatures and opTable (the same order).
var opIndex = func() map[string]int {
	m := map[string]int{}
	for i, s := range opSignatures {
		m[s.Op] = i
	}
	return m
}()

// Eval evaluates an expression of the table (a count, a cost) on the
// call: integers, the op's int parameters, + - * / (integer division)
// and parentheses, len(t) (the length of tensor parameter t, 0 when
// absent), has(t) (1 when tensor t is present, else 0), and the scratch
// sizes LayerNormBackwardScratch(N, C), RMSNormBackwardScratch(N, C),
// AttentionBackwardScratch(B, T, NH) and SumSquaresWork.
func (c *Call) Eval(expr string) (int64, error) {
	toks, ok := lexed.Load(expr)
	if !ok {
		toks, _ = lexed.LoadOrStore(expr, lex(expr))
	}
	e := evaluator{c: c, toks: toks.([]string)}
	v, err := e.sum()
	if err == nil && e.i < len(e.toks) {
		err = fmt.Errorf("unexpected %q", e.toks[e.i])
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %q: %w", c.Op, expr, err)
	}
	return v, nil
}

// lexed caches each expression's tokens: the table's expressions are few,
// and a call's checks evaluate several on every enqueue.
var lexed sync.Map // string -> []string

// lex splits an expression into names, numbers and one-character symbols.
func lex(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		ch := s[i]
		switch {
		case ch == ' ':
			i++
		case isWord(ch):
			j := i
			for j < len(s) && isWord(s[j]) {
				j++
			}
			out, i = append(out, s[i:j]), j
		default:
			out, i = append(out, s[i:i+1]), i+1
		}
	}
	return out
}

func isWord(ch byte) bool {
	return ch == '_' || ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z'
}

type evaluator struct {
	c    *Call
	toks []string
	i    int
}

func (e *evaluator) peek() string {
	if e.i < len(e.toks) {
		return e.toks[e.i]
	}
	return ""
}

func (e *evaluator) sum() (int64, error) {
	v, err := e.product()
	for err == nil && (e.peek() == "+" || e.peek() == "-") {
		op := e.toks[e.i]
		e.i++
		var w int64
		if w, err = e.product(); op == "+" {
			v += w
		} else {
			v -= w
		}
	}
	return v, err
}

func (e *evaluator) product() (int64, error) {
	v, err := e.factor()
	for err == nil && (e.peek() == "*" || e.peek() == "/") {
		op := e.toks[e.i]
		e.i++
		var w int64
		if w, err = e.factor(); err != nil {
			break
		}
		if op == "*" {
			v *= w
		} else if w == 0 {
			err = fmt.Errorf("division by zero")
		} else {
			v /= w
		}
	}
	return v, err
}

// factor is a number, a name, a call or a parenthesized sum.
func (e *evaluator) factor() (int64, error) {
	t := e.peek()
	e.i++
	switch {
	case t == "(":
		v, err := e.sum()
		if err == nil && e.peek() != ")" {
			err = fmt.Errorf("missing )")
		}
		e.i++
		return v, err
	case t == "" || !isWord(t[0]):
		return 0, fmt.Errorf("unexpected %q", t)
	case t[0] >= '0' && t[0] <= '9':
		return strconv.ParseInt(t, 10, 64)
	case e.peek() == "(":
		return e.call(t)
	case t == "SumSquaresWork":
		return SumSquaresWork, nil
	}
	k, i, err := e.c.param(t)
	if err != nil {
		return 0, err
	}
	if k != KindInts {
		return 0, fmt.Errorf("%s is not an int parameter", t)
	}
	return int64(e.c.Ints[i]), nil
}

// call evaluates fn(args...): len or has of a tensor, or a scratch size
// of up to three sums.
func (e *evaluator) call(fn string) (int64, error) {
	e.i++ // (
	if fn == "len" || fn == "has" {
		name := e.peek()
		e.i++
		if e.peek() != ")" {
			return 0, fmt.Errorf("%s takes one tensor", fn)
		}
		e.i++
		t, err := e.c.Tensor(name)
		switch {
		case err != nil || t.Buf == nil:
			return 0, err
		case fn == "has":
			return 1, nil
		}
		return int64(t.Len()), nil
	}
	var v [3]int
	n := 0
	for e.peek() != ")" {
		if e.i >= len(e.toks) || n == len(v) {
			return 0, fmt.Errorf("%s: missing ) or too many arguments", fn)
		}
		x, err := e.sum()
		if err != nil {
			return 0, err
		}
		v[n], n = int(x), n+1
		if e.peek() == "," {
			e.i++
		}
	}
	e.i++
	switch {
	case fn == "LayerNormBackwardScratch" && n == 2:
		return int64(LayerNormBackwardScratch(v[0], v[1])), nil
	case fn == "RMSNormBackwardScratch" && n == 2:
		return int64(RMSNormBackwardScratch(v[0], v[1])), nil
	case fn == "AttentionBackwardScratch" && n == 3:
		return int64(AttentionBackwardScratch(v[0], v[1], v[2])), nil
	}
	return 0, fmt.Errorf("no function %s of %d arguments", fn, n)
}

// cond reports whether a use's condition holds: a bool parameter that is
// true, a float32 parameter that is not 0, a tensor that is present, or
// MaxNorm, the AdamParams' clip, above 0.
func (c *Call) cond(name string) (bool, error) {
	if name == "MaxNorm" && len(c.Adams) == 1 {
		return c.Adams[0].MaxNorm > 0, nil
	}
	k, i, err := c.param(name)
	if err != nil {
		return false, err
	}
	switch k {
	case KindBools:
		return c.Bools[i], nil
	case KindFloats:
		return c.Floats[i] != 0, nil
	case KindTensors:
		return c.Tensors[i].Buf != nil, nil
	}
	return false, fmt.Errorf("%s: %s cannot be a condition", c.Op, name)
}

// Uses is what the call reads and writes (OpDef.Reads and Writes), as
// byte ranges, absent tensors touching nothing.
func (c *Call) Uses() (reads, writes []Range, err error) {
	d, err := c.Def()
	if err != nil {
		return nil, nil, err
	}
	if reads, err = c.ranges(d.Reads); err != nil {
		return nil, nil, err
	}
	writes, err = c.ranges(d.Writes)
	return reads, writes, err
}

// ranges resolves a list of uses: "t" the whole of tensor t, "t?cond"
// t when cond holds, "t:expr" t's first expr elements (scratch), "W.*"
// every tensor of the quantized matrix W.
func (c *Call) ranges(uses string) ([]Range, error) {
	var out []Range
	for _, u := range strings.Fields(uses) {
		name, cond, _ := strings.Cut(u, "?")
		name, count, _ := strings.Cut(name, ":")
		if cond != "" {
			ok, err := c.cond(cond)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
		}
		if q, ok := strings.CutSuffix(name, ".*"); ok {
			k, i, err := c.param(q)
			if err != nil || k != KindQuants {
				return nil, fmt.Errorf("%s: %s is not a quantized matrix", c.Op, q)
			}
			W := c.Quants[i]
			for _, t := range []Tensor{W.Codes, W.Absmax, W.Scale, W.Book} {
				if t.Buf != nil {
					out = append(out, t.Range())
				}
			}
			continue
		}
		t, err := c.Tensor(name)
		if err != nil {
			return nil, err
		}
		if t.Buf == nil {
			continue
		}
		if count != "" {
			n, err := c.Eval(count)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				continue
			}
			t = t.Slice(0, int(n))
		}
		out = append(out, t.Range())
	}
	return out, nil
}
