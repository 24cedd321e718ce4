// The design document names files and functions to follow a step through
// the code (docs/DESIGN.md, "Life of a step"); a rename that leaves it
// pointing at nothing fails here instead of misleading its next reader.

package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDesignDocNames checks that every repository path docs/DESIGN.md
// names exists, and that every function, method or macro its "Life of a
// step" section quotes is defined somewhere in the Go, CUDA or C sources.
func TestDesignDocNames(t *testing.T) {
	const root = "../.."
	doc := string(readFile(t, root, "docs/DESIGN.md"))
	pathRE := regexp.MustCompile(`\b(?:cmd|train|cuda|kernels|host|internal|bench|scripts|docs)/[A-Za-z0-9_./-]*[A-Za-z0-9_]`)
	for _, p := range pathRE.FindAllString(doc, -1) {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			// A package path followed by a member (train/device.Kind.Set)
			// names the package.
			if dir, _, ok := strings.Cut(p, "."); !ok || !isDir(filepath.Join(root, dir)) {
				t.Errorf("docs/DESIGN.md names %s, which does not exist", p)
			}
		}
	}

	start := strings.Index(doc, "## Life of a step")
	end := strings.Index(doc[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal(`docs/DESIGN.md has no section "Life of a step"`)
	}
	life := doc[start : start+1+end]
	var sources strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "third_party") {
			return filepath.SkipDir
		}
		switch filepath.Ext(path) {
		case ".go", ".cu", ".cuh", ".h", ".c", ".cc", ".cpp":
			if strings.HasSuffix(path, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sources.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every name the sources define: Go functions, methods and types, C
	// and CUDA functions and kernels (templates too), and macros.
	defined := map[string]bool{}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`func (?:\([^)]*\) )?(\w+)`),
		regexp.MustCompile(`\btype (\w+)`),
		regexp.MustCompile(`#define (\w+)`),
		regexp.MustCompile(`__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)`),
		regexp.MustCompile(`\b(\w+)(?:<[^<>;{}]*>)?\s*\([^;{}]*\)\s*\{`),
	} {
		for _, m := range re.FindAllStringSubmatch(sources.String(), -1) {
			defined[m[1]] = true
		}
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	ident := regexp.MustCompile(`^[\w.()*]+$`)
	checked := 0
	for _, m := range quoted.FindAllStringSubmatch(life, -1) {
		q := m[1]
		if !ident.MatchString(q) || strings.HasPrefix(q, "-") {
			continue // a flag, a command line or an expression
		}
		name := q[strings.LastIndexAny(q, ".)")+1:]
		if name == "" || name == "init" {
			continue
		}
		if !defined[name] {
			t.Errorf("docs/DESIGN.md, Life of a step: `%s` is defined nowhere in the sources", q)
		}
		checked++
	}
	if checked < 20 {
		t.Errorf("only %d names checked in Life of a step; the section has changed shape", checked)
	}
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
