//go:build cuda || cudasim

// The measured ops beside train/plan's prediction of them for this GPU,
// by family, and the efficiencies that would make the prediction match
// (-calibration).

package kernelbench

import (
	"fmt"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/plan"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// predictor is train/plan's cost model of the GPU at hand.
type predictor struct {
	preset, device string
	m              plan.Machine
	// simulated: the device is the simulated runtime, priced as the
	// h100 preset only so that the comparison and the calibration file
	// are exercised in tests; its figures say nothing of a GPU.
	simulated bool
}

// newPredictor is the predictor of the device named name, or nil when
// train/plan has no preset of it (no comparison, no calibration).
func newPredictor(name string) (*predictor, error) {
	key := presetKey(name)
	if simulated {
		key = "h100"
	}
	if key == "" {
		fmt.Printf("vs plan: no train/plan preset for %q: no prediction beside the measurements, no calibration\n", name)
		return nil, nil
	}
	m, err := plan.Preset(key, "", "")
	if err != nil {
		return nil, fmt.Errorf("preset %s: %w", key, err)
	}
	return &predictor{preset: key, device: name, m: m, simulated: simulated}, nil
}

// famSum is one family's ops: calls timed, their measured and predicted
// seconds, and the predicted seconds less the launch overhead at
// efficiency 1 (work: the part the efficiency divides).
type famSum struct {
	calls            int
	meas, pred, work float64
}

// familySums are the families' sums.
type familySums map[trace.Family]*famSum

// addOp adds the runs of o, each taking one of times.
func (fs familySums) addOp(pm *predictor, o trace.Op, times []float64) {
	s := fs[o.Family]
	if s == nil {
		s = &famSum{}
		fs[o.Family] = s
	}
	for _, t := range times {
		s.calls++
		s.meas += t
		if pm == nil {
			continue
		}
		p := pm.m.OpTime(o)
		eff := 1.0
		if e, ok := pm.m.GPU.Eff[o.Family]; ok {
			eff = e
		}
		s.pred += p
		s.work += (p - pm.m.GPU.Launch) * eff
	}
}

func (fs familySums) add(o familySums) {
	for f, s := range o {
		t := fs[f]
		if t == nil {
			t = &famSum{}
			fs[f] = t
		}
		t.calls += s.calls
		t.meas += s.meas
		t.pred += s.pred
		t.work += s.work
	}
}

func (fs familySums) families() []trace.Family {
	var fams []trace.Family
	for f := range fs {
		fams = append(fams, f)
	}
	slices.Sort(fams)
	return fams
}

// eff is the efficiency at which pm's model predicts f's measured time:
// the work over the measured time less the launch overheads (over the
// whole measured time when the overheads exceed it), at most 1.
func (fs familySums) eff(pm *predictor, f trace.Family) float64 {
	s := fs[f]
	d := s.meas - float64(s.calls)*pm.m.GPU.Launch
	if d <= 0 {
		d = s.meas
	}
	if d <= 0 || s.work <= 0 {
		return 0
	}
	return min(s.work/d, 1)
}

// print is the families' measured time beside the prediction.
func (fs familySums) print(pm *predictor, title string) {
	if pm == nil {
		return
	}
	sim := ""
	if pm.simulated {
		sim = " (SIMULATED runtime priced as h100: the ratios mean nothing)"
	}
	fmt.Printf("\n-- %s vs plan (train/plan preset %s%s): ops timed alone, summed over their runs --\n", title, pm.preset, sim)
	fmt.Printf("%-11s %6s %12s %12s %9s %10s %10s\n", "family", "runs", "measured ms", "planned ms", "meas/plan", "eff plan", "eff meas")
	for _, f := range fs.families() {
		s := fs[f]
		assumed := 1.0
		if e, ok := pm.m.GPU.Eff[f]; ok {
			assumed = e
		}
		ratio := 0.0
		if s.pred > 0 {
			ratio = s.meas / s.pred
		}
		fmt.Printf("%-11s %6d %12.3f %12.3f %9.2f %10.2f %10.3g\n", f, s.calls, s.meas*1e3, s.pred*1e3, ratio, assumed, fs.eff(pm, f))
	}
}

// writeCalibration writes the measured efficiencies of every family to
// path, for lsp-train plan --gpu <preset> --calibration path.
func (fs familySums) writeCalibration(path string, pm *predictor) error {
	if pm == nil {
		return fmt.Errorf("-calibration: no train/plan preset for this device, so no efficiencies to write")
	}
	c := plan.GPUCalibration{Preset: pm.preset, Device: pm.device, Simulated: pm.simulated, Eff: map[trace.Family]float64{}}
	for _, f := range fs.families() {
		if e := fs.eff(pm, f); e > 0 {
			c.Eff[f] = e
		}
	}
	if err := c.WriteFile(path); err != nil {
		return err
	}
	fmt.Printf("calibration: %s -> %s\n", c, path)
	return nil
}
