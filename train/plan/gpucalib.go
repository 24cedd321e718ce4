// A GPU's calibration: the per-family efficiencies one GPU achieved (the
// GPU bundle's bench-kernels stage measures them against this package's
// cost model), read back by lsp-train plan --gpu G --calibration FILE.

package plan

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/trace"
)

// GPUCalibration is what a GPU measured. Figures from one GPU calibrate
// the planner for that GPU's preset only: another card's efficiencies
// differ (memory system, clocks, SM count), so Apply refuses another
// preset rather than silently predicting one card from another.
type GPUCalibration struct {
	Kind string `json:"kind"` // "gpu" (a CPU calibration has no kind)
	// Preset is the train/plan GPU preset the figures calibrate; Device
	// the name the driver gave the card.
	Preset string `json:"preset"`
	Device string `json:"device"`
	// Simulated: measured on the simulated CUDA runtime (tests only; not
	// a GPU's figures).
	Simulated bool `json:"simulated,omitempty"`
	// Eff is each measured family's fraction of peak (as GPU.Eff); a
	// family absent keeps the preset's assumption.
	Eff map[trace.Family]float64 `json:"eff"`
	// Context is the CUDA context's device memory as measured, bytes (0:
	// not measured; the preset's assumption stays).
	Context int64 `json:"context,omitempty"`
}

// GPUCalibrationKind is GPUCalibration.Kind.
const GPUCalibrationKind = "gpu"

// WriteFile writes c as JSON to path.
func (c GPUCalibration) WriteFile(path string) error {
	c.Kind = GPUCalibrationKind
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("gpu calibration: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("gpu calibration: %w", err)
	}
	return nil
}

// ReadGPUCalibration reads a file WriteFile wrote, and checks it.
func ReadGPUCalibration(path string) (GPUCalibration, error) {
	var c GPUCalibration
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if c.Kind != GPUCalibrationKind {
		return c, fmt.Errorf("%s: not a GPU calibration (kind %q, want %q; a CPU calibration is for --gpu cpu)", path, c.Kind, GPUCalibrationKind)
	}
	if _, ok := GPUs[c.Preset]; !ok {
		return c, fmt.Errorf("%s: unknown GPU preset %q (want one of %s)", path, c.Preset, names(GPUs))
	}
	for f, e := range c.Eff {
		if !(e > 0 && e <= 1) {
			return c, fmt.Errorf("%s: family %s: efficiency %v, want in (0, 1]", path, f, e)
		}
	}
	if c.Context < 0 {
		return c, fmt.Errorf("%s: negative context size %d", path, c.Context)
	}
	return c, nil
}

// Apply sets m's efficiencies (and context size, when measured) from c;
// m must be the machine of c's preset (preset is its --gpu name).
func (c GPUCalibration) Apply(m *Machine, preset string) error {
	name, _ := GPUName(preset)
	if name != c.Preset {
		return fmt.Errorf("the calibration was measured on %s (preset %s), not %s: figures from one GPU calibrate that GPU only",
			c.Device, c.Preset, preset)
	}
	eff := make(map[trace.Family]float64, len(m.GPU.Eff)+len(c.Eff))
	for f, e := range m.GPU.Eff {
		eff[f] = e
	}
	for f, e := range c.Eff {
		eff[f] = e
	}
	m.GPU.Eff = eff
	if c.Context > 0 {
		m.GPU.Context = c.Context
	}
	return nil
}

// String is one line: the device and each family's efficiency.
func (c GPUCalibration) String() string {
	fams := make([]string, 0, len(c.Eff))
	for f := range c.Eff {
		fams = append(fams, string(f))
	}
	slices.Sort(fams)
	parts := make([]string, len(fams))
	for i, f := range fams {
		parts[i] = fmt.Sprintf("%s %.3g", f, c.Eff[trace.Family(f)])
	}
	sim := ""
	if c.Simulated {
		sim = " (SIMULATED runtime: not a GPU's figures)"
	}
	return fmt.Sprintf("%s as preset %s%s: %s", c.Device, c.Preset, sim, strings.Join(parts, ", "))
}
