// The study's measures over finished rows: the equal-memory ranks, each
// row's paired difference against lsp, its steps and seconds to a target
// eval loss (measured here and predicted for GPUs at the paper's
// shapes), and its planned memory at llama-7b. DESIGN.md, "The
// comparison study", says why each is defined as it is.

package compare

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/plan"
)

// The reference point of "equal memory": sparse lsp at the paper's d and
// r on llama-7b, batch 1 x 1024, bf16, on an RTX 4090.
const (
	refModel         = "llama-7b"
	refGPU           = "rtx4090"
	refD, refR       = 512, 16
	refBatch, refLen = 1, 1024
)

// paperShapes are the GPUs a row's time to target is predicted on, each
// with the model the LSP-Offload paper fine-tunes on it.
var paperShapes = []struct{ GPU, Model string }{
	{refGPU, refModel},
	{"a1000-laptop", "deepseek-coder-1.3b"},
}

// targetShare is the share of native's eval-loss drop that the target
// loss asks for: L0 - targetShare (L0 - L_native).
const targetShare = 0.9

// EqualMemory is the rank of one equal-memory row: at llama-7b, the
// largest rank whose planned device memory is at most sparse lsp's at d
// 512, r 16, at the least recompute for which any rank is; Rank is it
// scaled to the job's --d (Rank7B x d / 512, at least 1).
type EqualMemory struct {
	Row       string `json:"row"`
	Rank7B    int    `json:"rank_llama_7b"`
	Recompute string `json:"recompute"`
	Bytes     int64  `json:"device_bytes"`     // the row's plan at Rank7B
	LSPBytes  int64  `json:"lsp_device_bytes"` // sparse lsp's, recompute none
	Rank      int    `json:"rank"`
}

// Paired is a row's final eval loss against the lsp row's, seed by seed.
type Paired struct {
	Diffs []float64 `json:"diffs"` // L_row - L_lsp per seed: below 0, the row is better
	Mean  float64   `json:"mean"`
	SD    float64   `json:"sd"` // sample standard deviation of Diffs
	// Verdict is "win" (better on every seed, or by more than twice SD),
	// "loss" (the same, worse) or "tie".
	Verdict string `json:"verdict"`
}

// Target is when a row's eval loss first reached the target L0 -
// 0.9 (L0 - L_native) of its seed, at the job's eval cadence.
type Target struct {
	Loss    []float64 `json:"target_loss"` // per seed
	Steps   []int     `json:"steps"`       // per seed; -1: not reached
	Reached int       `json:"reached"`     // seeds that reached it
	// MeanSteps and MeanSeconds are over the seeds that reached it;
	// Seconds is measured on the CPU backend (engine steps and projector
	// checks up to that step, the link charged).
	MeanSteps   float64 `json:"mean_steps"`
	MeanSeconds float64 `json:"mean_seconds"`
}

// Predicted is a row at a paper shape: its plan at the least recompute
// that fits, and the time its MeanSteps to target would take there.
type Predicted struct {
	GPU, Model  string
	Rank        int     `json:"rank"`         // the row's d or rank at this shape
	Fits        bool    `json:"fits"`         // some recompute fits the card
	Recompute   string  `json:"recompute"`    // the least that fits ("" when none)
	DenseParams string  `json:"dense_params"` // device, or frozen where only that fits
	DeviceBytes int64   `json:"device_bytes"` // at that recompute (at none when nothing fits)
	StepSeconds float64 `json:"step_s"`
	// ExtraSeconds is the projector work outside the step graph per
	// check (lsp-fit's fits, svd's refresh) or per galore refresh.
	ExtraSeconds float64 `json:"extra_s"`
	// Seconds is MeanSteps x StepSeconds plus the checks or refreshes
	// those steps hold (0 when not reached or not fitting).
	Seconds float64 `json:"seconds_to_target"`
}

// Study is the study's measures of one row.
type Study struct {
	Paired    *Paired     `json:"paired_vs_lsp,omitempty"` // absent for lsp itself or without an lsp row
	Target    *Target     `json:"target,omitempty"`        // absent without a native row that lowered the loss
	Predicted []Predicted `json:"predicted"`
}

// pairedVerdict classes paired differences (row minus reference, lower
// is better).
func pairedVerdict(diffs []float64) Paired {
	p := Paired{Diffs: diffs}
	p.Mean, p.SD = meanSD(diffs)
	switch {
	case all(diffs, func(x float64) bool { return x < 0 }) || p.Mean < -2*p.SD && len(diffs) > 1:
		p.Verdict = "win"
	case all(diffs, func(x float64) bool { return x > 0 }) || p.Mean > 2*p.SD && len(diffs) > 1:
		p.Verdict = "loss"
	default:
		p.Verdict = "tie"
	}
	return p
}

func all(xs []float64, f func(float64) bool) bool {
	return len(xs) > 0 && !slices.ContainsFunc(xs, func(x float64) bool { return !f(x) })
}

// target finds when run first reached loss at or below target, and the
// measured seconds to then: that many engine steps at the run's mean
// step time, plus the run's check seconds spread over its checks (or
// over its steps when it records no check steps).
func target(run SeedRun, goal float64, steps int) (int, float64) {
	for _, p := range run.Curve {
		if p.Loss > goal {
			continue
		}
		secs := float64(p.Step) * run.StepSeconds
		if run.CheckSeconds > 0 {
			share := float64(p.Step) / float64(max(steps, 1))
			if len(run.CheckSteps) > 0 {
				done := 0
				for _, s := range run.CheckSteps {
					if s <= p.Step {
						done++
					}
				}
				share = float64(done) / float64(len(run.CheckSteps))
			}
			secs += share * run.CheckSeconds
		}
		return p.Step, secs
	}
	return -1, 0
}

// study fills every row's Study (Run and Report call it after score).
func (res *Result) study(predict func(Row) ([]Predicted, error)) error {
	ni := slices.IndexFunc(res.Rows, func(r Row) bool { return r.Mode == string(engine.Native) })
	li := slices.IndexFunc(res.Rows, func(r Row) bool { return r.Name == "lsp" })
	for k := range res.Rows {
		r := &res.Rows[k]
		r.Study = Study{}
		if li >= 0 && k != li && len(res.Rows[li].Seeds) == len(r.Seeds) {
			diffs := make([]float64, len(r.Seeds))
			for j, s := range r.Seeds {
				diffs[j] = s.FinalEvalLoss - res.Rows[li].Seeds[j].FinalEvalLoss
			}
			p := pairedVerdict(diffs)
			r.Study.Paired = &p
		}
		if ni >= 0 {
			r.Study.Target = rowTarget(res.Rows[ni], *r)
		}
		if predict != nil {
			var err error
			if r.Study.Predicted, err = predict(*r); err != nil {
				return fmt.Errorf("compare: %s: %w", r.Name, err)
			}
		}
	}
	return nil
}

// rowTarget is row's Target against native's drop, seed by seed; nil
// when native did not lower the loss on some seed.
func rowTarget(native, row Row) *Target {
	t := &Target{}
	var steps, secs []float64
	for j, s := range row.Seeds {
		if j >= len(native.Seeds) {
			return nil
		}
		l0 := native.Seeds[j].StartEvalLoss
		drop := l0 - native.Seeds[j].FinalEvalLoss
		if !(drop > 0) {
			return nil
		}
		goal := l0 - targetShare*drop
		st, sec := target(s, goal, row.steps())
		t.Loss, t.Steps = append(t.Loss, goal), append(t.Steps, st)
		if st >= 0 {
			t.Reached++
			steps, secs = append(steps, float64(st)), append(secs, sec)
		}
	}
	if t.Reached > 0 {
		t.MeanSteps, _ = meanSD(steps)
		t.MeanSeconds, _ = meanSD(secs)
	}
	return t
}

// steps is the fine-tuning steps of the row's runs: the last eval's.
func (r Row) steps() int {
	if len(r.Curve) == 0 {
		return 0
	}
	return r.Curve[len(r.Curve)-1].Step
}

// paperRank is a row's d (lsp rows) or rank at the paper's shapes:
// sparse lsp at d 512 and r 16, the same-d rows at d 512, lora at its
// own rank, the equal-memory rows at their llama-7b rank.
func paperRank(r Row, em []EqualMemory) (d, rr int) {
	switch {
	case r.EqualMemory:
		for _, e := range em {
			if rowDir(r) == e.Row {
				return e.Rank7B, 0
			}
		}
		return 0, 0
	case r.Mode == string(engine.LSP) && !lsp.Kind(r.Projector).Dense():
		return refD, refR
	case r.Mode == string(engine.LoRA):
		return r.R, 0
	case r.Mode == string(engine.LSP) || r.Mode == string(engine.Galore):
		return refD, 0
	}
	return 0, 0
}

// rowDir is the --rows name of r.
func rowDir(r Row) string {
	i := slices.IndexFunc(allRows, func(s rowSpec) bool { return s.name == r.Name })
	if i < 0 {
		return ""
	}
	return allRows[i].dir
}

// paperConfig is a row's run at a paper shape, as lsp-train plan
// describes it on that GPU: bf16 weights and gradients, the dense
// parameters on the device, rank
// d (and rr, sparse lsp's non-zeros per row).
func paperConfig(r Row, preset string, d, rr int, rc model.Recompute) train.Config {
	return paperSetting(r, preset, d, rr, setting{rc, engine.DenseDevice})
}

// setting is what a run at a paper shape may change to fit the card.
type setting struct {
	recompute model.Recompute
	dense     engine.DenseParams
}

// settings are tried in order: the dense parameters trained on the
// device at the least recompute that fits, else frozen (as lsp-train
// plan's answer does on a 4 GB card).
var settings = []setting{
	{model.RecomputeNone, engine.DenseDevice}, {model.RecomputeAttn, engine.DenseDevice}, {model.RecomputeLayer, engine.DenseDevice},
	{model.RecomputeNone, engine.DenseFrozen}, {model.RecomputeAttn, engine.DenseFrozen}, {model.RecomputeLayer, engine.DenseFrozen},
}

// paperSetting is paperConfig at setting st.
func paperSetting(r Row, preset string, d, rr int, st setting) train.Config {
	c := train.Defaults()
	c.Model, c.Batch, c.SeqLen, c.GradAccum, c.DType, c.GradDType = preset, refBatch, refLen, 1, backend.BF16, backend.BF16
	c.Mode, c.Device, c.Recompute, c.DenseParams = engine.Mode(r.Mode), device.CUDA, st.recompute, st.dense
	if c.Mode == engine.Native || c.Mode == engine.Zero {
		c.DenseParams = train.Defaults().DenseParams
	}
	c.GradResidency = engine.ResidencyAuto
	if c.Mode == engine.Native {
		c.GradResidency = engine.ResidencyWhole
	}
	switch c.Mode {
	case engine.LSP:
		c.D, c.R, c.Fit = d, max(rr, 1), r.Fit
		if r.Projector != "" {
			c.Projector = lsp.Kind(r.Projector)
		}
		if c.Projector.Dense() {
			c.R = 1
		}
		if r.Refit != "" {
			c.Refit = lsp.Refit(r.Refit)
		}
	case engine.LoRA:
		c.LoRAR, c.BaseDType = d, r.Base
	case engine.Galore:
		c.GaloreRank = d
	}
	return c
}

// planned is a run's plan on a GPU: its memory, and with step its step
// time and the projector work outside the step (fits, svd or galore
// refreshes).
type planned struct {
	mem   engine.Memory
	fits  bool
	step  float64
	extra float64
}

// planAt plans c on gpu; the memory alone unless step.
func planAt(c train.Config, gpu string, step bool) (planned, error) {
	spec, err := catalog.Preset(c.Model)
	if err != nil {
		return planned{}, err
	}
	m, err := plan.Preset(gpu, "", "")
	if err != nil {
		return planned{}, err
	}
	if c, err = train.ResolveGradResidency(spec, c, 1, m.GPU.Budget()); err != nil {
		return planned{}, err
	}
	var p planned
	if p.mem, err = train.MemoryOf(spec, c); err != nil {
		return p, err
	}
	p.fits = p.mem.DeviceTotal() <= m.GPU.Budget()
	if !step {
		return p, nil
	}
	pc := plan.Config{Arch: spec, B: c.Batch, T: c.SeqLen, Accum: c.GradAccum, DType: c.DType, Engine: train.EngineConfig(c), Memory: &p.mem}
	r, err := plan.Plan(pc, m)
	if err != nil {
		return p, err
	}
	svd, err := plan.SVDRefreshTime(pc, m)
	p.step, p.extra = r.Step, r.FitSeconds+r.RefreshSeconds+svd
	return p, err
}

// recomputes are the settings tried in order, least recompute first.
var recomputes = []model.Recompute{model.RecomputeNone, model.RecomputeAttn, model.RecomputeLayer}

// predict plans a row at every paper shape and prices its mean steps to
// target there.
func predict(r Row, em []EqualMemory, every int) ([]Predicted, error) {
	d, rr := paperRank(r, em)
	if d == 0 && r.Mode != string(engine.Native) && r.Mode != string(engine.Zero) {
		return nil, nil // an equal-memory row whose rank is unknown
	}
	var out []Predicted
	for _, ps := range paperShapes {
		p, chosen := Predicted{GPU: ps.GPU, Model: ps.Model, Rank: d}, settings[0]
		for _, st := range settings {
			if st.recompute < emRecompute(r, em) || st.dense == engine.DenseFrozen && (r.Mode == string(engine.Native) || r.Mode == string(engine.Zero)) {
				continue // an equal-memory row plans at its own recompute; native and zero train every parameter
			}
			got, err := planAt(paperSetting(r, ps.Model, d, rr, st), ps.GPU, false)
			if err != nil {
				return nil, err
			}
			if got.fits {
				p.Fits, chosen = true, st
				break
			}
		}
		if p.Fits {
			p.Recompute, p.DenseParams = chosen.recompute.String(), string(chosen.dense)
		}
		got, err := planAt(paperSetting(r, ps.Model, d, rr, chosen), ps.GPU, true)
		if err != nil {
			return nil, err
		}
		p.DeviceBytes, p.StepSeconds, p.ExtraSeconds = got.mem.DeviceTotal(), got.step, got.extra
		if t := r.Study.Target; p.Fits && t != nil && t.Reached > 0 {
			p.Seconds = t.MeanSteps*p.StepSeconds + float64(extraEvents(r, int(math.Ceil(t.MeanSteps)), every))*p.ExtraSeconds
		}
		out = append(out, p)
	}
	return out, nil
}

// emRecompute is the recompute an equal-memory row's rank was found at
// (none for other rows).
func emRecompute(r Row, em []EqualMemory) model.Recompute {
	if !r.EqualMemory {
		return model.RecomputeNone
	}
	for _, e := range em {
		if e.Row == rowDir(r) {
			rc, _ := model.ParseRecompute(e.Recompute)
			return rc
		}
	}
	return model.RecomputeNone
}

// extraEvents counts the checks (lsp rows with --fit or svd) or
// refreshes (galore) among a row's first steps, at the cadence rowConfig
// gives them: every --check-every steps.
func extraEvents(r Row, steps, every int) int {
	switch {
	case steps < 1:
		return 0
	case r.Mode == string(engine.Galore):
		return 1 + (steps-1)/every // at step 1, then every --check-every (--galore-every)
	case r.Mode == string(engine.LSP) && r.Projector == string(lsp.KindSVD):
		return 1 + steps/every // before step 1 (--check-at-start), then every --check-every
	case r.Mode == string(engine.LSP) && r.Fit:
		return steps / every
	}
	return 0
}

// equalMemoryRanks finds the llama-7b rank of every equal-memory row of
// specs (EqualMemory), and its scaled rank for a job of projected size d.
func equalMemoryRanks(specs []rowSpec, d int) ([]EqualMemory, error) {
	ref := paperConfig(Row{Mode: string(engine.LSP)}, refModel, refD, refR, model.RecomputeNone)
	p, err := planAt(ref, refGPU, false)
	if err != nil {
		return nil, fmt.Errorf("compare: equal memory: sparse lsp on %s: %w", refModel, err)
	}
	budget := p.mem.DeviceTotal()
	var out []EqualMemory
	for _, s := range specs {
		if !s.equalMemory {
			continue
		}
		row := Row{Name: s.name, Mode: string(s.mode), Projector: string(s.projector), Base: s.base}
		e := EqualMemory{Row: s.dir, LSPBytes: budget}
		for _, rc := range recomputes {
			bytes := func(rank int) (int64, error) {
				p, err := planAt(paperConfig(row, refModel, rank, 0, rc), refGPU, false)
				return p.mem.DeviceTotal(), err
			}
			// The largest rank in [1, maxRank] within budget: memory
			// grows with the rank.
			const maxRank = 4096
			lo, hi := 0, maxRank
			for lo < hi {
				mid := (lo + hi + 1) / 2
				b, err := bytes(mid)
				if err != nil {
					return nil, fmt.Errorf("compare: equal memory: %s at rank %d: %w", s.dir, mid, err)
				}
				if b <= budget {
					lo = mid
				} else {
					hi = mid - 1
				}
			}
			if lo > 0 {
				e.Rank7B, e.Recompute = lo, rc.String()
				if e.Bytes, err = bytes(lo); err != nil {
					return nil, err
				}
				break
			}
		}
		if e.Rank7B == 0 {
			return nil, fmt.Errorf("compare: equal memory: no rank of %s plans within sparse lsp's %d bytes on %s at any recompute", s.dir, budget, refModel)
		}
		e.Rank = max(1, int(math.Round(float64(e.Rank7B)*float64(d)/refD)))
		out = append(out, e)
	}
	return out, nil
}

// resolveRanks sets each spec's rank: --d for the dense projector
// kinds and galore, --lora-r for lora, and the equal-memory rank for the
// equal-memory rows.
func resolveRanks(c Config, specs []rowSpec, em []EqualMemory) {
	for i := range specs {
		s := &specs[i]
		switch {
		case s.equalMemory:
			for _, e := range em {
				if e.Row == s.dir {
					s.rank = e.Rank
				}
			}
		case s.mode == engine.LoRA:
			s.rank = c.LoRAR
		default:
			s.rank = c.D
		}
	}
}

// studyTable is the study's table and its notes: per row the paired
// difference against lsp, the steps and seconds to the target loss, and
// the plans at the paper's shapes.
func studyTable(res *Result) string {
	var b strings.Builder
	head := []string{"row", "rank", "final eval loss (per seed)", "vs lsp (per seed)", "vs lsp", "steps to target", "CPU s to target"}
	for _, ps := range paperShapes {
		head = append(head, ps.Model+" on "+ps.GPU+": device GiB", "s to target")
	}
	cells := [][]string{head}
	for _, r := range res.Rows {
		rank := "-"
		switch {
		case r.Mode == string(engine.LSP) && r.R > 0:
			rank = fmt.Sprintf("d %d, r %d", r.D, r.R)
		case r.Mode == string(engine.LSP):
			rank = fmt.Sprintf("d %d", r.D)
		case r.R > 0:
			rank = fmt.Sprintf("r %d", r.R)
		}
		var seeds []string
		for _, sr := range r.Seeds {
			seeds = append(seeds, fmt.Sprintf("%.3f", sr.FinalEvalLoss))
		}
		loss := fmt.Sprintf("%.4f ± %.4f (%s)", r.FinalEvalLoss, r.FinalEvalSD, strings.Join(seeds, ", "))
		perSeed, verdict := "-", "-"
		if p := r.Study.Paired; p != nil {
			var ds []string
			for _, d := range p.Diffs {
				ds = append(ds, fmt.Sprintf("%+.4f", d))
			}
			perSeed = strings.Join(ds, ", ")
			verdict = fmt.Sprintf("%s (%+.4f ± %.4f)", p.Verdict, p.Mean, p.SD)
		}
		steps, secs := "-", "-"
		if t := r.Study.Target; t != nil {
			steps, secs = "not reached", "-"
			if t.Reached > 0 {
				steps = fmt.Sprintf("%.0f", t.MeanSteps)
				secs = fmt.Sprintf("%.1f", t.MeanSeconds)
				if t.Reached < len(t.Steps) {
					steps += fmt.Sprintf(" (%d of %d seeds)", t.Reached, len(t.Steps))
				}
			}
		}
		row := []string{r.Name, rank, loss, perSeed, verdict, steps, secs}
		for i := range paperShapes {
			mem, sec := "-", "-"
			if i < len(r.Study.Predicted) {
				p := r.Study.Predicted[i]
				mem = fmt.Sprintf("%.2f (%s, %s)", float64(p.DeviceBytes)/(1<<30), rankAt(r, p), p.Recompute)
				if p.DenseParams == string(engine.DenseFrozen) {
					mem = fmt.Sprintf("%.2f (%s, %s, dense frozen)", float64(p.DeviceBytes)/(1<<30), rankAt(r, p), p.Recompute)
				}
				if !p.Fits {
					mem = fmt.Sprintf("%.2f (%s): does not fit", float64(p.DeviceBytes)/(1<<30), rankAt(r, p))
				} else if p.Seconds > 0 {
					sec = fmt.Sprintf("%.0f", p.Seconds)
				}
			}
			row = append(row, mem, sec)
		}
		cells = append(cells, row)
	}
	b.WriteString("\nWhich update wins (the study: DESIGN.md, \"The comparison study\"):\n\n")
	writeTable(&b, cells)
	notes := []string{
		fmt.Sprintf("vs lsp: final eval loss minus the lsp row's, seed by seed (the same seed draws the same data order and eval split), below 0 better; win or loss when it holds on every seed or the mean is beyond twice the differences' standard deviation, else tie."),
		fmt.Sprintf("steps to target: the first eval (every %d steps) at or below L0 - %.1f (L0 - L_native), each seed against its own native run, mean over the seeds that reached it; CPU s: those steps at the run's mean engine step on the CPU backend (the link charged at --link-bandwidth), plus its projector checks' share.", res.Config.EvalEvery, targetShare),
		"device GiB and s to target at the paper's shapes (batch 1 x 1024, bf16, dense params on the device): lsp-train plan's memory at the least recompute that fits, and steps to target times plan's predicted step plus the checks' fits or svd refreshes, or galore's refreshes, in those steps; the same number of steps as on the CPU is the paper's own way to draw its time axes, an assumption (a larger model need not take as many steps). Ranks there: sparse lsp at d 512, r 16, the same-d rows at 512, lora at its rank, the equal-memory rows at their llama-7b rank.",
	}
	if len(res.EqualMemory) > 0 {
		var parts []string
		for _, e := range res.EqualMemory {
			parts = append(parts, fmt.Sprintf("%s %d (recompute %s, %.2f GiB) -> %d here", e.Row, e.Rank7B, e.Recompute, float64(e.Bytes)/(1<<30), e.Rank))
		}
		notes = append(notes, fmt.Sprintf("equal memory: the largest rank whose planned device memory for %s (batch %d x %d on %s) is at most sparse lsp's at d %d, r %d (%.2f GiB, no recompute), at the least recompute for which one is; scaled here by %d/%d: %s.",
			refModel, refBatch, refLen, refGPU, refD, refR, float64(res.EqualMemory[0].LSPBytes)/(1<<30), res.Config.D, refD, strings.Join(parts, "; ")))
	}
	b.WriteString("\n")
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}

// rankAt names a row's rank at a paper shape.
func rankAt(r Row, p Predicted) string {
	switch {
	case r.Mode == string(engine.LSP) && !lsp.Kind(r.Projector).Dense():
		return fmt.Sprintf("d %d", refD)
	case r.Mode == string(engine.LSP):
		return fmt.Sprintf("d %d", p.Rank)
	case r.Mode == string(engine.LoRA) || r.Mode == string(engine.Galore):
		return fmt.Sprintf("r %d", p.Rank)
	}
	return "full"
}
