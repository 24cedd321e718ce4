// Tests of the dtype table: one entry per Ops method naming exactly the
// method's tensor parameters, in agreement with the launchers declared in
// kernels/kernels.h, shown verbatim in the package doc; and CheckDTypes'
// verdicts and messages.

package backend

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// opsParams reads the parameter names and types of every Ops method from
// ops_gen.go (generated from the table): reflect knows the types but not
// the names.
func opsParams(t *testing.T) map[string][][2]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "ops_gen.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][][2]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Ops" {
			return true
		}
		for _, m := range ts.Type.(*ast.InterfaceType).Methods.List {
			fn := m.Type.(*ast.FuncType)
			var ps [][2]string
			for _, p := range fn.Params.List {
				typ := types(p.Type)
				for _, name := range p.Names {
					ps = append(ps, [2]string{name.Name, typ})
				}
			}
			out[m.Names[0].Name] = ps
		}
		return false
	})
	return out
}

func types(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return "?"
}

func TestDTypeTableCoversOps(t *testing.T) {
	ops := reflect.TypeFor[Ops]()
	params := opsParams(t)
	if len(params) != ops.NumMethod() {
		t.Fatalf("parsed %d Ops methods from ops_gen.go, reflect sees %d", len(params), ops.NumMethod())
	}
	tensor := reflect.TypeFor[Tensor]()
	seen := map[string]bool{}
	for _, o := range KernelDTypes() {
		if seen[o.Op] {
			t.Errorf("%s: two entries", o.Op)
		}
		seen[o.Op] = true
		m, ok := ops.MethodByName(o.Op)
		if !ok {
			t.Errorf("%s: in the table, not an Ops method", o.Op)
			continue
		}
		var want []string
		for _, p := range params[o.Op] {
			if p[1] == "Tensor" {
				want = append(want, p[0])
			}
		}
		n := 0
		for i := range m.Type.NumIn() {
			if m.Type.In(i) == tensor {
				n++
			}
		}
		if n != len(want) {
			t.Errorf("%s: reflect counts %d tensor parameters, ops_gen.go names %v", o.Op, n, want)
		}
		if !slices.Equal(o.Args, want) {
			t.Errorf("%s: table args %v, method's tensor parameters %v", o.Op, o.Args, want)
		}
		var grouped []string
		for _, g := range o.Groups {
			if len(g.DTypes) == 0 || len(g.Args) == 0 {
				t.Errorf("%s: empty group %+v", o.Op, g)
			}
			if (g.Flag != "") != (len(g.DTypes) > 1) && !o.Pending {
				t.Errorf("%s: group %v has %d dtypes and flag %q: a flag chooses among several, a fixed type has none",
					o.Op, g.Args, len(g.DTypes), g.Flag)
			}
			grouped = append(grouped, g.Args...)
		}
		slices.Sort(grouped)
		sorted := slices.Sorted(slices.Values(want))
		if !slices.Equal(grouped, sorted) {
			t.Errorf("%s: groups cover %v, want each of %v exactly once", o.Op, grouped, sorted)
		}
	}
	for i := range ops.NumMethod() {
		if name := ops.Method(i).Name; !seen[name] {
			t.Errorf("Ops method %s has no entry in the dtype table", name)
		}
	}
}

// cParam is one parameter of a launcher: its type without const, and name.
type cParam struct{ typ, name string }

// launchers reads every lsp_* declaration of kernels/kernels.h.
func launchers(t *testing.T) map[string][]cParam {
	t.Helper()
	src, err := os.ReadFile("../../kernels/kernels.h")
	if err != nil {
		t.Fatal(err)
	}
	// Drop comments first: they quote launcher names and parentheses.
	text := regexp.MustCompile(`(?m)//.*$`).ReplaceAllString(string(src), "")
	text = regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(text, "")
	out := map[string][]cParam{}
	decl := regexp.MustCompile(`(?s)\b\w+\s+(lsp_\w+)\s*\(([^)]*)\)\s*;`)
	for _, m := range decl.FindAllStringSubmatch(text, -1) {
		var ps []cParam
		for _, p := range strings.Split(m[2], ",") {
			f := strings.Fields(strings.ReplaceAll(strings.ReplaceAll(p, "const ", ""), "*", "* "))
			if len(f) < 2 {
				continue
			}
			ps = append(ps, cParam{typ: strings.Join(f[:len(f)-1], ""), name: f[len(f)-1]})
		}
		out[m[1]] = ps
	}
	if len(out) < 10 {
		t.Fatalf("found only %d launchers in kernels.h: the parser is out of date", len(out))
	}
	return out
}

// snake is the C spelling of a Go parameter name: sumSq -> sum_sq.
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) && unicode.IsLower(rune(s[i-1])) {
			b.WriteByte('_')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestDTypeTableMatchesKernels(t *testing.T) {
	decls := launchers(t)
	pointer := map[DType]string{F32: "float*", BF16: "__nv_bfloat16*", I32: "int*", F64: "double*"}
	for _, o := range KernelDTypes() {
		ps, ok := decls[o.Launcher]
		switch {
		case o.Pending && ok:
			t.Errorf("%s: %s is in kernels.h now: give the entry the launcher's groups and clear Pending", o.Op, o.Launcher)
			continue
		case o.Pending:
			continue
		case !ok:
			t.Errorf("%s: launcher %s not in kernels.h", o.Op, o.Launcher)
			continue
		}
		find := func(name string) (cParam, bool) {
			for _, p := range ps {
				if p.name == name || p.name == snake(name) {
					return p, true
				}
			}
			return cParam{}, false
		}
		flagged := map[string]bool{}
		for _, g := range o.Groups {
			if g.Flag != "" {
				if f, ok := find(g.Flag); !ok || f.typ != "int" {
					t.Errorf("%s: flag %s is not an int argument of %s", o.Op, g.Flag, o.Launcher)
				}
				if !slices.Equal(g.DTypes, []DType{F32, BF16}) {
					t.Errorf("%s: flag %s chooses %v; a *_bf16 flag chooses fp32 or bf16", o.Op, g.Flag, g.DTypes)
				}
			}
			for _, a := range g.Args {
				p, ok := find(a)
				switch {
				case !ok:
					t.Errorf("%s: %s has no argument %s", o.Op, o.Launcher, a)
				case g.Flag != "" && p.typ != "void*":
					t.Errorf("%s: %s is %s in %s, but the table lets %s choose its dtype", o.Op, a, p.typ, o.Launcher, g.Flag)
				case g.Flag == "" && p.typ != pointer[g.DTypes[0]]:
					t.Errorf("%s: %s is %s in %s, the table says %v", o.Op, a, p.typ, o.Launcher, g.DTypes[0])
				case g.Flag != "":
					flagged[p.name] = true
				}
			}
		}
		for _, p := range ps {
			if p.typ == "void*" && !flagged[p.name] {
				t.Errorf("%s: %s's void* argument %s has no flag group in the table", o.Op, o.Launcher, p.name)
			}
		}
	}
}

func TestDTypeTableInDoc(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(DTypeTable(), "\n"), "\n") {
		want.WriteString("//\t" + line + "\n")
	}
	if !strings.Contains(string(src), want.String()) {
		t.Errorf("doc.go does not show the dtype table; paste:\n%s", want.String())
	}
}

func TestCheckDTypes(t *testing.T) {
	buf := fakeBuf{}
	ten := func(dt DType) Tensor { return Tensor{Buf: buf, Shape: []int{1}, DType: dt} }
	f, b, i, d := ten(F32), ten(BF16), ten(I32), ten(F64)
	absent := Tensor{}
	for _, tc := range []struct {
		op   string
		ts   []Tensor
		want []string // substrings of the error; nil: accepted
	}{
		{"Gemm", []Tensor{b, b, f}, nil},
		{"Gemm", []Tensor{b, b, b}, nil},
		{"Gemm", []Tensor{f, f, f}, []string{"Gemm(A fp32, B fp32, C fp32)", "A, B must be bf16"}},
		{"Gemm", []Tensor{b, f, f}, []string{"B fp32", "must be bf16"}},
		{"AttentionForward", []Tensor{f, f, f, {}}, []string{"AttentionForward(out fp32, lse fp32, qkv fp32, pos absent)", "out, qkv must be bf16"}},
		{"AttentionBackward", []Tensor{b, b, b, b, f, i, f}, nil},
		{"AttentionBackward", []Tensor{b, b, b, b, f, {}, b}, []string{"scratch bf16", "lse, scratch must be fp32"}},
		{"LayerNormBackward", []Tensor{f, f, f, f, b, b, f, f, f}, nil},
		{"LayerNormBackward", []Tensor{b, f, f, b, b, b, f, f, f}, nil}, // a bf16 model, fp32 parameter gradients
		{"LayerNormBackward", []Tensor{f, b, b, f, f, f, f, f, f}, nil}, // an fp32 model, bf16 parameter gradients
		{"LayerNormBackward", []Tensor{f, b, b, b, b, b, f, f, f}, []string{"dinp, dout must share one dtype", "g_bf16"}},
		{"LayerNormBackward", []Tensor{b, b, f, b, b, b, f, f, f}, []string{"dweight, dbias must share one dtype", "dw_bf16"}},
		{"EncoderBackward", []Tensor{f, f, b, i, i}, nil},
		{"EncoderBackward", []Tensor{b, f, b, i, {}}, []string{"dwte, dwpe must share one dtype", "dw_bf16"}},
		{"SumSquares", []Tensor{f, b, d}, nil},
		{"SumSquares", []Tensor{f, b, f}, []string{"work fp32", "work must be fp64"}},
		{"EncoderForward", []Tensor{b, i, {}, b, b}, nil},
		{"EncoderForward", []Tensor{b, f, {}, b, b}, []string{"inp, pos must be i32"}},
		{"EncoderForward", []Tensor{b, i, f, b, b}, []string{"inp, pos must be i32"}},
		{"AdamW", []Tensor{b, f, f, f, f, absent, absent}, nil},
		{"AdamW", []Tensor{f, absent, b, f, f, f, f}, nil},
		{"AdamW", []Tensor{b, absent, b, b, f, absent, absent}, []string{"master absent", "m bf16", "master, m, v, sumSq, skip must be fp32"}},
		{"AdamW", []Tensor{b, f, f, f, f, absent, b}, []string{"skip bf16", "must be fp32"}},
		{"NonFiniteFlag", []Tensor{f, f}, nil},
		{"NonFiniteFlag", []Tensor{f, b}, []string{"x bf16", "flag, x must be fp32"}},
		{"Fill", []Tensor{b}, nil},
		{"Add", []Tensor{f, b, f}, nil}, // as the CPU backend: each on its own
		{"Add", []Tensor{i, f, f}, []string{"out must be one of fp32|bf16"}},
		{"Gemm", []Tensor{b, b}, []string{"Gemm: 2 tensors checked, the op has 3"}},
		{"Conv", nil, []string{"Conv: no such op"}},
	} {
		err := CheckDTypes(tc.op, tc.ts...)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s %v: %v", tc.op, tc.ts, err)
		case tc.want != nil && err == nil:
			t.Errorf("%s %v accepted, want an error", tc.op, tc.ts)
		case tc.want != nil:
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not say %q", tc.op, err, w)
				}
			}
		}
	}
	if !Accepts("Gemm", "C", F32) || Accepts("Gemm", "A", F32) || !Accepts("Gemm", "A", BF16) || Accepts("Gemm", "D", BF16) {
		t.Error("Accepts disagrees with the table on Gemm")
	}
}

// fakeBuf stands for a device buffer in dtype checks, which never touch it.
type fakeBuf struct{}

func (fakeBuf) ID() int        { return 1 }
func (fakeBuf) Name() string   { return "fake" }
func (fakeBuf) Bytes() int64   { return 8 }
func (fakeBuf) String() string { return "fake" }
