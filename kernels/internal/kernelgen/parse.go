// Package kernelgen writes the Go face of the CUDA launchers (package
// kernels) from their C header, as mumax/3's cuda2go does: it parses every
// declaration between the header's "// BEGIN family" and "// END family"
// markers and emits, per launcher, a cgo shim and a Go function (Face), plus
// a cgo-free table of the launchers and the header's constants (Table).
//
// The parser knows the small C subset kernels.h uses: prototypes of
// extern "C" functions returning cudaError_t or a scalar, whose parameters
// are pointers or the scalar types of goTypes, and "#define NAME integer"
// constants, each possibly preceded by // comments (its documentation). It
// refuses anything else inside a section, and a prototype outside every
// section, naming the line, so a header edit it cannot follow stops the
// build instead of leaving a launcher without a face.
package kernelgen

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Header is a parsed launcher header.
type Header struct {
	File     string // its name, for messages and generated comments
	Families []*Family
}

// Family is one "// BEGIN name" ... "// END name" section.
type Family struct {
	Name   string
	Funcs  []*Func
	Consts []*Const
}

// Func is one function prototype.
type Func struct {
	CName   string
	Returns string // C return type, e.g. cudaError_t or size_t
	Params  []Param
	Doc     []string // the // comment lines right before it, without "// "
	Line    int
	Family  string
}

// Param is one parameter: its C type (e.g. "const __nv_bfloat16*") and name.
type Param struct {
	CType string
	Name  string
}

// Pointer reports whether the parameter is a pointer.
func (p Param) Pointer() bool { return strings.HasSuffix(p.CType, "*") }

// Const is a "#define NAME integer" line.
type Const struct {
	CName string
	Value int64
	Doc   []string
	Line  int
}

var (
	beginRE  = regexp.MustCompile(`^//\s*BEGIN\s+([A-Za-z0-9_]+)\s*$`)
	endRE    = regexp.MustCompile(`^//\s*END\s+([A-Za-z0-9_]+)\s*$`)
	defineRE = regexp.MustCompile(`^#\s*define\s+([A-Za-z_][A-Za-z0-9_]*)\s+(.*?)\s*$`)
	protoRE  = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_ ]*?)\s*\b([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*;$`)
	identRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// looksLikeDecl catches a prototype outside every section.
	looksLikeDecl = regexp.MustCompile(`^(cudaError_t|size_t)\s+\w+\s*\(`)
)

// Parse reads a header. file names it in errors.
func Parse(file string, src []byte) (*Header, error) {
	h := &Header{File: file}
	var (
		fam     *Family
		doc     []string
		pending strings.Builder // a prototype spanning lines
		pendAt  int
	)
	errAt := func(line int, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...))
	}
	// endDecl takes the prototype in pending, complete at its ";", into the
	// section, with the comment before it.
	endDecl := func() error {
		f, err := parseProto(pending.String())
		if err != nil {
			return errAt(pendAt, "%v", err)
		}
		f.Doc, f.Line, f.Family = doc, pendAt, fam.Name
		fam.Funcs = append(fam.Funcs, f)
		doc = nil
		pending.Reset()
		return nil
	}
	lines := strings.Split(string(src), "\n")
	for i, raw := range lines {
		n := i + 1
		line := strings.TrimSpace(raw)
		if pending.Len() > 0 {
			if line == "" || strings.HasPrefix(line, "//") || strings.HasPrefix(line, "#") {
				return nil, errAt(pendAt, "a declaration without its closing \");\" before line %d", n)
			}
			pending.WriteString(" ")
			pending.WriteString(line)
			if strings.HasSuffix(line, ";") {
				if err := endDecl(); err != nil {
					return nil, err
				}
			}
			continue
		}
		if m := beginRE.FindStringSubmatch(line); m != nil {
			if fam != nil {
				return nil, errAt(n, "BEGIN %s inside section %s (no END %s before it)", m[1], fam.Name, fam.Name)
			}
			for _, f := range h.Families {
				if f.Name == m[1] {
					return nil, errAt(n, "a second section named %s", m[1])
				}
			}
			fam, doc = &Family{Name: m[1]}, nil
			continue
		}
		if m := endRE.FindStringSubmatch(line); m != nil {
			if fam == nil || fam.Name != m[1] {
				return nil, errAt(n, "END %s without BEGIN %s", m[1], m[1])
			}
			h.Families = append(h.Families, fam)
			fam, doc = nil, nil
			continue
		}
		if fam == nil {
			if looksLikeDecl.MatchString(line) {
				return nil, errAt(n, "a declaration outside every // BEGIN family ... // END family section: kernelgen would give it no Go face")
			}
			continue
		}
		switch {
		case line == "":
			doc = nil
		case strings.HasPrefix(line, "//"):
			doc = append(doc, strings.TrimPrefix(strings.TrimPrefix(line, "//"), " "))
		case strings.HasPrefix(line, "/*"):
			return nil, errAt(n, "a /* */ comment inside section %s: use // comments (they become the Go documentation)", fam.Name)
		case strings.HasPrefix(line, "#"):
			m := defineRE.FindStringSubmatch(line)
			if m == nil {
				return nil, errAt(n, "a preprocessor line kernelgen does not know inside section %s: %q", fam.Name, line)
			}
			v, err := strconv.ParseInt(m[2], 0, 64)
			if err != nil {
				return nil, errAt(n, "#define %s %s: kernelgen takes only integer constants", m[1], m[2])
			}
			// The comment stays for the declaration after the #define: in
			// kernels.h a constant and the launcher it sizes share one.
			fam.Consts = append(fam.Consts, &Const{CName: m[1], Value: v, Doc: doc, Line: n})
		default:
			pendAt = n
			pending.WriteString(line)
			if strings.HasSuffix(line, ";") {
				if err := endDecl(); err != nil {
					return nil, err
				}
			}
		}
	}
	if pending.Len() > 0 {
		return nil, errAt(pendAt, "a declaration without its closing \");\"")
	}
	if fam != nil {
		return nil, fmt.Errorf("%s: section %s has no // END %s", file, fam.Name, fam.Name)
	}
	seen := map[string]int{}
	for _, f := range h.Families {
		for _, fn := range f.Funcs {
			if l, ok := seen[fn.CName]; ok {
				return nil, errAt(fn.Line, "%s is declared twice (also at line %d)", fn.CName, l)
			}
			seen[fn.CName] = fn.Line
		}
	}
	return h, nil
}

// parseProto parses one prototype, e.g.
// "cudaError_t lsp_x(float* out, const void* in, long long n, cudaStream_t stream);".
func parseProto(s string) (*Func, error) {
	m := protoRE.FindStringSubmatch(strings.Join(strings.Fields(s), " "))
	if m == nil {
		return nil, fmt.Errorf("not a function prototype kernelgen can read: %q", s)
	}
	f := &Func{Returns: normType(m[1]), CName: m[2]}
	args := strings.TrimSpace(m[3])
	if args == "" || args == "void" {
		return f, nil
	}
	for _, a := range strings.Split(args, ",") {
		p, err := parseParam(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", f.CName, err)
		}
		for _, q := range f.Params {
			if q.Name == p.Name {
				return nil, fmt.Errorf("%s: two parameters named %s", f.CName, p.Name)
			}
		}
		f.Params = append(f.Params, p)
	}
	return f, nil
}

// parseParam splits "const __nv_bfloat16* A" into its type and name.
func parseParam(s string) (Param, error) {
	s = strings.TrimSpace(s)
	if strings.ContainsAny(s, "[]()=.") {
		return Param{}, fmt.Errorf("parameter %q: arrays, function pointers, defaults and varargs are not supported", s)
	}
	// The name is the last identifier; the '*'s may stick to either side.
	s = strings.ReplaceAll(s, "*", " * ")
	toks := strings.Fields(s)
	if len(toks) < 2 || !identRE.MatchString(toks[len(toks)-1]) || toks[len(toks)-1] == "const" {
		return Param{}, fmt.Errorf("parameter %q has no name", strings.TrimSpace(s))
	}
	name := toks[len(toks)-1]
	return Param{CType: normType(strings.Join(toks[:len(toks)-1], " ")), Name: name}, nil
}

// normType writes a C type with single spaces and the '*'s attached to the
// type: "const float *" becomes "const float*".
func normType(t string) string {
	t = strings.Join(strings.Fields(strings.ReplaceAll(t, "*", " * ")), " ")
	return strings.ReplaceAll(t, " *", "*")
}
