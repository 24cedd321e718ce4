//go:build cuda || cudasim

// The conformance table: every backend.Ops method run on this backend and
// on the CPU backend (the reference, in its KernelDTypes mode) from the
// same inputs, on a couple of shapes (ragged: not multiples of any tile)
// and the dtype mixes the kernels take, comparing every output. It is the
// CUDA backend's face of the conformance suite (docs/DESIGN.md, "The op
// table"; ggml's test-backend-ops): one case list that
// TestConformanceCoversEveryOp holds to the Ops interface, so an op
// without a case fails.
//
// Tolerances, |got - want| <= atol + rtol |want| (0, 0: bit for bit), as
// the kernel tests of kernels/simtest establish them against the same CPU
// ops (see each family's test file there for why):
//   - elementwise ops, bias ops, embedding, SparseCompress*, SparseS,
//     SparseApply: bit for bit in the simulated build. On a GPU nvcc may
//     contract the sparse sums into FMAs: there they get rtol 1e-6.
//   - Gemm, GemmQ: atol 2^-21 K, rtol 1e-5 (fp32 C) or 2^-8 (bf16 C).
//   - Dequantize: bit for bit, on a GPU too (non-contracted fp32).
//   - AttentionForward/Backward (bf16, every layout and grouping): rtol
//     2^-7, atol 2^-8 max|want| + 2^-14; lse atol 2^-16, rtol 2^-17.
//   - LayerNorm: atol 2e-5 (dweight, dbias: 1e-5 + 4e-7 N), rtol 1e-5;
//     bf16 outputs add 2^-7 to rtol.
//   - Gelu, SwiGLU: forward atol 1e-7, rtol 1e-6; backward atol 1e-6,
//     rtol 1e-5; bf16 adds 2^-7.
//   - RMSNorm: as LayerNorm (rstd rtol 1e-5).
//   - RoPE: atol 1e-6, rtol 1e-6 (sincosf against float64 sin and cos);
//     bf16 adds 2^-7.
//   - CrossEntropy: losses atol rtol 1e-5; dlogits atol 1e-6 scale, rtol
//     2e-5 (+ 2^-7 for bf16).
//   - SparseValueGrad, DenseGemm, DenseApply: bit for bit, on a GPU too
//     (non-contracted).
//   - SumSquares: rtol 2.4e-7 (two fp32 ulps). AdamW: atol 1e-30, rtol
//     5e-7 (fp32), 2^-7 (a bf16 param).

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// tspec is one tensor of a case: its values come from ints (I32), vals,
// gen, or else uniform in [-1, 1). off > 0 makes it a view starting off
// elements into its buffer (so its address is not the buffer's alignment).
type tspec struct {
	name string
	n    int
	dt   backend.DType
	gen  func(r *rand.Rand) float32
	vals []float32
	ints []int32
	off  int
}

// confPositions is B packed rows of T (backend.Positions): documents of
// 3, 1, 4, 2, 5, ... tokens, the last one of a row cut by T.
func confPositions(B, T int) []int32 {
	lens := []int{3, 1, 4, 2, 5}
	pos := make([]int32, 0, B*T)
	k := 0
	for range B {
		for t := 0; t < T; k++ {
			n := min(lens[k%len(lens)], T-t)
			for i := range n {
				pos = append(pos, int32(i))
			}
			t += n
		}
	}
	return pos
}

// offsetViews returns in with each tensor a view at an odd offset.
func offsetViews(in []tspec) []tspec {
	out := slices.Clone(in)
	for i := range out {
		out[i].off = 2*i + 1
	}
	return out
}

// quantSpecs are the tensors of a rows x cols matrix quantized (format f)
// by train/quant from random values: codes, absmax (their bytes in I32
// words), scale and book, for quantOf.
func quantSpecs(f backend.QFormat, rows, cols int, seed uint64) []tspec {
	r := newRand(seed)
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(r.NormFloat64() * (0.1 + float64(i/backend.QBlock%5)))
	}
	q, err := quant.Quantize(f, rows, cols, v)
	if err != nil {
		panic(err)
	}
	words := func(b []byte) []int32 {
		w := make([]int32, backend.Words(len(b)))
		for i, x := range b {
			w[i/4] |= int32(uint32(x) << (8 * (i % 4)))
		}
		return w
	}
	cw, aw := words(q.Codes), words(q.Absmax)
	return []tspec{{name: "codes", n: len(cw), dt: i32t, ints: cw}, {name: "absmax", n: len(aw), dt: i32t, ints: aw},
		{name: "scale", n: len(q.Scale), dt: f32, vals: q.Scale}, {name: "book", n: backend.QBookLen, dt: f32, vals: quant.Book()}}
}

// quantOf is the quantized matrix of quantSpecs' tensors.
func quantOf(f backend.QFormat, rows, cols int, x map[string]backend.Tensor) backend.Quant {
	return backend.Quant{Format: f, Rows: rows, Cols: cols, Codes: x["codes"], Absmax: x["absmax"], Scale: x["scale"], Book: x["book"]}
}

// check is one output compared after the op.
type check struct {
	name       string
	atol, rtol float64
}

type opCase struct {
	op    string // the Ops method
	shape string // what this case exercises
	in    []tspec
	run   func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error
	out   []check
}

func (c opCase) String() string { return c.op + " " + c.shape }

const (
	f32  = backend.F32
	bf   = backend.BF16
	i32t = backend.I32
	f64t = backend.F64
)

var bf16Ulp = math.Ldexp(1, -7)

// tolFor adds a bf16 rounding to rtol when the output is bf16.
func tolFor(dt backend.DType, rtol float64) float64 {
	if dt == bf {
		return rtol + bf16Ulp
	}
	return rtol
}

// exactOnSim is bit for bit in the simulated build and rtol 1e-6 on a GPU,
// where nvcc may contract sums into FMAs.
func exactOnSim(name string) check {
	if simulated {
		return check{name, 0, 0}
	}
	return check{name, 0, 1e-6}
}

func uniform(lo, hi float32) func(r *rand.Rand) float32 {
	return func(r *rand.Rand) float32 { return lo + (hi-lo)*r.Float32() }
}

// constant fills a tensor with v (a flag).
func constant(v float32) func(r *rand.Rand) float32 {
	return func(*rand.Rand) float32 { return v }
}

// nonFinite is uniform in [-1, 1) with a NaN or an infinity at one
// element in about 1 of every 300.
func nonFinite(r *rand.Rand) float32 {
	switch r.IntN(600) {
	case 0:
		return float32(math.NaN())
	case 1:
		return float32(math.Inf(-1))
	}
	return 2*r.Float32() - 1
}

func dtName(dts ...backend.DType) string {
	s := ""
	for i, d := range dts {
		if i > 0 {
			s += "/"
		}
		s += d.String()
	}
	return s
}

// conformanceCases is the table: one or more cases per Ops method.
func conformanceCases() []opCase {
	var cs []opCase
	add := func(c opCase) { cs = append(cs, c) }

	for _, n := range []int{1, 1037} {
		for _, dt := range []backend.DType{f32, bf} {
			sh := fmt.Sprintf("n=%d %v", n, dt)
			add(opCase{"Fill", sh, []tspec{{name: "t", n: n, dt: dt}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.Fill(s, x["t"], -0.3)
				}, []check{{"t", 0, 0}}})
			add(opCase{"Scale", sh, []tspec{{name: "t", n: n, dt: dt}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.Scale(s, x["t"], 1.0/3)
				}, []check{{"t", 0, 0}}})
			add(opCase{"GeluForward", sh, []tspec{{name: "out", n: n, dt: dt}, {name: "inp", n: n, dt: dt, gen: uniform(-6, 6)}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.GeluForward(s, x["out"], x["inp"])
				}, []check{{"out", 1e-7, tolFor(dt, 1e-6)}}})
			add(opCase{"GeluBackward", sh, []tspec{{name: "dinp", n: n, dt: dt}, {name: "inp", n: n, dt: dt, gen: uniform(-6, 6)},
				{name: "dout", n: n, dt: dt}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.GeluBackward(s, x["dinp"], x["inp"], x["dout"])
				}, []check{{"dinp", 1e-6, tolFor(dt, 1e-5)}}})
			add(opCase{"SumSquares", sh, []tspec{{name: "out", n: 1, dt: f32}, {name: "x", n: n * 5, dt: dt, gen: uniform(-3, 3)},
				{name: "work", n: backend.SumSquaresWork, dt: f64t}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.SumSquares(s, x["out"], x["x"], x["work"])
				}, []check{{"out", 0, 2.4e-7}}})
		}
	}
	for _, n := range []int{1, 1023, 1025, 5000} {
		for _, bad := range []bool{false, true} {
			gen := uniform(-1e30, 1e30)
			if bad {
				gen = nonFinite
			}
			add(opCase{"NonFiniteFlag", fmt.Sprintf("n=%d non-finite=%v", n, bad),
				[]tspec{{name: "flag", n: 1, dt: f32, gen: constant(7)}, {name: "x", n: n, dt: f32, gen: gen}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.NonFiniteFlag(s, x["flag"], x["x"])
				}, []check{{"flag", 0, 0}}})
		}
	}
	for _, d := range [][3]backend.DType{{f32, f32, f32}, {bf, f32, bf}, {bf, bf, bf}} {
		sh := fmt.Sprintf("n=1037 out/a/b %s", dtName(d[:]...))
		in := []tspec{{name: "out", n: 1037, dt: d[0]}, {name: "a", n: 1037, dt: d[1]}, {name: "b", n: 1037, dt: d[2]}}
		run := func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
			return be.Add(s, x["out"], x["a"], x["b"])
		}
		add(opCase{"Add", sh, in, run, []check{{"out", 0, 0}}})
		add(opCase{"Add", sh + " views at odd offsets", offsetViews(in), run, []check{{"out", 0, 0}}})
		sh = fmt.Sprintf("n=1037 dst/src %s", dtName(d[0], d[2]))
		add(opCase{"Accumulate", sh, []tspec{{name: "dst", n: 1037, dt: d[0]}, {name: "src", n: 1037, dt: d[2]}},
			func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.Accumulate(s, x["dst"], x["src"])
			}, []check{{"dst", 0, 0}}})
	}
	for _, sz := range [][2]int{{13, 70}, {1, 5}} {
		N, OC := sz[0], sz[1]
		for _, d := range [][2]backend.DType{{f32, f32}, {bf, f32}, {f32, bf}} {
			sh := fmt.Sprintf("N=%d OC=%d %s", N, OC, dtName(d[:]...))
			add(opCase{"AddBias", sh, []tspec{{name: "out", n: N * OC, dt: d[0]}, {name: "bias", n: OC, dt: d[1]}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.AddBias(s, x["out"], x["bias"], N, OC)
				}, []check{{"out", 0, 0}}})
			add(opCase{"BiasBackward", sh, []tspec{{name: "dbias", n: OC, dt: d[0]}, {name: "dout", n: N * OC, dt: d[1]}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.BiasBackward(s, x["dbias"], x["dout"], N, OC)
				}, []check{{"dbias", 0, 0}}})
		}
	}
	for _, sz := range [][4]int{{2, 5, 12, 17}, {1, 3, 8, 1}} {
		B, T, C, V := sz[0], sz[1], sz[2], sz[3]
		token := func(r *rand.Rand) float32 { return float32(r.IntN(V)) }
		for _, dt := range []backend.DType{f32, bf} {
			sh := fmt.Sprintf("B=%d T=%d C=%d V=%d %v", B, T, C, V, dt)
			add(opCase{"EncoderForward", sh, []tspec{{name: "out", n: B * T * C, dt: dt}, {name: "inp", n: B * T, dt: i32t, gen: token},
				{name: "wte", n: V * C, dt: dt}, {name: "wpe", n: T * C, dt: dt}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.EncoderForward(s, x["out"], x["inp"], backend.Tensor{}, x["wte"], x["wpe"], B, T, C)
				}, []check{{"out", 0, 0}}})
			add(opCase{"EncoderForward", sh + " packed", []tspec{{name: "out", n: B * T * C, dt: dt}, {name: "inp", n: B * T, dt: i32t, gen: token},
				{name: "wte", n: V * C, dt: dt}, {name: "wpe", n: T * C, dt: dt}, {name: "pos", n: B * T, dt: i32t, ints: confPositions(B, T)}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.EncoderForward(s, x["out"], x["inp"], x["pos"], x["wte"], x["wpe"], B, T, C)
				}, []check{{"out", 0, 0}}})
			for _, dw := range []backend.DType{f32, bf} { // parameter gradients; dout is dt
				add(opCase{"EncoderBackward", fmt.Sprintf("%s dwte/dwpe %v", sh, dw), []tspec{{name: "dwte", n: V * C, dt: dw}, {name: "dwpe", n: T * C, dt: dw},
					{name: "dout", n: B * T * C, dt: dt}, {name: "inp", n: B * T, dt: i32t, gen: token}},
					func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.EncoderBackward(s, x["dwte"], x["dwpe"], x["dout"], x["inp"], backend.Tensor{}, B, T, C)
					}, []check{{"dwte", 0, 0}, {"dwpe", 0, 0}}})
				add(opCase{"EncoderBackward", fmt.Sprintf("%s dwte/dwpe %v packed", sh, dw), []tspec{{name: "dwte", n: V * C, dt: dw}, {name: "dwpe", n: T * C, dt: dw},
					{name: "dout", n: B * T * C, dt: dt}, {name: "inp", n: B * T, dt: i32t, gen: token}, {name: "pos", n: B * T, dt: i32t, ints: confPositions(B, T)}},
					func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.EncoderBackward(s, x["dwte"], x["dwpe"], x["dout"], x["inp"], x["pos"], B, T, C)
					}, []check{{"dwte", 0, 0}, {"dwpe", 0, 0}}})
			}
		}
	}
	for _, sz := range [][2]int{{37, 95}, {1, 1}} {
		N, C := sz[0], sz[1]
		// values, activation gradients, parameter gradients
		for _, d := range [][3]backend.DType{{f32, f32, f32}, {bf, f32, f32}, {bf, bf, bf}, {bf, bf, f32}} {
			x, g, dw := d[0], d[1], d[2]
			sh := fmt.Sprintf("N=%d C=%d x %v", N, C, x)
			ln := []tspec{{name: "out", n: N * C, dt: x}, {name: "mean", n: N, dt: f32}, {name: "rstd", n: N, dt: f32},
				{name: "inp", n: N * C, dt: x, gen: uniform(-2, 3)}, {name: "w", n: C, dt: x, gen: uniform(-1.5, 1.5)}, {name: "b", n: C, dt: x}}
			forward := func(be backend.Backend, s backend.Stream, t map[string]backend.Tensor) error {
				return be.LayerNormForward(s, t["out"], t["mean"], t["rstd"], t["inp"], t["w"], t["b"], N, C, 1e-5)
			}
			if g == f32 && dw == f32 {
				add(opCase{"LayerNormForward", sh, ln, forward,
					[]check{{"out", 2e-5, tolFor(x, 1e-5)}, {"mean", 1e-5, 0}, {"rstd", 0, 1e-5}}})
			}
			sh = fmt.Sprintf("N=%d C=%d x %v g %v dw %v", N, C, x, g, dw)
			pt := 1e-5 + 4e-7*float64(N)
			add(opCase{"LayerNormBackward", sh, append(slices.Clone(ln), tspec{name: "dinp", n: N * C, dt: g}, tspec{name: "dw", n: C, dt: dw},
				tspec{name: "db", n: C, dt: dw}, tspec{name: "dout", n: N * C, dt: g},
				tspec{name: "scratch", n: backend.LayerNormBackwardScratch(N, C), dt: f32}),
				func(be backend.Backend, s backend.Stream, t map[string]backend.Tensor) error {
					if err := forward(be, s, t); err != nil {
						return err
					}
					return be.LayerNormBackward(s, t["dinp"], t["dw"], t["db"], t["dout"], t["inp"], t["w"], t["mean"], t["rstd"], t["scratch"], N, C)
				}, []check{{"dinp", 2e-5, tolFor(g, 1e-5)}, {"dw", pt, tolFor(dw, 1e-5)}, {"db", pt, tolFor(dw, 1e-5)}}})
		}
	}
	for _, sz := range [][3]int{{17, 23, 40}, {1, 9, 3}} {
		M, N, K := sz[0], sz[1], sz[2]
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}} {
			for _, cdt := range []backend.DType{f32, bf} {
				beta := float32(0)
				if tr[0] {
					beta = 0.5
				}
				sh := fmt.Sprintf("M=%d N=%d K=%d transA=%v transB=%v beta=%v C %v", M, N, K, tr[0], tr[1], beta, cdt)
				rtol := 1e-5
				if cdt == bf {
					rtol = 1.0 / 256
				}
				in := []tspec{{name: "A", n: M * K, dt: bf}, {name: "B", n: K * N, dt: bf}, {name: "C", n: M * N, dt: cdt}}
				run := func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.Gemm(s, tr[0], tr[1], M, N, K, 0.75, x["A"], x["B"], beta, x["C"])
				}
				out := []check{{"C", math.Ldexp(float64(K), -21), rtol}}
				add(opCase{"Gemm", sh, in, run, out})
				if !tr[1] {
					add(opCase{"Gemm", sh + " views at odd offsets", offsetViews(in), run, out})
				}
			}
		}
	}
	// GemmQ and Dequantize: a matrix quantized by train/quant from random
	// values, stored [K][N] or [N][K]; ragged sizes (partial chunks,
	// blocks and groups; 130 x 129: more than one scale group).
	for _, sz := range [][3]int{{17, 33, 70}, {1, 9, 3}, {5, 130, 129}} {
		M, N, K := sz[0], sz[1], sz[2]
		for fi, format := range []backend.QFormat{backend.NF4, backend.Int8} {
			for _, transW := range []bool{false, true} {
				rows, cols := K, N
				if transW {
					rows, cols = N, K
				}
				qin := quantSpecs(format, rows, cols, uint64(M*1000+N*10+fi))
				for _, cdt := range []backend.DType{f32, bf} {
					beta := float32(0)
					rtol := 1e-5
					if cdt == bf {
						beta, rtol = 0.5, 1.0/256
					}
					sh := fmt.Sprintf("%v M=%d N=%d K=%d transW=%v beta=%v C %v", format, M, N, K, transW, beta, cdt)
					in := append([]tspec{{name: "A", n: M * K, dt: bf}, {name: "C", n: M * N, dt: cdt}}, qin...)
					run := func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.GemmQ(s, transW, M, N, K, 0.75, x["A"], quantOf(format, rows, cols, x), beta, x["C"])
					}
					out := []check{{"C", math.Ldexp(float64(K), -21), rtol}}
					add(opCase{"GemmQ", sh, in, run, out})
					if !transW && cdt == f32 {
						add(opCase{"GemmQ", sh + " views at odd offsets", offsetViews(in), run, out})
					}
				}
			}
			n := M * N
			for _, dt := range []backend.DType{f32, bf} {
				for _, r := range [][2]int{{0, n}, {n / 3, n - n/3 - 1}} {
					off, cnt := r[0], r[1]
					sh := fmt.Sprintf("%v %dx%d [%d,%d) %v", format, M, N, off, off+cnt, dt)
					in := append([]tspec{{name: "out", n: cnt, dt: dt}}, quantSpecs(format, M, N, uint64(n+fi))...)
					run := func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.Dequantize(s, quantOf(format, M, N, x), off, x["out"])
					}
					add(opCase{"Dequantize", sh, in, run, []check{{"out", 0, 0}}})
					if off > 0 {
						add(opCase{"Dequantize", sh + " views at odd offsets", offsetViews(in), run, []check{{"out", 0, 0}}})
					}
				}
			}
		}
	}
	// Attention: GPT-2's heads (KVH == NH, fused rows; HS 16 generic, 64
	// tensor cores) and grouped-query heads (KVH 1, 2, 4 of NH 4) in both
	// layouts, on ragged T.
	for _, sz := range []struct {
		B, T, NH, KVH, HS int
		layout            backend.QKVLayout
	}{
		{2, 9, 2, 2, 16, backend.QKVFused}, {1, 5, 2, 2, 64, backend.QKVFused},
		{2, 7, 4, 1, 8, backend.QKVPlanar}, {2, 7, 4, 2, 16, backend.QKVFused}, {1, 7, 4, 4, 16, backend.QKVPlanar},
		{1, 7, 4, 2, 64, backend.QKVPlanar}, {2, 7, 4, 1, 64, backend.QKVFused},
	} {
		B, T, NH, KVH, HS, layout := sz.B, sz.T, sz.NH, sz.KVH, sz.HS, sz.layout
		sh := fmt.Sprintf("B=%d T=%d NH=%d KVH=%d HS=%d %v", B, T, NH, KVH, HS, layout)
		nqkv, nout := B*T*(NH+2*KVH)*HS, B*T*NH*HS
		att := []tspec{{name: "out", n: nout, dt: bf}, {name: "lse", n: B * NH * T, dt: f32}, {name: "qkv", n: nqkv, dt: bf, gen: uniform(-2, 2)}}
		forward := func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
			return be.AttentionForward(s, x["out"], x["lse"], x["qkv"], backend.Tensor{}, B, T, NH, KVH, HS, layout)
		}
		attOut := []check{{"out", -1, 0}, {"lse", math.Ldexp(1, -16), math.Ldexp(1, -17)}}
		add(opCase{"AttentionForward", sh, att, forward, attOut})
		add(opCase{"AttentionForward", sh + " views at odd offsets", offsetViews(att), forward, attOut})
		add(opCase{"AttentionBackward", sh, append(slices.Clone(att), tspec{name: "dqkv", n: nqkv, dt: bf},
			tspec{name: "dout", n: nout, dt: bf}, tspec{name: "scratch", n: backend.AttentionBackwardScratch(B, T, NH), dt: f32}),
			func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
				if err := forward(be, s, x); err != nil {
					return err
				}
				return be.AttentionBackward(s, x["dqkv"], x["dout"], x["qkv"], x["out"], x["lse"], backend.Tensor{}, x["scratch"], B, T, NH, KVH, HS, layout)
			}, []check{{"dqkv", -1, 0}}})
		// Packed rows: attention within each document.
		attP := append(slices.Clone(att), tspec{name: "pos", n: B * T, dt: i32t, ints: confPositions(B, T)})
		forwardP := func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
			return be.AttentionForward(s, x["out"], x["lse"], x["qkv"], x["pos"], B, T, NH, KVH, HS, layout)
		}
		add(opCase{"AttentionForward", sh + " packed", attP, forwardP, attOut})
		add(opCase{"AttentionBackward", sh + " packed", append(slices.Clone(attP), tspec{name: "dqkv", n: nqkv, dt: bf},
			tspec{name: "dout", n: nout, dt: bf}, tspec{name: "scratch", n: backend.AttentionBackwardScratch(B, T, NH), dt: f32}),
			func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
				if err := forwardP(be, s, x); err != nil {
					return err
				}
				return be.AttentionBackward(s, x["dqkv"], x["dout"], x["qkv"], x["out"], x["lse"], x["pos"], x["scratch"], B, T, NH, KVH, HS, layout)
			}, []check{{"dqkv", -1, 0}}})
	}
	// SwiGLU: gate over both tails of the sigmoid; the backward also with
	// dgate aliasing dout (what the model does).
	for _, n := range []int{1, 1037} {
		for _, d := range [][2]backend.DType{{f32, f32}, {bf, bf}, {bf, f32}} { // values, gradients
			x, g := d[0], d[1]
			sw := []tspec{{name: "out", n: n, dt: x}, {name: "gate", n: n, dt: x, gen: uniform(-6, 6)}, {name: "up", n: n, dt: x, gen: uniform(-3, 3)}}
			if g == x {
				add(opCase{"SwiGLUForward", fmt.Sprintf("n=%d %v", n, x), sw,
					func(be backend.Backend, s backend.Stream, t map[string]backend.Tensor) error {
						return be.SwiGLUForward(s, t["out"], t["gate"], t["up"])
					}, []check{{"out", 1e-7, tolFor(x, 1e-6)}}})
			}
			sh := fmt.Sprintf("n=%d x %v g %v", n, x, g)
			in := append(slices.Clone(sw[1:]), tspec{name: "dgate", n: n, dt: g}, tspec{name: "dup", n: n, dt: g}, tspec{name: "dout", n: n, dt: g})
			add(opCase{"SwiGLUBackward", sh, in,
				func(be backend.Backend, s backend.Stream, t map[string]backend.Tensor) error {
					return be.SwiGLUBackward(s, t["dgate"], t["dup"], t["dout"], t["gate"], t["up"])
				}, []check{{"dgate", 1e-6, tolFor(g, 1e-5)}, {"dup", 1e-6, tolFor(g, 1e-5)}}})
			add(opCase{"SwiGLUBackward", sh + " dgate aliases dout", in,
				func(be backend.Backend, s backend.Stream, t map[string]backend.Tensor) error {
					return be.SwiGLUBackward(s, t["dout"], t["dup"], t["dout"], t["gate"], t["up"])
				}, []check{{"dout", 1e-6, tolFor(g, 1e-5)}, {"dup", 1e-6, tolFor(g, 1e-5)}}})
		}
	}
	// RMSNorm: the dtype mixes of LayerNorm; the backward accumulates into
	// random dinp and dweight.
	for _, sz := range [][2]int{{37, 95}, {1, 1}} {
		N, C := sz[0], sz[1]
		for _, d := range [][3]backend.DType{{f32, f32, f32}, {bf, f32, f32}, {bf, bf, bf}, {bf, bf, f32}} {
			x, g, dw := d[0], d[1], d[2]
			rn := []tspec{{name: "out", n: N * C, dt: x}, {name: "rstd", n: N, dt: f32},
				{name: "inp", n: N * C, dt: x, gen: uniform(-2, 3)}, {name: "w", n: C, dt: x, gen: uniform(-1.5, 1.5)}}
			forward := func(be backend.Backend, s backend.Stream, t map[string]backend.Tensor) error {
				return be.RMSNormForward(s, t["out"], t["rstd"], t["inp"], t["w"], N, C, 1e-5)
			}
			if g == f32 && dw == f32 {
				add(opCase{"RMSNormForward", fmt.Sprintf("N=%d C=%d x %v", N, C, x), rn, forward,
					[]check{{"out", 2e-5, tolFor(x, 1e-5)}, {"rstd", 0, 1e-5}}})
			}
			pt := 1e-5 + 4e-7*float64(N)
			add(opCase{"RMSNormBackward", fmt.Sprintf("N=%d C=%d x %v g %v dw %v", N, C, x, g, dw),
				append(slices.Clone(rn), tspec{name: "dinp", n: N * C, dt: g}, tspec{name: "dw", n: C, dt: dw},
					tspec{name: "dout", n: N * C, dt: g}, tspec{name: "scratch", n: backend.RMSNormBackwardScratch(N, C), dt: f32}),
				func(be backend.Backend, s backend.Stream, t map[string]backend.Tensor) error {
					if err := forward(be, s, t); err != nil {
						return err
					}
					return be.RMSNormBackward(s, t["dinp"], t["dw"], t["dout"], t["inp"], t["w"], t["rstd"], t["scratch"], N, C)
				}, []check{{"dinp", 2e-5, tolFor(g, 1e-5)}, {"dw", pt, tolFor(dw, 1e-5)}}})
		}
	}
	// RoPE: q-shaped and k-shaped tensors (NH 4 and 1), plain inverse
	// frequencies and ones rescaled per pair (as rope_scaling does), out
	// of place and in place.
	for _, sz := range [][4]int{{2, 7, 4, 16}, {1, 5, 1, 8}, {1, 1, 1, 2}} {
		B, T, NH, HS := sz[0], sz[1], sz[2], sz[3]
		n := B * T * NH * HS
		for fi, inv := range [][]float32{cpu.RoPEInvFreq(HS, 10000), scaledInvFreq(cpu.RoPEInvFreq(HS, 500000))} {
			for _, dt := range []backend.DType{f32, bf} {
				sh := fmt.Sprintf("B=%d T=%d NH=%d HS=%d freqs %d %v", B, T, NH, HS, fi, dt)
				in := []tspec{{name: "out", n: n, dt: dt}, {name: "inp", n: n, dt: dt, gen: uniform(-2, 2)}, {name: "invFreq", n: HS / 2, dt: f32, vals: inv}}
				tol := check{"out", 1e-6, tolFor(dt, 1e-6)}
				add(opCase{"RoPEForward", sh, in, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.RoPEForward(s, x["out"], x["inp"], backend.Tensor{}, x["invFreq"], B, T, NH, HS)
				}, []check{tol}})
				add(opCase{"RoPEForward", sh + " in place", in, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.RoPEForward(s, x["inp"], x["inp"], backend.Tensor{}, x["invFreq"], B, T, NH, HS)
				}, []check{{"inp", tol.atol, tol.rtol}}})
				add(opCase{"RoPEBackward", sh, in, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.RoPEBackward(s, x["out"], x["inp"], backend.Tensor{}, x["invFreq"], B, T, NH, HS)
				}, []check{tol}})
				add(opCase{"RoPEBackward", sh + " in place", in, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.RoPEBackward(s, x["inp"], x["inp"], backend.Tensor{}, x["invFreq"], B, T, NH, HS)
				}, []check{{"inp", tol.atol, tol.rtol}}})
				inP := append(slices.Clone(in), tspec{name: "pos", n: B * T, dt: i32t, ints: confPositions(B, T)})
				add(opCase{"RoPEForward", sh + " packed", inP, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.RoPEForward(s, x["out"], x["inp"], x["pos"], x["invFreq"], B, T, NH, HS)
				}, []check{tol}})
				add(opCase{"RoPEBackward", sh + " packed", inP, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.RoPEBackward(s, x["out"], x["inp"], x["pos"], x["invFreq"], B, T, NH, HS)
				}, []check{tol}})
			}
		}
	}
	for _, sz := range [][2]int{{9, 257}, {3, 1}} {
		N, V := sz[0], sz[1]
		target := func(r *rand.Rand) float32 { return float32(r.IntN(V+1) - 1) } // some ignored (-1)
		for _, dt := range []backend.DType{f32, bf} {
			for _, scale := range []float32{0, 0.125} {
				sh := fmt.Sprintf("N=%d V=%d %v scale=%v", N, V, dt, scale)
				atol := 1e-6 * float64(scale)
				add(opCase{"CrossEntropyForwardBackward", sh, []tspec{{name: "losses", n: N, dt: f32},
					{name: "logits", n: N * V, dt: dt, gen: uniform(-4, 4)}, {name: "targets", n: N, dt: i32t, gen: target}},
					func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.CrossEntropyForwardBackward(s, x["losses"], x["logits"], x["targets"], N, V, scale)
					}, []check{{"losses", 1e-5, 1e-5}, {"logits", atol, tolFor(dt, 2e-5)}}})
			}
		}
	}
	for _, n := range []int{1, 1037} {
		for _, d := range []struct {
			param, grad backend.DType
			master      bool
			maxNorm     float32
			skip        float32 // the skip flag's value; -1: no flag
		}{{f32, f32, false, 0, -1}, {bf, bf, true, 0, 0}, {bf, f32, true, 0.5, -1}, {f32, bf, false, 1e6, 0}, {bf, bf, true, 0.5, 1}, {f32, f32, false, 0, 1}} {
			sh := fmt.Sprintf("n=%d param %v grad %v master=%v maxNorm=%v skip=%v", n, d.param, d.grad, d.master, d.maxNorm, d.skip)
			in := []tspec{{name: "param", n: n, dt: d.param}, {name: "grad", n: n, dt: d.grad}, {name: "m", n: n, dt: f32, gen: uniform(-0.1, 0.1)},
				{name: "v", n: n, dt: f32, gen: uniform(0, 0.01)}, {name: "sumSq", n: 1, dt: f32, gen: uniform(1, 4)}}
			if d.master {
				in = append(in, tspec{name: "master", n: n, dt: f32})
			}
			if d.skip >= 0 {
				in = append(in, tspec{name: "skip", n: 1, dt: f32, gen: constant(d.skip)})
			}
			p := backend.AdamParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, MaxNorm: d.maxNorm}
			out := []check{{"param", 1e-30, tolFor(d.param, 5e-7)}, {"m", 1e-30, 5e-7}, {"v", 1e-30, 5e-7}}
			if d.master {
				out = append(out, check{"master", 1e-30, 5e-7})
			}
			add(opCase{"AdamW", sh, in, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.AdamW(s, x["param"], x["master"], x["grad"], x["m"], x["v"], x["sumSq"], x["skip"], p)
			}, out})
		}
	}
	for _, sz := range [][5]int{{37, 70, 45, 12, 3}, {1, 1, 1, 1, 1}} {
		BT, m, n, d, r := sz[0], sz[1], sz[2], sz[3], sz[4]
		rng := newRand(uint64(BT*1000 + m))
		pidx, pval := sparseRows(rng, m, d, r)
		qidx, qval := sparseRows(rng, n, d, r)
		pcp, pri, pcv, err := cpu.SparseColumns(pidx, pval, m, d, r)
		if err != nil {
			panic(err)
		}
		qcp, qri, qcv, err := cpu.SparseColumns(qidx, qval, n, d, r)
		if err != nil {
			panic(err)
		}
		for _, dt := range []backend.DType{f32, bf} {
			sh := fmt.Sprintf("BT=%d m=%d n=%d d=%d r=%d %v", BT, m, n, d, r, dt)
			add(opCase{"SparseCompressA", sh, []tspec{{name: "A", n: d * BT, dt: f32}, {name: "X", n: BT * m, dt: dt},
				{name: "colptr", n: d + 1, dt: i32t, ints: pcp}, {name: "rowidx", n: len(pri), dt: i32t, ints: pri}, {name: "colval", n: len(pcv), dt: f32, vals: pcv}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.SparseCompressA(s, x["A"], x["X"], x["colptr"], x["rowidx"], x["colval"], BT, m, d)
				}, []check{exactOnSim("A")}})
			add(opCase{"SparseCompressB", sh, []tspec{{name: "B", n: BT * d, dt: f32}, {name: "dY", n: BT * n, dt: dt},
				{name: "colptr", n: d + 1, dt: i32t, ints: qcp}, {name: "rowidx", n: len(qri), dt: i32t, ints: qri}, {name: "colval", n: len(qcv), dt: f32, vals: qcv}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.SparseCompressB(s, x["B"], x["dY"], x["colptr"], x["rowidx"], x["colval"], BT, n, d)
				}, []check{exactOnSim("B")}})
			for _, skip := range []float32{-1, 0, 1} { // -1: no flag
				sh = fmt.Sprintf("m=%d n=%d d=%d r=%d W %v skip=%v", m, n, d, r, dt, skip)
				in := []tspec{{name: "W", n: m * n, dt: dt}, {name: "T", n: d * n, dt: f32}, {name: "Delta", n: d * d, dt: f32},
					{name: "pidx", n: m * r, dt: i32t, ints: pidx}, {name: "pval", n: m * r, dt: f32, vals: pval},
					{name: "qidx", n: n * r, dt: i32t, ints: qidx}, {name: "qval", n: n * r, dt: f32, vals: qval}}
				if skip >= 0 {
					in = append(in, tspec{name: "skip", n: 1, dt: f32, gen: constant(skip)})
				}
				add(opCase{"SparseApply", sh, in,
					func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.SparseApply(s, x["W"], x["T"], x["Delta"], x["pidx"], x["pval"], x["qidx"], x["qval"], x["skip"], m, n, d, r, 1e-2, 0.1, 7, 3, 2)
					}, []check{exactOnSim("W"), exactOnSim("T")}})
			}
		}
		// The fit's value gradient: P's (Y = G Q [m,d]) and Q's (trans, Y
		// = P^T G [d,n]), with and without Y, written and accumulated;
		// non-contracted on the device too, so bit for bit everywhere.
		for _, trans := range []bool{false, true} {
			rows, idx, val := m, pidx, pval
			if trans {
				rows, idx, val = n, qidx, qval
			}
			for _, withY := range []bool{true, false} {
				for _, acc := range []bool{false, true} {
					sh := fmt.Sprintf("rows=%d d=%d r=%d trans=%v Y=%v accumulate=%v", rows, d, r, trans, withY, acc)
					in := []tspec{{name: "out", n: rows * r, dt: f32}, {name: "K", n: d * d, dt: f32},
						{name: "idx", n: rows * r, dt: i32t, ints: idx}, {name: "val", n: rows * r, dt: f32, vals: val}}
					if withY {
						in = append(in, tspec{name: "Y", n: rows * d, dt: f32}, tspec{name: "M", n: d * d, dt: f32})
					}
					add(opCase{"SparseValueGrad", sh, in, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.SparseValueGrad(s, x["out"], x["Y"], x["M"], x["K"], x["idx"], x["val"], rows, d, r, 0.75, trans, acc)
					}, []check{{"out", 0, 0}}})
				}
			}
		}
		for _, acc := range []bool{false, true} {
			sh := fmt.Sprintf("BT=%d d=%d accumulate=%v", BT, d, acc)
			add(opCase{"SparseS", sh, []tspec{{name: "S", n: d * d, dt: f32}, {name: "A", n: d * BT, dt: f32}, {name: "B", n: BT * d, dt: f32}},
				func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.SparseS(s, x["S"], x["A"], x["B"], BT, d, acc)
				}, []check{exactOnSim("S")}})
		}
	}
	denseConformance(add)
	return cs
}

// denseConformance adds the dense projection ops' cases: ragged shapes
// (past a 64-wide tile and a 16-wide K slice, and the smallest), every
// transpose; DenseGemm with every dtype mix of A and B, beta 0 and not
// (one case on views at odd offsets); DenseApply with W fp32 and bf16,
// without a skip flag, with a clear one and with a set one. Bit for bit
// everywhere: the kernel is not contracted, on a GPU either.
func denseConformance(add func(opCase)) {
	for _, sz := range [][3]int{{70, 45, 37}, {1, 1, 1}} {
		M, N, K := sz[0], sz[1], sz[2]
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			for i, dts := range [][2]backend.DType{{f32, f32}, {bf, f32}, {f32, bf}, {bf, bf}} {
				beta := float32(0)
				if i%2 == 1 {
					beta = -0.5
				}
				sh := fmt.Sprintf("M=%d N=%d K=%d transA=%v transB=%v A %v B %v beta=%v", M, N, K, tr[0], tr[1], dts[0], dts[1], beta)
				in := []tspec{{name: "A", n: M * K, dt: dts[0]}, {name: "B", n: K * N, dt: dts[1]}, {name: "C", n: M * N, dt: f32}}
				run := func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
					return be.DenseGemm(s, tr[0], tr[1], M, N, K, 0.75, x["A"], x["B"], beta, x["C"])
				}
				add(opCase{"DenseGemm", sh, in, run, []check{{"C", 0, 0}}})
				if i == 3 && !tr[0] {
					add(opCase{"DenseGemm", sh + " views at odd offsets", offsetViews(in), run, []check{{"C", 0, 0}}})
				}
			}
			for _, wdt := range []backend.DType{f32, bf} {
				for _, skip := range []float32{-1, 0, 1} { // -1: no flag
					sh := fmt.Sprintf("M=%d N=%d K=%d transA=%v transB=%v W %v skip=%v", M, N, K, tr[0], tr[1], wdt, skip)
					in := []tspec{{name: "A", n: M * K, dt: f32}, {name: "B", n: K * N, dt: f32}, {name: "W", n: M * N, dt: wdt}}
					if skip >= 0 {
						in = append(in, tspec{name: "skip", n: 1, dt: f32, gen: constant(skip)})
					}
					add(opCase{"DenseApply", sh, in, func(be backend.Backend, s backend.Stream, x map[string]backend.Tensor) error {
						return be.DenseApply(s, tr[0], tr[1], M, N, K, -1e-2, x["A"], x["B"], 0.999, x["W"], x["skip"], 7, 3, 2)
					}, []check{{"W", 0, 0}}})
				}
			}
		}
	}
}

// scaledInvFreq rescales inverse frequencies pair by pair (by 1, 1/2,
// 1/4, ...: what no theta gives), as a rope_scaling would.
func scaledInvFreq(inv []float32) []float32 {
	out := slices.Clone(inv)
	for i := range out {
		out[i] /= float32(int(1) << (i % 4))
	}
	return out
}

// sparseRows is a random (d,r)-sparse projector of rows rows in row
// storage: r distinct columns per row.
func sparseRows(r *rand.Rand, rows, d, nz int) ([]int32, []float32) {
	idx := make([]int32, 0, rows*nz)
	val := make([]float32, 0, rows*nz)
	for range rows {
		perm := r.Perm(d)
		for s := range nz {
			idx = append(idx, int32(perm[s]))
			val = append(val, 2*r.Float32()-1)
		}
	}
	return idx, val
}

// inputs draws the values of a case's tensors, the same for both backends.
func (c opCase) inputs(seed uint64) map[string][]float32 {
	r := newRand(seed)
	vals := map[string][]float32{}
	for _, sp := range c.in {
		v := make([]float32, sp.n)
		switch {
		case sp.ints != nil:
			for i, x := range sp.ints {
				v[i] = float32(x)
			}
		case sp.vals != nil:
			copy(v, sp.vals)
		default:
			gen := sp.gen
			if gen == nil {
				gen = uniform(-1, 1)
			}
			for i := range v {
				v[i] = gen(r)
			}
		}
		vals[sp.name] = v
	}
	return vals
}

// runOn runs c on be from vals and returns every output as fp32.
func (c opCase) runOn(t *testing.T, be backend.Backend, vals map[string][]float32) map[string][]float32 {
	t.Helper()
	s := be.DefaultStream()
	x := map[string]backend.Tensor{}
	for _, sp := range c.in {
		buf := alloc(t, be, sp.name, sp.n+sp.off, sp.dt)
		defer be.Free(buf)
		tn := buf.Slice(sp.off, sp.n)
		x[sp.name] = tn
		v := vals[sp.name]
		switch sp.dt {
		case i32t:
			ints := sp.ints // exact: not every int32 survives the float32 of vals (a quantized matrix's code words)
			if ints == nil {
				ints = make([]int32, len(v))
				for i, f := range v {
					ints[i] = int32(f)
				}
			}
			ok(t, backend.UploadInt32(be, s, tn, ints))
		case f64t: // scratch: overwritten by the op, left as allocated
		default:
			ok(t, backend.Upload(be, s, tn, v))
		}
	}
	if err := c.run(be, s, x); err != nil {
		t.Fatalf("%s: %s: %v", c, be.Name(), err)
	}
	if err := be.Synchronize(s); err != nil {
		t.Fatalf("%s: %s: synchronize: %v", c, be.Name(), err)
	}
	out := map[string][]float32{}
	for _, ch := range c.out {
		out[ch.name] = get(t, be, x[ch.name])
	}
	return out
}

// attentionTol is the tolerance of a bf16 attention output (see the file
// comment), relative to the output's scale.
func attentionTol(want []float32) (atol, rtol float64) {
	m := 0.0
	for _, w := range want {
		m = max(m, math.Abs(float64(w)))
	}
	return math.Ldexp(m, -8) + math.Ldexp(1, -14), bf16Ulp
}

func TestConformance(t *testing.T) {
	be := newBE(t, Config{})
	ref := cpuBE(t)
	for i, c := range conformanceCases() {
		t.Run(c.String(), func(t *testing.T) {
			vals := c.inputs(uint64(i) + 1)
			want := c.runOn(t, ref, vals)
			got := c.runOn(t, be, vals)
			for _, ch := range c.out {
				atol, rtol := ch.atol, ch.rtol
				if atol < 0 {
					atol, rtol = attentionTol(want[ch.name])
				}
				compare(t, ch.name, got[ch.name], want[ch.name], atol, rtol)
			}
		})
	}
	if v := be.MemStats().InUse; v != 0 {
		t.Errorf("%d bytes still in use after every case freed its tensors", v)
	}
}

// TestConformanceCoversEveryOp fails when a method of backend.Ops has no
// case in the table, or a case names no method.
func TestConformanceCoversEveryOp(t *testing.T) {
	covered := map[string]int{}
	for _, c := range conformanceCases() {
		covered[c.op]++
	}
	ops := reflect.TypeFor[backend.Ops]()
	for i := range ops.NumMethod() {
		name := ops.Method(i).Name
		if covered[name] == 0 {
			t.Errorf("backend.Ops.%s has no conformance case", name)
		}
		delete(covered, name)
	}
	for name := range covered {
		t.Errorf("conformance cases for %s, which is not a method of backend.Ops", name)
	}
}
