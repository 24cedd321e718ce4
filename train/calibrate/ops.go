// The non-GEMM compute ops of the Backend contract, timed at a model
// geometry's sizes, with their bytes (from the hazard declarations) and
// FLOPs (see the package doc).

package calibrate

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// OpSize is a model geometry at which the ops are timed: batch B x T,
// width C, NH query heads of C/NH and KVH key/value heads (0: NH) laid out
// as Layout says, vocabulary V, MLP width I (0: 4*C), and LSP's d and r
// (0: 512 and 16), capped per matrix as the engine caps them.
type OpSize struct {
	B, T, C, NH, KVH, V, I int
	Layout                 backend.QKVLayout
	D, R                   int
}

func (g OpSize) validate() error {
	if g.B < 1 || g.T < 1 || g.C < 1 || g.NH < 1 || g.V < 1 || g.KVH < 0 || g.I < 0 || g.D < 0 || g.R < 0 {
		return fmt.Errorf("sizes must be positive")
	}
	if g.KVH > 0 && g.NH%g.KVH != 0 {
		return fmt.Errorf("NH=%d must be a multiple of KVH=%d", g.NH, g.KVH)
	}
	if g.C%g.NH != 0 || (g.C/g.NH)%2 != 0 {
		return fmt.Errorf("C=%d must be NH=%d times an even head size", g.C, g.NH)
	}
	return nil
}

func (g OpSize) withDefaults() OpSize {
	if g.I == 0 {
		g.I = 4 * g.C
	}
	if g.KVH == 0 {
		g.KVH = g.NH
	}
	if g.D == 0 {
		g.D = 512
	}
	if g.R == 0 {
		g.R = 16
	}
	return g
}

// opCase is one op to time: its method, sizes, cost and a closure that
// enqueues it on tensors allocated beforehand.
type opCase struct {
	method, dims string
	flops        float64
	acc          hazard.Access
	run          func() error
}

// AccessBytes is an op's bytes as this package counts them:
// hazard.Access.Bytes, the count train/trace records too.
func AccessBytes(a hazard.Access) float64 { return float64(a.Bytes()) }

// opCases allocates g's tensors and lists the ops on them.
func (m *meter) opCases(g OpSize) ([]opCase, error) {
	B, T, C, NH, KVH, V, I := g.B, g.T, g.C, g.NH, g.KVH, g.V, g.I
	N, HS := B*T, C/NH
	a := &tensors{m: m}
	f32, i32 := a.f32, a.i32
	be, s := m.be, m.s
	nc := fmt.Sprintf("N=%d C=%d", N, C)
	ni := fmt.Sprintf("n=%d", N*I)

	x, y, dx, dy := f32("x", N*C, 0.5), f32("y", N*C, 0), f32("dx", N*C, 0), f32("dy", N*C, 0.25)
	w, bias, dw, dbias := f32("w", C, 1), f32("bias", C, 0), f32("dw", C, 0), f32("dbias", C, 0)
	mean, rstd := f32("mean", N, 0), f32("rstd", N, 1)
	lnScratch := f32("ln scratch", max(backend.LayerNormBackwardScratch(N, C), backend.RMSNormBackwardScratch(N, C)), 0)
	h, h2, dh := f32("h", N*I, 0.5), f32("h2", N*I, 0.5), f32("dh", N*I, 0.25)
	hout, dup := f32("hout", N*I, 0), f32("dup", N*I, 0)
	qkv, dqkv := f32("qkv", N*(NH+2*KVH)*HS, 0.5), f32("dqkv", N*(NH+2*KVH)*HS, 0)
	lse := f32("lse", B*NH*T, 0)
	attScratch := f32("attention scratch", backend.AttentionBackwardScratch(B, T, NH), 0)
	logits, losses := f32("logits", N*V, 0), f32("losses", N, 0)
	wte, wpe := f32("wte", V*C, 0.5), f32("wpe", T*C, 0.5)
	toks := make([]int32, N)
	for i := range toks {
		toks[i] = int32(i*7919) % int32(V)
	}
	inp := i32("tokens", toks)
	invFreq := f32("inv freq", HS/2, 0.01)
	nAdam := 12 * C * C // about one transformer block's parameters
	pw, pg, pm, pv := f32("adam w", nAdam, 0.5), f32("adam g", nAdam, 0.001), f32("adam m", nAdam, 0), f32("adam v", nAdam, 0)
	// The same ops on a vector of width C, a bias or a norm's weight: a
	// step runs many of these, and their fixed costs dominate them.
	sw, sg, sm, sv, sa := f32("small w", C, 0.5), f32("small g", C, 0.001), f32("small m", C, 0), f32("small v", C, 0), f32("small acc", C, 0)
	sumSq, flag := f32("sum sq", 1, 1), f32("flag", 1, 0)
	work := a.alloc("sum sq work", backend.SumSquaresWork, backend.F64)
	bt := fmt.Sprintf("B=%d T=%d NH=%d HS=%d", B, T, NH, HS)
	if a.err != nil {
		return nil, a.err
	}

	l := &caseList{be: be, s: s}
	l.add(ni, 0, backend.Calls.Fill(hout, 1))
	l.add(ni, 0, backend.Calls.Scale(hout, 1))
	l.add(ni, 0, backend.Calls.Add(hout, h, h2))
	l.add(ni, 0, backend.Calls.Accumulate(hout, h))
	// CopyD2D is a copy, not an op of the table: its access is hazard's.
	l.out = append(l.out, opCase{"CopyD2D", ni, 0, hazard.CopyD2D(hout, h), func() error { return be.CopyD2D(s, hout, h) }})
	nOC := fmt.Sprintf("N=%d OC=%d", N, C)
	l.add(nOC, 0, backend.Calls.AddBias(y, bias, N, C))
	l.add(nOC, 0, backend.Calls.BiasBackward(dbias, dy, N, C))
	l.add(nc, 0, backend.Calls.EncoderForward(y, inp, backend.Tensor{}, wte, wpe, B, T, C))
	l.add(nc, 0, backend.Calls.EncoderBackward(wte, wpe, dy, inp, backend.Tensor{}, B, T, C))
	l.add(nc, 0, backend.Calls.LayerNormForward(y, mean, rstd, x, w, bias, N, C, 1e-5))
	l.add(nc, 0, backend.Calls.LayerNormBackward(dx, dw, dbias, dy, x, w, mean, rstd, lnScratch, N, C))
	l.add(nc, 0, backend.Calls.RMSNormForward(y, rstd, x, w, N, C, 1e-5))
	l.add(nc, 0, backend.Calls.RMSNormBackward(dx, dw, dy, x, w, rstd, lnScratch, N, C))
	l.add(ni, 0, backend.Calls.GeluForward(hout, h))
	l.add(ni, 0, backend.Calls.GeluBackward(hout, h, dh))
	l.add(ni, 0, backend.Calls.SwiGLUForward(hout, h, h2))
	l.add(ni, 0, backend.Calls.SwiGLUBackward(hout, dup, dh, h, h2))
	l.add(bt, 0, backend.Calls.RoPEForward(y, x, backend.Tensor{}, invFreq, B, T, NH, HS))
	l.add(bt, 0, backend.Calls.RoPEBackward(dx, dy, backend.Tensor{}, invFreq, B, T, NH, HS))
	l.add(fmt.Sprintf("N=%d V=%d", N, V), 0, backend.Calls.CrossEntropyForwardBackward(losses, logits, inp, N, V, 1))
	l.add(fmt.Sprintf("n=%d", N), 0, backend.Calls.NonFiniteFlag(flag, losses))
	adamP := backend.AdamParams{LR: 1e-4, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 1, MaxNorm: 1}
	for _, v := range [][4]backend.Tensor{{pw, pg, pm, pv}, {sw, sg, sm, sv}} {
		w, g, m, u := v[0], v[1], v[2], v[3]
		n := fmt.Sprintf("n=%d", w.Len())
		l.add(n, 0, backend.Calls.SumSquares(sumSq, g, work))
		l.add(n, 0, backend.Calls.AdamW(w, backend.Tensor{}, g, m, u, sumSq, backend.Tensor{}, adamP))
	}
	l.add(fmt.Sprintf("n=%d", C), 0, backend.Calls.Accumulate(sa, sw))
	// Attention at T, T/2 and T/4 (for the rate as a function of T), the
	// same B*T tokens each time.
	for _, div := range []int{4, 2, 1} {
		if T%div != 0 || (div > 1 && T/div < 16) {
			continue
		}
		tb, bb := T/div, B*div
		dims := fmt.Sprintf("B=%d T=%d NH=%d KVH=%d HS=%d %v", bb, tb, NH, KVH, HS, g.Layout)
		fl := 2 * float64(bb*NH*HS) * float64(tb) * float64(tb+1)
		l.add(dims, fl, backend.Calls.AttentionForward(y, lse, qkv, backend.Tensor{}, bb, tb, NH, KVH, HS, g.Layout))
		l.add(dims, 2.5*fl, backend.Calls.AttentionBackward(dqkv, dy, qkv, y, lse, backend.Tensor{}, attScratch, bb, tb, NH, KVH, HS, g.Layout))
	}
	if l.err != nil {
		return nil, l.err
	}
	cases := l.out
	sp, err := m.sparseCases(g)
	if err != nil {
		return nil, err
	}
	dn, err := m.denseCases(g)
	if err != nil {
		return nil, err
	}
	if err := m.be.Synchronize(m.s); err != nil {
		return nil, err
	}
	return append(append(cases, sp...), dn...), nil
}

// denseCases are the dense projectors' products (svd, gaussian; GaLore's
// are the same products) for the MLP's first matrix (C x I), the sizes of
// sparseCases with P (C x d) dense: compress A [d,BT] = P^T X^T
// (DenseGemm, both transposed) and the apply W [C,I] += P T, T = Delta
// Q^T [d,I] (DenseApply).
func (m *meter) denseCases(g OpSize) ([]opCase, error) {
	BT, mm, n := g.B*g.T, g.C, g.I
	d := lsp.CapD(g.D, mm, n)
	be, s := m.be, m.s
	a := &tensors{m: m}
	P, X, A := a.f32("dense P", mm*d, 0.03), a.f32("dense X", BT*mm, 0.5), a.f32("dense A", d*BT, 0)
	T, W := a.f32("dense T", d*n, 0.01), a.f32("dense W", mm*n, 0.5)
	if a.err != nil {
		return nil, a.err
	}
	dims := fmt.Sprintf("BT=%d m=%d n=%d d=%d", BT, mm, n, d)
	l := &caseList{be: be, s: s}
	l.add(dims, 2*float64(d*BT)*float64(mm), backend.Calls.DenseGemm(true, true, d, BT, mm, 1, P, X, 0, A))
	l.add(dims, 2*float64(mm*n)*float64(d)+2*float64(mm*n), backend.Calls.DenseApply(false, false, mm, n, d, -1e-3, P, T, 1, W, backend.Tensor{}, 1, 1, 0))
	return l.out, l.err
}

// sparseCases are LSP's ops for the MLP's first matrix (C x I): compress
// its input X [BT,C] with P (C x d) and its output gradient dY [BT,I] with
// Q (I x d), S = A B, and the apply into W [C,I].
func (m *meter) sparseCases(g OpSize) ([]opCase, error) {
	BT, mm, n := g.B*g.T, g.C, g.I
	d := lsp.CapD(g.D, mm, n)
	r := lsp.CapR(g.R, d)
	be, s := m.be, m.s
	a := &tensors{m: m}
	var err error
	type proj struct{ colptr, rowidx, colval, idx, val backend.Tensor }
	mk := func(rows int) proj {
		idx, val := projector(rows, d, r)
		cp, ri, cv, e := cpu.SparseColumns(idx, val, rows, d, r)
		if e != nil && err == nil {
			err = e
		}
		return proj{a.i32("colptr", cp), a.i32("rowidx", ri), a.vals("colval", cv), a.i32("idx", idx), a.vals("val", val)}
	}
	P, Q := mk(mm), mk(n)
	X, dY := a.f32("X", BT*mm, 0.5), a.f32("dY", BT*n, 0.25)
	A, Bm, S := a.f32("A", d*BT, 0), a.f32("B", BT*d, 0), a.f32("S", d*d, 0)
	W, Tw := a.f32("W", mm*n, 0.5), a.f32("T", d*n, 0)
	if err := errors.Join(err, a.err); err != nil {
		return nil, err
	}
	dims := fmt.Sprintf("BT=%d m=%d n=%d d=%d r=%d", BT, mm, n, d, r)
	l := &caseList{be: be, s: s}
	l.add(dims, 2*float64(BT*mm*r), backend.Calls.SparseCompressA(A, X, P.colptr, P.rowidx, P.colval, BT, mm, d))
	l.add(dims, 2*float64(BT*n*r), backend.Calls.SparseCompressB(Bm, dY, Q.colptr, Q.rowidx, Q.colval, BT, n, d))
	l.add(dims, 2*float64(d*d)*float64(BT), backend.Calls.SparseS(S, A, Bm, BT, d, false))
	l.add(dims, 2*float64(d*n*r)+2*float64(mm*n*r)+2*float64(mm*n), backend.Calls.SparseApply(W, Tw, S, P.idx, P.val, Q.idx, Q.val, backend.Tensor{}, mm, n, d, r, 0, 0, 1, 1, 0))
	return l.out, l.err
}

// caseList builds the cases of ops from their calls: each case's
// method, its bytes (hazard.Of, the op table's declaration) and its launch
// on the meter's backend come from the one backend.Call, so that no op is
// named twice.
type caseList struct {
	be  backend.Backend
	s   backend.Stream
	out []opCase
	err error
}

func (l *caseList) add(dims string, flops float64, c *backend.Call) {
	acc, err := hazard.Of(c)
	if err != nil {
		l.err = errors.Join(l.err, err)
		return
	}
	be, s := l.be, l.s
	l.out = append(l.out, opCase{c.Op, dims, flops, acc, func() error { return c.Run(be, s) }})
}

// tensors allocates on a meter and keeps the first error, so that a list
// of allocations is checked once; after an error it returns empty tensors.
type tensors struct {
	m   *meter
	err error
}

func (a *tensors) alloc(name string, n int, dt backend.DType) backend.Tensor {
	if a.err != nil {
		return backend.Tensor{}
	}
	t, err := a.m.alloc(name, n, dt, 0)
	a.err = err
	return t
}

// f32 is n elements set to v.
func (a *tensors) f32(name string, n int, v float32) backend.Tensor {
	if a.err != nil {
		return backend.Tensor{}
	}
	t, err := a.m.alloc(name, n, backend.F32, v)
	a.err = err
	return t
}

// i32 and vals hold the given values.
func (a *tensors) i32(name string, vals []int32) backend.Tensor {
	t := a.alloc(name, len(vals), backend.I32)
	if a.err == nil {
		a.err = backend.UploadInt32(a.m.be, a.m.s, t, vals)
	}
	return t
}

func (a *tensors) vals(name string, vals []float32) backend.Tensor {
	t := a.alloc(name, len(vals), backend.F32)
	if a.err == nil {
		a.err = backend.Upload(a.m.be, a.m.s, t, vals)
	}
	return t
}

// projector is a (d,r)-sparse projector of rows rows in row storage: row i
// has r distinct columns spread over [0,d), values alternating +-1/sqrt(r).
func projector(rows, d, r int) ([]int32, []float32) {
	idx, val := make([]int32, rows*r), make([]float32, rows*r)
	stride := d / r
	v := float32(1 / math.Sqrt(float64(r)))
	for i := range rows {
		for k := range r {
			idx[i*r+k] = int32((i + k*stride) % d)
			val[i*r+k] = v
			if (i+k)%2 == 1 {
				val[i*r+k] = -v
			}
		}
	}
	return idx, val
}

// finishOps sets every sample's basis, efficiency and rate (GemmPeak,
// Memory.Triad and Overhead.Op known), and sorts them by method and size.
func (c *CPU) finishOps() {
	for i := range c.Ops {
		o := &c.Ops[i]
		o.Basis, o.Rate = "bytes", o.Bytes/o.Seconds
		if o.FLOPs > 0 {
			o.Basis, o.Rate = "flops", o.FLOPs/o.Seconds
		}
		o.Eff = c.ideal(o.FLOPs, o.Bytes) / max(o.Seconds-c.Overhead.Op, o.Seconds/100)
	}
	slices.SortStableFunc(c.Ops, func(a, b OpSample) int {
		if x := strings.Compare(a.Method, b.Method); x != 0 {
			return x
		}
		return cmp.Compare(c.ideal(a.FLOPs, a.Bytes), c.ideal(b.FLOPs, b.Bytes))
	})
}

// ideal is max(flops/GemmPeak, bytes/Triad): an op's time at the machine's
// best rates.
func (c CPU) ideal(flops, bytes float64) float64 {
	t := 0.0
	if flops > 0 && c.GemmPeak > 0 {
		t = flops / c.GemmPeak
	}
	if bytes > 0 && c.Memory.Triad > 0 {
		t = max(t, bytes/c.Memory.Triad)
	}
	return t
}

// OpEff is method's efficiency at an op of the given cost: interpolated
// linearly in log(ideal time) between the samples of method, clamped to
// the smallest and largest, samples of the same cost averaged
// geometrically; for a method not measured, the median of every sample's
// efficiency (false).
func (c CPU) OpEff(method string, flops, bytes float64) (float64, bool) {
	type pt struct{ x, y float64 }
	var pts []pt
	var all []float64
	for _, o := range c.Ops {
		all = append(all, o.Eff)
		if o.Method == method {
			pts = append(pts, pt{math.Log(max(c.ideal(o.FLOPs, o.Bytes), 1e-12)), math.Log(o.Eff)})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int { return cmp.Compare(a.x, b.x) })
	var xs, ys []float64
	var ns []int
	for _, p := range pts {
		if k := len(xs) - 1; k >= 0 && xs[k] == p.x { // samples of one cost: the geometric mean
			ys[k] += p.y
			ns[k]++
			continue
		}
		xs, ys, ns = append(xs, p.x), append(ys, p.y), append(ns, 1)
	}
	for k := range ys {
		ys[k] = math.Exp(ys[k] / float64(ns[k]))
	}
	if len(xs) == 0 {
		if len(all) == 0 {
			return 1, false
		}
		return median(all), false
	}
	return interp(xs, ys, math.Log(max(c.ideal(flops, bytes), 1e-12))), true
}

// OpTime is the seconds of one op of method costing flops and bytes:
// max(flops/GemmPeak, bytes/Triad)/Eff + Overhead.Op. For Gemm use
// GemmTime.
func (c CPU) OpTime(method string, flops, bytes float64) float64 {
	eff, _ := c.OpEff(method, flops, bytes)
	return c.ideal(flops, bytes)/eff + c.Overhead.Op
}

// SizeOf is the op geometry of spec at batch B x T (LSP's d and r left at
// their defaults): a GPT-2 or LLaMA configuration (whose head size must be
// its width over its heads, as in most).
func SizeOf(spec model.Spec, B, T int) (OpSize, error) {
	switch c := spec.(type) {
	case gpt2.Config:
		return OpSize{B: B, T: T, C: c.C, NH: c.NH, V: c.V, I: 4 * c.C}, nil
	case llama.Config:
		if c.HS()*c.Heads != c.Hidden {
			return OpSize{}, fmt.Errorf("calibrate: head size %d x %d heads is not the width %d", c.HS(), c.Heads, c.Hidden)
		}
		return OpSize{B: B, T: T, C: c.Hidden, NH: c.Heads, KVH: c.KVHeads, V: c.Vocab, I: c.Intermediate, Layout: backend.QKVPlanar}, nil
	}
	return OpSize{}, fmt.Errorf("calibrate: no op geometry for a %s model", spec.Family())
}
