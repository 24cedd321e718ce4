package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/trace"
)

// A GPU calibration round-trips through its file, sets the measured
// families' efficiencies (the others keep the preset's) and the context,
// and is refused for another preset and when it is not a GPU's.
func TestGPUCalibration(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	c := GPUCalibration{Preset: "h200", Device: "NVIDIA H200", Eff: map[trace.Family]float64{trace.Gemm: 0.55}, Context: 600 << 20}
	if err := c.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadGPUCalibration(path)
	if err != nil {
		t.Fatal(err)
	}
	m := gpuPreset(t, "h200")
	norm := m.GPU.Eff[trace.Norm]
	if err := got.Apply(&m, "H200"); err != nil {
		t.Fatal(err)
	}
	if m.GPU.Eff[trace.Gemm] != 0.55 || m.GPU.Eff[trace.Norm] != norm || m.GPU.Context != 600<<20 {
		t.Errorf("applied: gemm %v (want 0.55), norm %v (want %v), context %d", m.GPU.Eff[trace.Gemm], m.GPU.Eff[trace.Norm], norm, m.GPU.Context)
	}
	if _, err := Preset("h200", "", ""); err != nil || gpuEff()[trace.Gemm] == 0.55 {
		t.Errorf("Apply changed the preset's shared efficiencies")
	}
	h100 := gpuPreset(t, "h100")
	if err := got.Apply(&h100, "h100"); err == nil || !strings.Contains(err.Error(), "calibrate that GPU only") {
		t.Errorf("applied to another preset: %v", err)
	}
	for name, body := range map[string]string{
		"cpu":    `{"gemms": []}`,
		"preset": `{"kind": "gpu", "preset": "v100", "eff": {}}`,
		"eff":    `{"kind": "gpu", "preset": "h100", "eff": {"gemm": 1.5}}`,
	} {
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadGPUCalibration(p); err == nil {
			t.Errorf("%s: read %s without an error", name, body)
		}
	}
}
