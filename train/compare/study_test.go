package compare

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/model"
)

func TestPairedVerdict(t *testing.T) {
	tests := []struct {
		diffs []float64
		want  string
	}{
		{[]float64{-0.01, -0.02, -0.001}, "win"},                                   // every seed
		{[]float64{0.01, 0.02, 0.03}, "loss"},                                      // every seed
		{[]float64{-0.10, -0.11, 0.001}, "tie"},                                    // one seed the other way, and within twice the spread
		{[]float64{-0.02, 0.03, -0.01}, "tie"},                                     // neither
		{[]float64{0.05, -0.001, 0.06}, "tie"},                                     // mostly worse, but not beyond the spread
		{[]float64{0, 0, 0}, "tie"},                                                // the same run
		{[]float64{-0.5}, "win"},                                                   // one seed: its sign
		{[]float64{0.2, 0.21, 0.19, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, -0.001}, "loss"}, // one seed the other way, but beyond twice the spread
		{[]float64{-0.04, -0.041, -0.039, -0.04, -0.04, -0.04, -0.04, 0}, "win"},   // 0 is no win on that seed; the mean is beyond twice the spread
	}
	for _, tc := range tests {
		p := pairedVerdict(tc.diffs)
		if p.Verdict != tc.want {
			t.Errorf("%v: %s (mean %.4f sd %.4f), want %s", tc.diffs, p.Verdict, p.Mean, p.SD, tc.want)
		}
	}
}

// seedRun is a run whose eval curve is losses at steps 0, every, 2
// every, ...
func seedRun(every int, stepS, checkS float64, checks []int, losses ...float64) SeedRun {
	r := SeedRun{StepSeconds: stepS, CheckSeconds: checkS, CheckSteps: checks, StartEvalLoss: losses[0], FinalEvalLoss: losses[len(losses)-1]}
	for i, l := range losses {
		r.Curve = append(r.Curve, EvalPoint{Step: i * every, Loss: l})
	}
	return r
}

func TestTarget(t *testing.T) {
	native := Row{Mode: string(engine.Native), Seeds: []SeedRun{
		seedRun(10, 1, 0, nil, 5, 3, 2, 1.5, 1), // target 5 - 0.9 * 4 = 1.4
		seedRun(10, 1, 0, nil, 4, 3, 2, 1, 0),   // target 0.4
	}}
	row := Row{Mode: string(engine.LSP), Seeds: []SeedRun{
		seedRun(10, 0.5, 8, []int{20, 40}, 5, 2, 1.4, 1.2, 1.1), // reaches 1.4 at step 20: 20 x 0.5 + one of two checks (4)
		seedRun(10, 0.5, 8, []int{20, 40}, 4, 3, 2, 1, 0.5),     // never reaches 0.4
	}}
	row.Curve = row.Seeds[0].Curve
	got := rowTarget(native, row)
	want := &Target{Loss: []float64{5 - 0.9*4, 4 - 0.9*4}, Steps: []int{20, -1}, Reached: 1, MeanSteps: 20, MeanSeconds: 14}
	if got == nil || !reflect.DeepEqual(got.Steps, want.Steps) || got.Reached != 1 || got.MeanSteps != 20 ||
		math.Abs(got.MeanSeconds-14) > 1e-12 || math.Abs(got.Loss[0]-want.Loss[0]) > 1e-12 || math.Abs(got.Loss[1]-want.Loss[1]) > 1e-12 {
		t.Errorf("target %+v, want %+v", got, want)
	}
	// Without check records, the check seconds are spread over the steps.
	r := seedRun(10, 0.5, 8, nil, 5, 1)
	if s, sec := target(r, 1.4, 10); s != 10 || sec != 5+8 {
		t.Errorf("target without check steps: step %d, %v s", s, sec)
	}
	// Native did not lower the loss on a seed: no target.
	flat := native
	flat.Seeds = []SeedRun{seedRun(10, 1, 0, nil, 5, 5), native.Seeds[1]}
	if got := rowTarget(flat, row); got != nil {
		t.Errorf("target against a native run that did not learn: %+v", got)
	}
}

// The equal-memory ranks are the largest within sparse lsp's planned
// device memory at llama-7b, at the least recompute that allows one.
func TestEqualMemoryRanks(t *testing.T) {
	var specs []rowSpec
	for _, s := range allRows {
		if s.equalMemory {
			specs = append(specs, s)
		}
	}
	em, err := equalMemoryRanks(specs, 32)
	if err != nil {
		t.Fatal(err)
	}
	if len(em) != len(specs) {
		t.Fatalf("%d ranks for %d rows", len(em), len(specs))
	}
	for i, e := range em {
		s := specs[i]
		row := Row{Name: s.name, Mode: string(s.mode), Projector: string(s.projector)}
		rc, err := model.ParseRecompute(e.Recompute)
		if err != nil {
			t.Fatal(err)
		}
		bytes := func(rank int, rc model.Recompute) int64 {
			p, err := planAt(paperConfig(row, refModel, rank, 0, rc), refGPU, false)
			if err != nil {
				t.Fatal(err)
			}
			return p.mem.DeviceTotal()
		}
		if e.Rank7B < 1 || e.Bytes != bytes(e.Rank7B, rc) || e.Bytes > e.LSPBytes || bytes(e.Rank7B+1, rc) <= e.LSPBytes {
			t.Errorf("%s: rank %d (%d bytes, rank+1 %d) against lsp's %d", e.Row, e.Rank7B, e.Bytes, bytes(e.Rank7B+1, rc), e.LSPBytes)
		}
		if rc > model.RecomputeNone && bytes(1, rc-1) <= e.LSPBytes {
			t.Errorf("%s: rank 1 fits at recompute %s already", e.Row, rc-1)
		}
		if want := max(1, int(math.Round(float64(e.Rank7B)*32/refD))); e.Rank != want {
			t.Errorf("%s: scaled rank %d, want %d", e.Row, e.Rank, want)
		}
		t.Logf("%+v", e)
	}
}

// The predicted rows: sparse lsp at the paper's d fits the RTX 4090 as
// lsp-train plan says (no recompute) and the 4 GB laptop only with the
// dense parameters frozen and the layers recomputed; its time to target
// is the mean steps times the planned step.
func TestPredict(t *testing.T) {
	r := Row{Name: "lsp", Mode: string(engine.LSP), D: 32, R: 8, Study: Study{Target: &Target{Reached: 3, MeanSteps: 60}}}
	ps, err := predict(r, nil, 50)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 {
		t.Fatalf("%d predictions", len(ps))
	}
	if p := ps[0]; !p.Fits || p.Recompute != "none" || p.DenseParams != string(engine.DenseDevice) || p.Rank != refD ||
		!(p.StepSeconds > 0.1) || p.Seconds != 60*p.StepSeconds || p.ExtraSeconds != 0 {
		t.Errorf("llama-7b on rtx4090: %+v", p)
	}
	if p := ps[1]; !p.Fits || p.Recompute != "layer" || p.DenseParams != string(engine.DenseFrozen) || p.DeviceBytes > 4<<30 {
		t.Errorf("deepseek-coder-1.3b on a1000-laptop: %+v", p)
	}
	// Fitted projectors pay their fits at each check in those steps (one,
	// at step 50).
	r.Name, r.Fit = "lsp (fitted)", true
	if ps, err = predict(r, nil, 50); err != nil {
		t.Fatal(err)
	}
	if p := ps[0]; !p.Fits || !(p.ExtraSeconds > 0) || math.Abs(p.Seconds-(60*p.StepSeconds+p.ExtraSeconds)) > 1e-9 {
		t.Errorf("fitted lsp on rtx4090: %+v", p)
	}
}

// Report rewrites a finished job's outputs from its compare.json alone,
// to the same table.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	c := Defaults()
	c.Out, c.Seeds, c.Rows = dir, 2, "native,lsp,galore"
	res := &Result{Config: c, Pretrained: filepath.Join(dir, "pretrain", "hf"), L0: 5, PretrainEvalLoss: 1.25,
		PNG: filepath.Join(dir, "compare.png"), MD: filepath.Join(dir, "compare.md"), JSON: filepath.Join(dir, "compare.json")}
	for i, name := range []string{"native", "lsp", "galore"} {
		mode := map[string]string{"native": "native", "lsp": "lsp", "galore": "galore"}[name]
		row := Row{Name: name, Mode: mode, LR: 3e-3}
		if mode != "native" {
			row.D, row.R = 32, 8
		}
		for s := range 2 {
			row.Seeds = append(row.Seeds, seedRun(10, 0.1, 0, nil, 5, 3-float64(i)*0.1, 2+float64(i)*0.1+float64(s)*0.01))
		}
		row.Curve = meanCurve(row.Seeds)
		row.FinalEvalLoss, row.FinalEvalSD = meanSD([]float64{row.Seeds[0].FinalEvalLoss, row.Seeds[1].FinalEvalLoss})
		res.Rows = append(res.Rows, row)
	}
	if err := res.finish(); err != nil {
		t.Fatal(err)
	}
	got, err := Report(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Table != res.Table {
		t.Errorf("report's table differs:\n%s\nfrom the job's:\n%s", got.Table, res.Table)
	}
	for _, want := range []string{"Which update wins", "| galore ", "loss (+0.1000 ± 0.0000)", "starts 3.75 nats above"} {
		if !strings.Contains(got.Table, want) {
			t.Errorf("the table lacks %q:\n%s", want, got.Table)
		}
	}
	if i := slices.IndexFunc(got.Rows, func(r Row) bool { return r.Name == "galore" }); got.Rows[i].Study.Paired == nil || got.Rows[i].Study.Target == nil {
		t.Errorf("galore's study: %+v", got.Rows[i].Study)
	}
	if _, err := Report(filepath.Join(dir, "nowhere")); err == nil || !strings.Contains(err.Error(), "compare.json") {
		t.Errorf("report of a directory without compare.json: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "compare.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Report(dir); err == nil || !strings.Contains(err.Error(), "compare.json") {
		t.Errorf("report of a truncated compare.json: %v", err)
	}
}
