package gpt2

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/model"
)

// Config is a model.Spec whose HFConfig is the config.json ExportHF
// writes, and which ReadHFConfig reads back as the same Config.
func TestSpec(t *testing.T) {
	c := Config{V: 257, MaxT: 16, C: 8, L: 2, NH: 2, Eps: 1e-5}
	var s model.Spec = c
	if s.Family() != "gpt2" || s.MaxSeqLen() != 16 || s.VocabSize() != 257 {
		t.Errorf("family %q, context %d, vocab %d", s.Family(), s.MaxSeqLen(), s.VocabSize())
	}
	want := []any{"params", c.NumParams(), "layers", 2, "width", 8, "heads", 2, "vocab", 257}
	if got := s.Describe(); len(got) != len(want) {
		t.Errorf("Describe = %v, want %v", got, want)
	} else {
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("Describe = %v, want %v", got, want)
				break
			}
		}
	}
	init, ref := s.Init(5), Init(c, 5)
	if len(init) != len(ref) || init[0] != ref[0] || init[len(init)-1] != ref[len(ref)-1] {
		t.Error("Spec.Init differs from Init")
	}
	dir := t.TempDir()
	if err := ExportHF(dir, c, ref); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.HFConfig()
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != string(file) {
		t.Errorf("HFConfig:\n%s\nExportHF wrote:\n%s", raw, file)
	}
	if back, err := ReadHFConfig(dir); err != nil || back != c {
		t.Errorf("ReadHFConfig = %+v, %v; want %+v", back, err, c)
	}
}
