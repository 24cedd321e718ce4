// Tests for WriteDir (a new directory, a replaced one, a failure keeping
// the old one, a disk that fills at each point) and Clean.

package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/faults"
)

func writeTwo(content string) func(tmp string) error {
	return func(tmp string) error {
		for _, name := range []string{"a", "b"} {
			if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
}

func dirContent(t *testing.T, dir string) []string {
	t.Helper()
	var got []string
	for _, name := range listDir(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, name+"="+string(b))
	}
	return got
}

func TestWriteDir(t *testing.T) {
	parent := t.TempDir()
	path := filepath.Join(parent, "hf")
	if err := WriteDir(path, 0o755, writeTwo("v1")); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(path, 0o755, writeTwo("v2")); err != nil {
		t.Fatal(err)
	}
	if got := dirContent(t, path); !slices.Equal(got, []string{"a=v2", "b=v2"}) {
		t.Fatalf("replaced directory holds %v", got)
	}
	// A failing fn, and a disk that fills at each point: the old one stays.
	boom := errors.New("boom")
	if err := WriteDir(path, 0o755, func(tmp string) error { writeTwo("v3")(tmp); return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	for _, spec := range []string{"dir-written@hf", "temp-written@x"} {
		disarm, err := faults.Arm(faults.Fail, spec)
		if err != nil {
			t.Fatal(err)
		}
		err = WriteDir(path, 0o755, func(tmp string) error {
			return WriteFile(filepath.Join(tmp, "x"), 0o644, func(w io.Writer) error { return nil })
		})
		disarm()
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("%s: err = %v, want ENOSPC", spec, err)
		}
	}
	if got := dirContent(t, path); !slices.Equal(got, []string{"a=v2", "b=v2"}) {
		t.Fatalf("after failed writes the directory holds %v, want the old one", got)
	}
	if names := listDir(t, parent); !slices.Equal(names, []string{"hf"}) {
		t.Fatalf("parent holds %v, want only hf", names)
	}
}

func TestClean(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{".ck.tmp-1", "keep.txt", ".hidden", ".x.old-2"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, ".hf.tmp-3", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, ".hf.old-4"), 0o755); err != nil {
		t.Fatal(err)
	}
	done, err := Clean(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(done)
	if want := []string{".ck.tmp-1", ".hf.old-4", ".hf.tmp-3", ".x.old-2"}; !slices.Equal(done, want) {
		t.Errorf("Clean did %v, want %v", done, want)
	}
	// .hf.old-4 went back to hf (which was missing); .x.old-2 likewise to x.
	if names := listDir(t, dir); !slices.Equal(names, []string{".hidden", "hf", "keep.txt", "x"}) {
		t.Errorf("after Clean: %v", names)
	}
}
