// Tests for WriteFile: success, failure leaving the old file intact and no
// temp file behind, permissions, and a missing directory.

package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFile(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name    string
		old     string // "" means no existing file
		fn      func(w io.Writer) error
		want    string // content expected afterwards ("" with old=="" : no file)
		wantErr error
	}{
		{"new file", "", func(w io.Writer) error { _, err := io.WriteString(w, "hello"); return err }, "hello", nil},
		{"replace", "old content", func(w io.Writer) error { _, err := io.WriteString(w, "new"); return err }, "new", nil},
		{"fail keeps old", "old content", func(w io.Writer) error {
			io.WriteString(w, "partial garbage that must not land")
			return errBoom
		}, "old content", errBoom},
		{"fail no old", "", func(w io.Writer) error { return errBoom }, "", errBoom},
		{"large", "x", func(w io.Writer) error {
			buf := make([]byte, 3<<20)
			for i := range buf {
				buf[i] = byte(i)
			}
			_, err := w.Write(buf)
			return err
		}, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f.bin")
			if tc.old != "" {
				if err := os.WriteFile(path, []byte(tc.old), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := WriteFile(path, 0o644, tc.fn)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			names := listDir(t, dir)
			got, rerr := os.ReadFile(path)
			switch {
			case tc.name == "large":
				if rerr != nil || len(got) != 3<<20 || got[1000] != byte(1000%256) {
					t.Fatalf("large file wrong: len %d err %v", len(got), rerr)
				}
			case tc.old == "" && tc.wantErr != nil:
				if !os.IsNotExist(rerr) {
					t.Fatalf("file exists after failed write: %v", rerr)
				}
			default:
				if rerr != nil || string(got) != tc.want {
					t.Fatalf("content = %q (%v), want %q", got, rerr, tc.want)
				}
			}
			// Exactly the target (or nothing): no temp file left behind.
			wantN := 1
			if tc.old == "" && tc.wantErr != nil {
				wantN = 0
			}
			if len(names) != wantN {
				t.Fatalf("directory holds %v, want %d file(s)", names, wantN)
			}
		})
	}
}

func TestWriteFilePerm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p")
	if err := WriteFile(path, 0o640, func(w io.Writer) error { return nil }); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("perm = %v, want 0640", st.Mode().Perm())
	}
}

func TestWriteFileMissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope", "f")
	err := WriteFile(path, 0o644, func(w io.Writer) error { return nil })
	if err == nil {
		t.Fatal("want error for missing directory")
	}
}
