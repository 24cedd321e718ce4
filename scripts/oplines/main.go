// Command oplines counts the hand-written lines of code that belong to one
// Backend op: in the given Go files, the non-blank, non-comment lines of
// every top-level function or method named after an op, and of every
// element of a composite literal, case clause or top-level declaration
// that names an op (as a string, "LayerNormForward", or an identifier or
// selector, Calls.LayerNormForward) without being inside one already
// counted. It is the measure of issue 44 ("One table for the ops"): run it
// on the op plumbing before and after,
//
//	go run ./scripts/oplines -rev REV FILE...
//
// which reads each FILE as it was at git revision REV (a file missing
// there counts 0), or without -rev as it is now. The ops are the method
// names of the Ops interface, read from whichever of
// train/backend/backend.go or train/backend/ops_gen.go declares it at
// that revision.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

func main() {
	rev := flag.String("rev", "", "git revision to read the files at (default: the working tree)")
	flag.Parse()
	read := func(path string) ([]byte, error) {
		if *rev == "" {
			return os.ReadFile(path)
		}
		return exec.Command("git", "show", *rev+":"+path).Output()
	}
	ops := map[string]bool{}
	for _, p := range []string{"train/backend/ops_gen.go", "train/backend/backend.go"} {
		src, err := read(p)
		if err != nil {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, src, 0)
		if err != nil {
			fail(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Ops" {
				for _, m := range ts.Type.(*ast.InterfaceType).Methods.List {
					ops[m.Names[0].Name] = true
				}
			}
			return true
		})
	}
	if len(ops) == 0 {
		fail(fmt.Errorf("no Ops interface found"))
	}
	fs := token.NewFileSet()
	var files []*file
	for _, path := range flag.Args() {
		src, err := read(path)
		if err != nil {
			files = append(files, &file{path: path})
			continue
		}
		f, err := parser.ParseFile(fs, path, src, 0)
		if err != nil {
			fail(err)
		}
		files = append(files, &file{path: path, src: src, f: f, lines: map[int]bool{}})
	}
	for _, x := range files {
		if x.f != nil {
			x.markOps(fs, ops)
		}
	}
	followHelpers(fs, files)
	total := 0
	for _, x := range files {
		if x.f == nil {
			fmt.Printf("%6d %s (absent)\n", 0, x.path)
			continue
		}
		n := x.count()
		fmt.Printf("%6d %s\n", n, x.path)
		total += n
	}
	fmt.Printf("%6d total\n", total)
}

// file is one file read, with the lines that belong to one op.
type file struct {
	path  string
	src   []byte
	f     *ast.File
	lines map[int]bool
}

func (x *file) mark(fs *token.FileSet, n ast.Node) {
	for l := fs.Position(n.Pos()).Line; l <= fs.Position(n.End()).Line; l++ {
		x.lines[l] = true
	}
}

// markOps marks what names an op: a function or method named after one,
// and the smallest composite-literal element, case clause or simple
// statement that names one.
func (x *file) markOps(fs *token.FileSet, ops map[string]bool) {
	names := func(n ast.Node) bool {
		found := false
		ast.Inspect(n, func(m ast.Node) bool {
			switch v := m.(type) {
			case *ast.BasicLit:
				if s, err := strconv.Unquote(v.Value); err == nil && v.Kind == token.STRING && ops[s] {
					found = true
				}
			case *ast.Ident:
				found = found || ops[v.Name]
			}
			return !found
		})
		return found
	}
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch v := n.(type) {
		case *ast.FuncDecl:
			if ops[v.Name.Name] {
				x.mark(fs, v)
				return false
			}
		case *ast.CompositeLit:
			for _, e := range v.Elts {
				if names(e) {
					x.mark(fs, e)
				} else {
					ast.Inspect(e, visit)
				}
			}
			return false
		case *ast.CaseClause, *ast.ExprStmt, *ast.AssignStmt, *ast.ReturnStmt, *ast.DeclStmt:
			if names(v) {
				x.mark(fs, v)
				return false
			}
		}
		return true
	}
	ast.Inspect(x.f, visit)
}

// followHelpers marks, until nothing changes, every top-level function
// that is used, and used only, from marked lines: a helper of some ops
// (cuda's ropeArgs before the table, the table's rules after) belongs to
// them.
func followHelpers(fs *token.FileSet, files []*file) {
	marked := func(pos token.Pos) bool {
		p := fs.Position(pos)
		for _, x := range files {
			if x.path == p.Filename {
				return x.lines[p.Line]
			}
		}
		return false
	}
	for changed := true; changed; {
		changed = false
		for _, x := range files {
			if x.f == nil {
				continue
			}
			for _, d := range x.f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || marked(fd.Pos()) {
					continue
				}
				uses, inMarked := 0, 0
				for _, y := range files {
					if y.f == nil {
						continue
					}
					ast.Inspect(y.f, func(n ast.Node) bool {
						if id, ok := n.(*ast.Ident); ok && id.Name == fd.Name.Name && id != fd.Name {
							uses++
							if marked(id.Pos()) {
								inMarked++
							}
						}
						return true
					})
				}
				if uses > 0 && uses == inMarked {
					x.mark(fs, fd)
					changed = true
				}
			}
		}
	}
}

// count is the marked lines that are neither blank nor only a comment.
func (x *file) count() int {
	text := strings.Split(string(x.src), "\n")
	n := 0
	for l := range x.lines {
		if l-1 < len(text) {
			t := strings.TrimSpace(text[l-1])
			if t != "" && !strings.HasPrefix(t, "//") {
				n++
			}
		}
	}
	return n
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "oplines:", err)
	os.Exit(1)
}
