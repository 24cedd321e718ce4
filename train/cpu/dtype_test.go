// Tests that every op computes in fp32 whatever the storage: run on bf16
// tensors, an op must give exactly train/bf16's round-to-nearest-even of
// what it gives on fp32 tensors holding the same (bf16-representable)
// inputs. Equality, not a tolerance: loads widen exactly and only the final
// store rounds, as the CUDA kernels do. Tensors the contract fixes to fp32
// (mean, rstd, lse, losses, moments, master, sumSq) stay fp32 in both runs
// and must come out bit-identical. The bf16 runs are in the KernelDTypes
// mode: every op takes bf16 storage on the GPU as well.

package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

type tkind uint8

const (
	flt   tkind = iota // the storage dtype under test (fp32 or bf16)
	fixed              // always fp32
	ints               // I32
)

type tspec struct {
	name string
	n    int
	kind tkind
	gen  func(r *rand.Rand) float32 // nil: uniform in [-1, 1)
}

type dtypeCase struct {
	name    string
	tensors []tspec
	outs    []string
	run     func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error
}

func dtypeCases() []dtypeCase {
	const B, T, C, NH, V, N = tB, tT, tC, tNH, tV, tB * tT
	token := func(r *rand.Rand) float32 { return float32(r.IntN(V)) }
	target := func(r *rand.Rand) float32 { return float32(r.IntN(V+2) - 2) } // some ignored
	positive := func(r *rand.Rand) float32 { return 0.5 + r.Float32() }
	return []dtypeCase{
		{"fill", []tspec{{"t", 7, flt, nil}}, []string{"t"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
			return be.Fill(s, x["t"], 0.3)
		}},
		{"scale", []tspec{{"t", 7, flt, nil}}, []string{"t"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
			return be.Scale(s, x["t"], 1.0/3)
		}},
		{"add", []tspec{{"out", 9, flt, nil}, {"a", 9, flt, nil}, {"b", 9, flt, nil}}, []string{"out"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.Add(s, x["out"], x["a"], x["b"])
			}},
		{"accumulate", []tspec{{"dst", 9, flt, nil}, {"src", 9, flt, nil}}, []string{"dst"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.Accumulate(s, x["dst"], x["src"])
			}},
		{"encoder forward", []tspec{{"out", N * C, flt, nil}, {"inp", N, ints, token}, {"wte", V * C, flt, nil}, {"wpe", T * C, flt, nil}},
			[]string{"out"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.EncoderForward(s, x["out"], x["inp"], backend.Tensor{}, x["wte"], x["wpe"], B, T, C)
			}},
		{"encoder backward", []tspec{{"dwte", V * C, flt, nil}, {"dwpe", T * C, flt, nil}, {"dout", N * C, flt, nil}, {"inp", N, ints, token}},
			[]string{"dwte", "dwpe"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.EncoderBackward(s, x["dwte"], x["dwpe"], x["dout"], x["inp"], backend.Tensor{}, B, T, C)
			}},
		// A bf16 model with fp32 parameter gradients: dwte, dwpe stay fp32.
		{"encoder backward, fp32 parameter gradients", []tspec{{"dwte", V * C, fixed, nil}, {"dwpe", T * C, fixed, nil},
			{"dout", N * C, flt, nil}, {"inp", N, ints, token}},
			[]string{"dwte", "dwpe"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.EncoderBackward(s, x["dwte"], x["dwpe"], x["dout"], x["inp"], backend.Tensor{}, B, T, C)
			}},
		{"layernorm forward", []tspec{{"out", N * C, flt, nil}, {"mean", N, fixed, nil}, {"rstd", N, fixed, nil},
			{"inp", N * C, flt, nil}, {"w", C, flt, nil}, {"b", C, flt, nil}},
			[]string{"out", "mean", "rstd"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.LayerNormForward(s, x["out"], x["mean"], x["rstd"], x["inp"], x["w"], x["b"], N, C, 1e-5)
			}},
		{"layernorm backward", []tspec{{"dinp", N * C, flt, nil}, {"dw", C, flt, nil}, {"db", C, flt, nil}, {"dout", N * C, flt, nil},
			{"inp", N * C, flt, nil}, {"w", C, flt, nil}, {"mean", N, fixed, nil}, {"rstd", N, fixed, positive}},
			[]string{"dinp", "dw", "db"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.LayerNormBackward(s, x["dinp"], x["dw"], x["db"], x["dout"], x["inp"], x["w"], x["mean"], x["rstd"], lnScratch(t, be, N, C), N, C)
			}},
		// A bf16 model with fp32 parameter gradients: dw, db stay fp32.
		{"layernorm backward, fp32 parameter gradients", []tspec{{"dinp", N * C, flt, nil}, {"dw", C, fixed, nil}, {"db", C, fixed, nil},
			{"dout", N * C, flt, nil}, {"inp", N * C, flt, nil}, {"w", C, flt, nil}, {"mean", N, fixed, nil}, {"rstd", N, fixed, positive}},
			[]string{"dinp", "dw", "db"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.LayerNormBackward(s, x["dinp"], x["dw"], x["db"], x["dout"], x["inp"], x["w"], x["mean"], x["rstd"], lnScratch(t, be, N, C), N, C)
			}},
		{"gemm", []tspec{{"A", 9 * 5, flt, nil}, {"B", 9 * 7, flt, nil}, {"C", 5 * 7, flt, nil}}, []string{"C"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.Gemm(s, true, false, 5, 7, 9, 0.75, x["A"], x["B"], 0.5, x["C"])
			}},
		{"add bias", []tspec{{"out", N * 7, flt, nil}, {"bias", 7, flt, nil}}, []string{"out"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.AddBias(s, x["out"], x["bias"], N, 7)
			}},
		{"bias backward", []tspec{{"dbias", 7, flt, nil}, {"dout", N * 7, flt, nil}}, []string{"dbias"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.BiasBackward(s, x["dbias"], x["dout"], N, 7)
			}},
		{"attention forward", []tspec{{"out", N * C, flt, nil}, {"lse", B * NH * T, fixed, nil}, {"qkv", N * 3 * C, flt, nil}},
			[]string{"out", "lse"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.AttentionForward(s, x["out"], x["lse"], x["qkv"], backend.Tensor{}, B, T, NH, NH, C/NH, backend.QKVFused)
			}},
		{"attention backward", []tspec{{"dqkv", N * 3 * C, flt, nil}, {"dout", N * C, flt, nil}, {"qkv", N * 3 * C, flt, nil},
			{"out", N * C, flt, nil}, {"lse", B * NH * T, fixed, positive}},
			[]string{"dqkv"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.AttentionBackward(s, x["dqkv"], x["dout"], x["qkv"], x["out"], x["lse"], backend.Tensor{}, attnScratch(t, be, B, T, NH), B, T, NH, NH, C/NH, backend.QKVFused)
			}},
		{"gelu forward", []tspec{{"out", 40, flt, nil}, {"inp", 40, flt, nil}}, []string{"out"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.GeluForward(s, x["out"], x["inp"])
			}},
		{"gelu backward", []tspec{{"dinp", 40, flt, nil}, {"inp", 40, flt, nil}, {"dout", 40, flt, nil}}, []string{"dinp"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.GeluBackward(s, x["dinp"], x["inp"], x["dout"])
			}},
		{"cross entropy", []tspec{{"losses", N, fixed, nil}, {"logits", N * V, flt, nil}, {"targets", N, ints, target}},
			[]string{"losses", "logits"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.CrossEntropyForwardBackward(s, x["losses"], x["logits"], x["targets"], N, V, 0.1)
			}},
		{"sum squares", []tspec{{"out", 1, fixed, nil}, {"x", 50, flt, nil}}, []string{"out"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.SumSquares(s, x["out"], x["x"], sumWork(t, be))
			}},
		{"adamw with master", []tspec{{"param", 20, flt, nil}, {"master", 20, fixed, nil}, {"grad", 20, flt, nil},
			{"m", 20, fixed, nil}, {"v", 20, fixed, positive}, {"sumSq", 1, fixed, positive}},
			[]string{"param", "master", "m", "v"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.AdamW(s, x["param"], x["master"], x["grad"], x["m"], x["v"], x["sumSq"], backend.Tensor{},
					backend.AdamParams{LR: 0.01, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, MaxNorm: 0.8})
			}},
		{"adamw without master", []tspec{{"param", 20, flt, nil}, {"grad", 20, flt, nil},
			{"m", 20, fixed, nil}, {"v", 20, fixed, positive}},
			[]string{"param", "m", "v"}, func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.AdamW(s, x["param"], backend.Tensor{}, x["grad"], x["m"], x["v"], backend.Tensor{}, backend.Tensor{},
					backend.AdamParams{LR: 0.01, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1})
			}},
		{"copy from fp32", []tspec{{"dst", 15, flt, nil}, {"src", 15, fixed, nil}}, []string{"dst"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.CopyD2D(s, x["dst"], x["src"])
			}},
		{"copy to fp32", []tspec{{"dst", 15, fixed, nil}, {"src", 15, flt, nil}}, []string{"dst"},
			func(t testing.TB, be *Backend, s backend.Stream, x map[string]backend.Tensor) error {
				return be.CopyD2D(s, x["dst"], x["src"])
			}},
	}
}

func TestBF16MatchesFP32(t *testing.T) {
	for _, tc := range dtypeCases() {
		t.Run(tc.name, func(t *testing.T) {
			r := newRand(11)
			data := map[string][]float32{}
			kinds := map[string]tkind{}
			for _, sp := range tc.tensors {
				v := make([]float32, sp.n)
				for i := range v {
					if sp.gen != nil {
						v[i] = sp.gen(r)
					} else {
						v[i] = 2*r.Float32() - 1
					}
				}
				if sp.kind == flt {
					v = roundBF16(v) // the same values in both storages
				}
				data[sp.name], kinds[sp.name] = v, sp.kind
			}
			res := map[backend.DType]map[string][]float32{}
			for _, dt := range []backend.DType{backend.F32, backend.BF16} {
				// bf16 storage passes the CUDA kernels' dtype table too.
				be := newBE(t, Config{Threads: 2, KernelDTypes: dt == backend.BF16})
				x := map[string]backend.Tensor{}
				for _, sp := range tc.tensors {
					switch sp.kind {
					case flt:
						x[sp.name] = tensorOf(t, be, sp.name, dt, data[sp.name])
					case fixed:
						x[sp.name] = tensorOf(t, be, sp.name, backend.F32, data[sp.name])
					case ints:
						iv := make([]int32, sp.n)
						for i, f := range data[sp.name] {
							iv[i] = int32(f)
						}
						x[sp.name] = intsOf(t, be, sp.name, iv)
					}
				}
				ok(t, tc.run(t, be, be.DefaultStream(), x))
				res[dt] = map[string][]float32{}
				for _, o := range tc.outs {
					res[dt][o] = get(t, be, x[o])
				}
			}
			for _, o := range tc.outs {
				f32, b16 := res[backend.F32][o], res[backend.BF16][o]
				if kinds[o] == fixed {
					same(t, o+" (fp32 in both runs)", b16, f32)
					continue
				}
				rounded := false
				for i, v := range f32 {
					want := bf16.ToFloat32(bf16.FromFloat32(v))
					if math.Float32bits(b16[i]) != math.Float32bits(want) {
						t.Fatalf("%s[%d]: bf16 storage gives %v, want %v = bf16(%v from fp32 storage)", o, i, b16[i], want, v)
					}
					rounded = rounded || want != v
				}
				if !rounded {
					t.Errorf("%s: no element needed rounding; the test does not exercise bf16 stores", o)
				}
			}
		})
	}
}
