package catalog

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// TestExportTensorSameBytes: an export from a device tensor (F32, and
// BF16 holding bf16-rounded values) writes the files that one from the
// same values on the host writes, byte for byte; and those are the
// bytes the whole-model export wrote before exports streamed (sha256 of
// model.safetensors from seed 3, recorded from that code).
func TestExportTensorSameBytes(t *testing.T) {
	tiny, err := llama.Preset("llama-tiny")
	if err != nil {
		t.Fatal(err)
	}
	tied := tiny
	tied.Tied = true
	before := []string{
		"787d345f43655d033c6869d1f970dc4a2d864d956d18621824f9a15fdb432c7d",
		"d15f482fe6cfc423c46d5cba523aa46658ec8ce826efae954e146e7161e7cd11",
		"c40483443801f439ae189179aa0d792012b665d98cc7616cb31d150cec9cd0b1",
	}
	be := cpu.New(cpu.Config{})
	s := be.DefaultStream()
	for k, spec := range []model.Spec{micro, tiny, tied} {
		name := fmt.Sprintf("%s-%d", spec.Family(), spec.NumParams())
		vals := spec.Init(3)
		host := filepath.Join(t.TempDir(), "host")
		if err := Export(spec, host, vals, "", nil); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(host, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(raw)); got != before[k] {
			t.Errorf("%s: model.safetensors has sha256 %s, the whole-model export wrote %s", name, got, before[k])
		}
		for _, dt := range []backend.DType{backend.F32, backend.BF16} {
			want := host
			v := vals
			if dt == backend.BF16 {
				v = make([]float32, len(vals))
				for i, x := range vals {
					v[i] = bf16.ToFloat32(bf16.FromFloat32(x))
				}
				want = filepath.Join(t.TempDir(), "host-bf16")
				if err := Export(spec, want, v, "", nil); err != nil {
					t.Fatal(err)
				}
			}
			params, err := be.Alloc("params", len(v), dt)
			if err != nil {
				t.Fatal(err)
			}
			if err := backend.Upload(be, s, params, v); err != nil {
				t.Fatal(err)
			}
			dev := filepath.Join(t.TempDir(), "dev")
			if err := ExportTensor(spec, dev, be, s, params, "", nil); err != nil {
				t.Fatal(err)
			}
			sameFiles(t, want, dev)
			be.Free(params)
		}
	}
	short, err := be.Alloc("params", micro.NumParams()-1, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, ExportTensor(micro, filepath.Join(t.TempDir(), "x"), be, s, short, "", nil), "elements", fmt.Sprint(micro.NumParams()))
}

// sameFiles fails unless directories a and b hold the same files with
// the same bytes.
func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	ea, err := os.ReadDir(a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := os.ReadDir(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(ea) != len(eb) {
		t.Fatalf("%s holds %d files, %s %d", a, len(ea), b, len(eb))
	}
	for i, e := range ea {
		if e.Name() != eb[i].Name() {
			t.Fatalf("%s holds %s where %s holds %s", a, e.Name(), b, eb[i].Name())
		}
		x, err := os.ReadFile(filepath.Join(a, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if string(x) != string(y) {
			t.Errorf("%s differs between %s and %s", e.Name(), a, b)
		}
	}
}
