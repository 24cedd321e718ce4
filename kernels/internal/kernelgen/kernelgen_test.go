package kernelgen

import (
	"strings"
	"testing"
)

const sample = `#include "common.cuh"
extern "C" {
// BEGIN one
// What the section is.
// t = v.
cudaError_t lsp_fill(void* t, float v, long long n, int t_bf16, cudaStream_t stream);

// out = a + b, over
// several lines.
cudaError_t lsp_add(void *out, const void * a, const void* b, long long n, int out_bf16,
                    int a_bf16, int b_bf16, cudaStream_t stream);
// Work for lsp_sum: LSP_SUM_WORK doubles.
#define LSP_SUM_WORK 0x400
cudaError_t lsp_sum(float* out, const __nv_bfloat16* x, int C, int transA, double* work, unsigned long long seed,
                    unsigned int matrix, cudaStream_t stream);
size_t lsp_sum_scratch_bytes(int N, int C);
// END one
}
`

func TestParse(t *testing.T) {
	h, err := Parse("k.h", []byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Families) != 1 || h.Families[0].Name != "one" {
		t.Fatalf("families %+v", h.Families)
	}
	f := h.Families[0]
	if len(f.Funcs) != 4 || len(f.Consts) != 1 {
		t.Fatalf("%d funcs, %d consts", len(f.Funcs), len(f.Consts))
	}
	add := f.Funcs[1]
	if add.CName != "lsp_add" || len(add.Params) != 8 || add.Params[0] != (Param{"void*", "out"}) ||
		add.Params[1] != (Param{"const void*", "a"}) || add.Params[5].Name != "a_bf16" || add.Line != 10 {
		t.Errorf("lsp_add parsed as %+v", add)
	}
	if got := strings.Join(add.Doc, "|"); got != "out = a + b, over|several lines." {
		t.Errorf("lsp_add doc %q", got)
	}
	if got := strings.Join(f.Funcs[0].Doc, "|"); got != "What the section is.|t = v." {
		t.Errorf("lsp_fill doc %q", got)
	}
	if c := f.Consts[0]; c.CName != "LSP_SUM_WORK" || c.Value != 1024 {
		t.Errorf("const %+v", c)
	}
	// The #define shares its comment with the declaration after it.
	if got := strings.Join(f.Funcs[2].Doc, "|"); got != "Work for lsp_sum: LSP_SUM_WORK doubles." {
		t.Errorf("lsp_sum doc %q", got)
	}
	if p := f.Funcs[2].Params[5]; p.CType != "unsigned long long" || p.Name != "seed" {
		t.Errorf("seed parsed as %+v", p)
	}
	if r := f.Funcs[3]; r.Returns != "size_t" || len(r.Params) != 2 {
		t.Errorf("helper parsed as %+v", r)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"outside", "cudaError_t lsp_x(cudaStream_t s);\n", "k.h:1: a declaration outside every"},
		{"no end", "// BEGIN a\n", "section a has no // END a"},
		{"end without begin", "// END a\n", "k.h:1: END a without BEGIN a"},
		{"wrong end", "// BEGIN a\n// END b\n", "k.h:2: END b without BEGIN b"},
		{"nested", "// BEGIN a\n// BEGIN b\n", "k.h:2: BEGIN b inside section a"},
		{"twice", "// BEGIN a\n// END a\n// BEGIN a\n", "k.h:3: a second section named a"},
		{"block comment", "// BEGIN a\n/* x */\n// END a\n", "k.h:2: a /* */ comment"},
		{"macro", "// BEGIN a\n#define F(x) x\n// END a\n", "k.h:2: a preprocessor line"},
		{"expression", "// BEGIN a\n#define N (1 << 4)\n// END a\n", "kernelgen takes only integer constants"},
		{"ifdef", "// BEGIN a\n#ifdef X\n// END a\n", "k.h:2: a preprocessor line"},
		{"unterminated", "// BEGIN a\ncudaError_t lsp_x(int n,\n// END a\n", "k.h:2: a declaration without its closing \");\" before line 3"},
		{"eof in decl", "// BEGIN a\ncudaError_t lsp_x(int n,\n", "k.h:2: a declaration without its closing"},
		{"array", "// BEGIN a\ncudaError_t lsp_x(int n[4], cudaStream_t s);\n// END a\n", "arrays, function pointers"},
		{"no name", "// BEGIN a\ncudaError_t lsp_x(int, cudaStream_t s);\n// END a\n", `parameter "int" has no name`},
		{"same param", "// BEGIN a\ncudaError_t lsp_x(int n, int n);\n// END a\n", "two parameters named n"},
		{"declared twice", "// BEGIN a\nsize_t lsp_x(int n);\nsize_t lsp_x(int n);\n// END a\n", "k.h:3: lsp_x is declared twice"},
	} {
		_, err := Parse("k.h", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestGenerate(t *testing.T) {
	target := Target{Header: "k.h", Include: "k.h", Package: "kernels", Tags: "cuda", Face: "f_gen.go", Table: "t_gen.go"}
	files, err := Generate(target, []byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	face, table := string(files["f_gen.go"]), string(files["t_gen.go"])
	for _, want := range []string{
		"//go:build cuda\n",
		"func Fill(t Ptr, v float32, n int64, tBF16 DType, stream Stream) error {",
		"func Add(out, a, b Ptr, n int64, outBF16, aBF16, bBF16 DType, stream Stream) error {",
		// C is cgo's pseudo-package: the parameter is renamed; transA is a switch.
		"func Sum(out, x Ptr, C_ int, transA bool, work Ptr, seed uint64, matrix uint32, stream Stream) error {",
		`return ArgError("lsp_sum", "C", C_, "does not fit in a C int")`,
		"func SumScratchBytes(N, C_ int) (int, error) {",
		"static lspgo_ret lspgo_lsp_sum(uintptr_t out, uintptr_t x, int C, bool transA, uintptr_t work, unsigned long long seed, unsigned int matrix, uintptr_t stream, bool lspgo_sync) {",
		"(const __nv_bfloat16*)x",
		"lspgo_begin();",
	} {
		if !strings.Contains(face, want) {
			t.Errorf("face lacks %q", want)
		}
	}
	if strings.Contains(face, "lspgo_lsp_sum_scratch_bytes") {
		t.Error("a helper got a launch shim")
	}
	for _, want := range []string{
		"const SumWork = 1024",
		`{Name: "Add", C: "lsp_add", Family: "one", Returns: "cudaError_t", Params: []Param{`,
		`{Name: "C", CType: "int", GoName: "C_", GoType: "int"}`,
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if strings.Contains(table, "import \"C\"") || strings.Contains(table, "go:build") {
		t.Error("the table must build without cgo and without tags")
	}
	// Another package's face qualifies the shared types.
	target.Qual, target.Import, target.Package, target.Table = "kernels.", "example.com/kernels", "simtest", ""
	files, err = Generate(target, []byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(files["f_gen.go"]); !strings.Contains(s, "func Fill(t kernels.Ptr, v float32, n int64, tBF16 kernels.DType, stream kernels.Stream) error {") ||
		!strings.Contains(s, "return kernels.ShimResult(launcher, int(r.code), unsafe.Pointer(r.msg))") {
		t.Errorf("qualified face:\n%s", s)
	}
}

func TestGenerateRefuses(t *testing.T) {
	target := Targets[0]
	for _, tc := range []struct{ name, src, want string }{
		{"type", "// BEGIN a\ncudaError_t lsp_x(half h, cudaStream_t s);\n// END a\n", "parameter h has C type half"},
		{"return", "// BEGIN a\nfloat* lsp_x(int n);\n// END a\n", "not a function prototype"},
		{"return type", "// BEGIN a\nchar lsp_x(int n);\n// END a\n", "lsp_x returns char"},
		{"no stream", "// BEGIN a\ncudaError_t lsp_x(int n);\n// END a\n", "does not take a cudaStream_t last"},
		{"same Go name", "// BEGIN a\nsize_t lsp_a_b(int n);\nsize_t lsp_a__b(int n);\n// END a\n", "both become Go function AB"},
	} {
		_, err := Generate(target, []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestNames(t *testing.T) {
	for c, want := range map[string]string{
		"lsp_gemm_bf16":                        "GemmBF16",
		"lsp_layernorm_backward_scratch_bytes": "LayerNormBackwardScratchBytes",
		"lsp_cast_f32_to_bf16":                 "CastF32ToBF16",
		"lsp_cross_entropy_forward_backward":   "CrossEntropyForwardBackward",
		"lsp_adamw":                            "AdamW",
		"lsp_sparse_s":                         "SparseS",
		"lsp_swiglu_backward":                  "SwiGLUBackward",
		"lsp_add_bias":                         "AddBias",
	} {
		if got := goName(c, true); got != want {
			t.Errorf("goName(%s) = %s, want %s", c, got, want)
		}
	}
	if got := goName("lsp_st_wmma_misaligned", false); got != "stWmmaMisaligned" {
		t.Errorf("unexported %s", got)
	}
	if got := lowerFirst("BF16Round"); got != "bf16Round" {
		t.Errorf("lowerFirst = %s", got)
	}
	for c, want := range map[string]string{"x_bf16": "xBF16", "c_is_bf16": "cIsBF16", "max_norm": "maxNorm",
		"transA": "transA", "M": "M", "weight_decay": "weightDecay"} {
		if got := lowerCamel(c); got != want {
			t.Errorf("lowerCamel(%s) = %s, want %s", c, got, want)
		}
	}
	if got := constName("LSP_SUM_SQUARES_WORK"); got != "SumSquaresWork" {
		t.Errorf("constName = %s", got)
	}
}
