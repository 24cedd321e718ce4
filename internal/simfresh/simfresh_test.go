package simfresh

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"kernels/b.cu", "kernels/a.cu", "kernels/sim/sim.h"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The hash is over the files in the order of their sorted paths, as
	// the Makefile's $(sort ...) gives them.
	h := sha256.Sum256([]byte("kernels/a.cukernels/b.cukernels/sim/sim.h"))
	hash := hex.EncodeToString(h[:])[:16]
	stamp := time.Now().Add(time.Hour).Format("Jan _2 2006 15:04:05")
	if err := Check(stamp+"|"+hash, root, "rebuild"); err != nil {
		t.Errorf("matching hash: %v", err)
	}
	err := Check(stamp+"|0123456789abcdef", root, "rebuild")
	if err == nil || !strings.Contains(err.Error(), "stale build") || !strings.HasSuffix(err.Error(), "rebuild") {
		t.Errorf("other hash: %v, want a stale build ending with the fix", err)
	}
	// Without a hash, the file times against the compile time.
	if err := Check(stamp+"|", root, "rebuild"); err != nil {
		t.Errorf("sources older than the build: %v", err)
	}
	old := time.Now().Add(-time.Hour).Format("Jan _2 2006 15:04:05")
	err = Check(old+"|", root, "rebuild")
	if err == nil || !strings.Contains(err.Error(), "kernels/a.cu changed") {
		t.Errorf("sources newer than the build: %v, want kernels/a.cu named", err)
	}
	if err := Check("not a date|", root, "rebuild"); err == nil {
		t.Error("a bad stamp was accepted")
	}
}
