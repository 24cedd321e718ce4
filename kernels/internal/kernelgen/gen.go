package kernelgen

import (
	"bytes"
	"fmt"
	"go/format"
	"go/token"
	"slices"
	"strings"
)

// FlagParams are the int parameters that are on/off switches (0 or 1): the
// Go face takes them as bool. A new switch not listed here comes out as an
// int, which works, only less typed.
var FlagParams = []string{"transA", "transB", "trans", "transW", "gelu", "accumulate", "use_barrier", "a_col", "b_col", "c_col", "d_col"}

// goScalar maps a C scalar type to its Go type in the face, the cgo type
// it converts to, and the range check it needs ("int32": must fit in a C
// int; "size": must not be negative).
type goScalar struct{ goType, cgoType, check string }

var goTypes = map[string]goScalar{
	"int":                {"int", "C.int", "int32"},
	"unsigned int":       {"uint32", "C.uint", ""},
	"unsigned":           {"uint32", "C.uint", ""},
	"long long":          {"int64", "C.longlong", ""},
	"long long int":      {"int64", "C.longlong", ""},
	"unsigned long long": {"uint64", "C.ulonglong", ""},
	"int64_t":            {"int64", "C.int64_t", ""},
	"uint64_t":           {"uint64", "C.uint64_t", ""},
	"uint32_t":           {"uint32", "C.uint32_t", ""},
	"float":              {"float32", "C.float", ""},
	"double":             {"float64", "C.double", ""},
	"size_t":             {"int", "C.size_t", "size"},
}

// Target is one generated face: which header, into which package and files.
type Target struct {
	Header  string // the header, relative to the kernels directory
	Include string // how the cgo preamble includes it
	Package string
	// Qual prefixes the names of package kernels the generated code uses
	// ("" inside package kernels, "kernels." elsewhere).
	Qual string
	// Import is the import path of package kernels when Qual is set.
	Import string
	Tags   string // the build constraint of the face
	Face   string // the face's file, relative to the kernels directory
	// Table is the cgo-free file with the constants and the table of
	// launchers ("" for none).
	Table string
	// Unexported gives the Go functions lower-case names (test helpers).
	Unexported bool
}

// Targets are the faces `go generate ./kernels` writes: the launchers of
// kernels.h for package kernels, and the simulator's self-test launchers
// for kernels/simtest (test code, simulator builds only).
var Targets = []Target{
	{
		Header: "kernels.h", Include: "kernels.h", Package: "kernels",
		Tags: "cuda || cudasim || lsp_sim", Face: "launch_gen.go", Table: "launchers_gen.go",
	},
	{
		Header: "simtest/selftest.h", Include: "selftest.h", Package: "simtest",
		Qual: "kernels.", Import: "github.com/lsp-offload/lsp-offload/kernels",
		Tags: "lsp_sim", Face: "simtest/selftest_gen.go", Unexported: true,
	},
}

// Generate parses the target's header (src) and returns the generated
// files, by their names relative to the kernels directory.
func Generate(t Target, src []byte) (map[string][]byte, error) {
	h, err := Parse(t.Header, src)
	if err != nil {
		return nil, err
	}
	fs, err := plan(t, h)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	face, err := t.face(h, fs)
	if err != nil {
		return nil, err
	}
	out[t.Face] = face
	if t.Table != "" {
		table, err := t.table(h, fs)
		if err != nil {
			return nil, err
		}
		out[t.Table] = table
	}
	return out, nil
}

// goFunc is a Func with its Go names and types worked out.
type goFunc struct {
	*Func
	Name   string
	Params []goParam
	Launch bool   // returns cudaError_t
	Ret    string // the Go type of a helper's result
}

type goParam struct {
	Param
	GoName, GoType string
	cgoType        string // conversion to the shim's parameter type
	check          string // "int32", "size" or ""
	shimType       string // the shim's C parameter type
}

// plan works out every function's Go name and parameters.
func plan(t Target, h *Header) ([]*goFunc, error) {
	var fs []*goFunc
	names := map[string]string{}
	for _, fam := range h.Families {
		for _, f := range fam.Funcs {
			g := &goFunc{Func: f, Name: goName(f.CName, !t.Unexported)}
			if prev, ok := names[g.Name]; ok {
				return nil, fmt.Errorf("%s:%d: %s and %s both become Go function %s", h.File, f.Line, prev, f.CName, g.Name)
			}
			names[g.Name] = f.CName
			switch f.Returns {
			case "cudaError_t":
				g.Launch = true
			default:
				s, ok := goTypes[f.Returns]
				if !ok {
					return nil, fmt.Errorf("%s:%d: %s returns %s; kernelgen maps cudaError_t and the scalars of goTypes", h.File, f.Line, f.CName, f.Returns)
				}
				g.Ret = s.goType
			}
			for _, p := range f.Params {
				q, err := t.param(p)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %s: %v", h.File, f.Line, f.CName, err)
				}
				g.Params = append(g.Params, q)
			}
			if g.Launch && (len(g.Params) == 0 || g.Params[len(g.Params)-1].CType != "cudaStream_t") {
				return nil, fmt.Errorf("%s:%d: launcher %s does not take a cudaStream_t last", h.File, f.Line, f.CName)
			}
			fs = append(fs, g)
		}
	}
	return fs, nil
}

// reserved are the Go names a parameter must not take: they would hide
// cgo's pseudo-package or a name the generated body uses.
var reserved = map[string]bool{"C": true, "kernels": true, "unsafe": true, "int": true, "int32": true,
	"int64": true, "uint32": true, "uint64": true, "float32": true, "float64": true, "bool": true, "error": true,
	"nil": true, "true": true, "false": true}

func (t Target) param(p Param) (goParam, error) {
	q := goParam{Param: p, GoName: lowerCamel(p.Name)}
	if reserved[q.GoName] || token.IsKeyword(q.GoName) || strings.HasPrefix(q.GoName, "lspgo") {
		q.GoName += "_"
	}
	switch {
	case p.Pointer():
		q.GoType, q.cgoType, q.shimType = t.Qual+"Ptr", "C.uintptr_t", "uintptr_t"
	case p.CType == "cudaStream_t":
		q.GoType, q.cgoType, q.shimType = t.Qual+"Stream", "C.uintptr_t", "uintptr_t"
	case p.CType == "int" && strings.HasSuffix(p.Name, "_bf16"):
		q.GoType, q.cgoType, q.shimType = t.Qual+"DType", "C.int", "int"
	case p.CType == "int" && slices.Contains(FlagParams, p.Name):
		q.GoType, q.cgoType, q.shimType = "bool", "C.bool", "bool"
	default:
		s, ok := goTypes[p.CType]
		if !ok {
			return q, fmt.Errorf("parameter %s has C type %s, which kernelgen does not map to Go (see goTypes)", p.Name, p.CType)
		}
		q.GoType, q.cgoType, q.check, q.shimType = s.goType, s.cgoType, s.check, p.CType
	}
	return q, nil
}

// words maps parts of C names to their Go spelling.
var words = map[string]string{"bf16": "BF16", "f32": "F32", "adamw": "AdamW", "layernorm": "LayerNorm",
	"rmsnorm": "RMSNorm", "swiglu": "SwiGLU", "rope": "RoPE", "id": "ID", "ids": "IDs"}

// goName turns lsp_layernorm_forward into LayerNormForward (or
// layerNormForward).
func goName(c string, exported bool) string {
	parts := strings.Split(strings.TrimPrefix(c, "lsp_"), "_")
	var b strings.Builder
	for _, p := range parts {
		if w, ok := words[p]; ok {
			b.WriteString(w)
		} else if p != "" {
			b.WriteString(strings.ToUpper(p[:1]) + p[1:])
		}
	}
	s := b.String()
	if !exported {
		s = lowerFirst(s)
	}
	return s
}

// constName turns LSP_SUM_SQUARES_WORK into SumSquaresWork.
func constName(c string) string {
	return goName(strings.ToLower(strings.TrimPrefix(c, "LSP_")), true)
}

// lowerCamel turns x_bf16 into xBF16 and max_norm into maxNorm; names
// without underscores (M, transA, strideC) stay as they are.
func lowerCamel(c string) string {
	if !strings.Contains(c, "_") {
		return c
	}
	parts := strings.Split(c, "_")
	var b strings.Builder
	b.WriteString(parts[0])
	for _, p := range parts[1:] {
		if w, ok := words[p]; ok {
			b.WriteString(w)
		} else if p != "" {
			b.WriteString(strings.ToUpper(p[:1]) + p[1:])
		}
	}
	return b.String()
}

func lowerFirst(s string) string {
	// Lower a leading initialism as a whole (BF16Round -> bf16Round,
	// RMSNorm -> rmsNorm), but not the capital that starts the next word.
	n := 0
	for n < len(s) && (s[n] >= 'A' && s[n] <= 'Z' || s[n] >= '0' && s[n] <= '9') {
		n++
	}
	if n > 1 && n < len(s) {
		n--
	}
	return strings.ToLower(s[:n]) + s[n:]
}

// proto writes f as one C line.
func proto(f *Func) string {
	var ps []string
	for _, p := range f.Params {
		ps = append(ps, p.CType+" "+p.Name)
	}
	return fmt.Sprintf("%s %s(%s)", f.Returns, f.CName, strings.Join(ps, ", "))
}

// comment writes lines as a Go comment.
func comment(b *bytes.Buffer, lines []string) {
	for _, l := range lines {
		if l == "" {
			b.WriteString("//\n")
		} else {
			b.WriteString("// " + l + "\n")
		}
	}
}

func (t Target) header(b *bytes.Buffer, tags string) {
	fmt.Fprintf(b, "// Code generated by kernelgen from %s; DO NOT EDIT.\n", t.Header)
	b.WriteString("// Regenerate with `go generate ./kernels`.\n\n")
	if tags != "" {
		fmt.Fprintf(b, "//go:build %s\n\n", tags)
	}
}

// face writes the cgo file: the C shims and the Go functions.
func (t Target) face(h *Header, fs []*goFunc) ([]byte, error) {
	var b bytes.Buffer
	t.header(&b, t.Tags)
	fmt.Fprintf(&b, "package %s\n\n", t.Package)
	// The launchers' header first: lspgo.h, the shims' shared C half,
	// uses CUDA's runtime (and the simulator's) that it brings in.
	fmt.Fprintf(&b, "/*\n#include %q\n#include \"lspgo.h\"\n", t.Include)
	for _, g := range fs {
		if !g.Launch {
			continue
		}
		var params, args []string
		for _, p := range g.Params {
			params = append(params, p.shimType+" "+p.Name)
			if p.shimType == "uintptr_t" {
				args = append(args, fmt.Sprintf("(%s)%s", p.CType, p.Name))
			} else {
				args = append(args, p.Name)
			}
		}
		params = append(params, "bool lspgo_sync")
		fmt.Fprintf(&b, "\nstatic lspgo_ret lspgo_%s(%s) {\n", g.CName, strings.Join(params, ", "))
		b.WriteString("\tlspgo_begin();\n")
		fmt.Fprintf(&b, "\treturn lspgo_end(%s(%s), lspgo_sync);\n}\n", g.CName, strings.Join(args, ", "))
	}
	b.WriteString("*/\nimport \"C\"\n\n")
	b.WriteString("import (\n\t\"unsafe\"\n")
	if t.Import != "" {
		fmt.Fprintf(&b, "\n\t%q\n", t.Import)
	}
	b.WriteString(")\n\n")
	// The Go half of the shims is package kernels' (ShimResult, ArgError);
	// a face only unpacks its own package's C struct for it.
	fmt.Fprintf(&b, `// lspgoResult turns a shim's result into the launcher's error.
func lspgoResult(launcher string, r C.lspgo_ret) error {
	return %sShimResult(launcher, int(r.code), unsafe.Pointer(r.msg))
}
`, t.Qual)
	for _, g := range fs {
		t.goFunc(&b, h, g)
	}
	return gofmt(t.Face, b.Bytes())
}

func (t Target) goFunc(b *bytes.Buffer, h *Header, g *goFunc) {
	b.WriteString("\n")
	kind := "runs"
	if !g.Launch {
		kind = "calls"
	}
	fmt.Fprintf(b, "// %s %s %s (%s, section %s):\n//\n//\t%s\n", g.Name, kind, g.CName, h.File, g.Family, proto(g.Func))
	if len(g.Doc) > 0 {
		b.WriteString("//\n")
		comment(b, g.Doc)
	}
	var ps []string
	for i, p := range g.Params {
		if i+1 < len(g.Params) && g.Params[i+1].GoType == p.GoType {
			ps = append(ps, p.GoName)
		} else {
			ps = append(ps, p.GoName+" "+p.GoType)
		}
	}
	ret, zero := "error", ""
	if !g.Launch {
		ret, zero = "("+g.Ret+", error)", "0, "
	}
	fmt.Fprintf(b, "func %s(%s) %s {\n", g.Name, strings.Join(ps, ", "), ret)
	for _, p := range g.Params {
		switch p.check {
		case "int32":
			fmt.Fprintf(b, "\tif int(int32(%s)) != %s {\n\t\treturn %s%sArgError(%q, %q, %s, \"does not fit in a C int\")\n\t}\n",
				p.GoName, p.GoName, zero, t.Qual, g.CName, p.Name, p.GoName)
		case "size":
			fmt.Fprintf(b, "\tif %s < 0 {\n\t\treturn %s%sArgError(%q, %q, %s, \"is negative\")\n\t}\n",
				p.GoName, zero, t.Qual, g.CName, p.Name, p.GoName)
		}
	}
	var args []string
	for _, p := range g.Params {
		args = append(args, fmt.Sprintf("%s(%s)", p.cgoType, p.GoName))
	}
	if g.Launch {
		args = append(args, "C.bool("+t.Qual+"Synchronous())")
		fmt.Fprintf(b, "\treturn lspgoResult(%q, C.lspgo_%s(%s))\n}\n", g.CName, g.CName, strings.Join(args, ", "))
	} else {
		fmt.Fprintf(b, "\treturn %s(C.%s(%s)), nil\n}\n", g.Ret, g.CName, strings.Join(args, ", "))
	}
}

// table writes the cgo-free file: the constants and Launchers.
func (t Target) table(h *Header, fs []*goFunc) ([]byte, error) {
	var b bytes.Buffer
	t.header(&b, "")
	fmt.Fprintf(&b, "package %s\n\n", t.Package)
	for _, fam := range h.Families {
		for _, c := range fam.Consts {
			if len(c.Doc) > 0 {
				comment(&b, c.Doc)
				b.WriteString("//\n")
			}
			fmt.Fprintf(&b, "// %s is %s (%s, section %s).\n", constName(c.CName), c.CName, h.File, fam.Name)
			fmt.Fprintf(&b, "const %s = %d\n\n", constName(c.CName), c.Value)
		}
	}
	fmt.Fprintf(&b, "// Launchers lists every function of %s with its Go face, in the header's order.\n", h.File)
	b.WriteString("var Launchers = []Launcher{\n")
	for _, g := range fs {
		fmt.Fprintf(&b, "\t{Name: %q, C: %q, Family: %q, Returns: %q, Params: []Param{\n", g.Name, g.CName, g.Family, g.Returns)
		for _, p := range g.Params {
			fmt.Fprintf(&b, "\t\t{Name: %q, CType: %q, GoName: %q, GoType: %q},\n", p.Name, p.CType, p.GoName, p.GoType)
		}
		b.WriteString("\t}},\n")
	}
	b.WriteString("}\n")
	return gofmt(t.Table, b.Bytes())
}

func gofmt(name string, src []byte) ([]byte, error) {
	out, err := format.Source(src)
	if err != nil {
		return nil, fmt.Errorf("kernelgen: %s does not parse as Go (a kernelgen bug): %v\n%s", name, err, src)
	}
	return out, nil
}
