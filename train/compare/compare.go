// Package compare is the compare job (lsp-train compare): one table that
// puts the update modes side by side on the same fine-tuning problem, from
// training runs it starts itself.
//
//  1. pretrain a preset (--model, tiny by default) natively on one task
//     (--pretrain-task: builtin, or a data file such as a text corpus) into
//     <out>/pretrain, or reuse it when a stamp says an identical earlier
//     compare made it;
//  2. fine-tune that checkpoint on another task (--task) in each row of
//     --rows (native, zero, lsp with the default random projectors, lsp
//     with fitted ones, lora, and lora on an NF4 base by default; lsp with fresh random
//     projectors at every check on request), once per seed of --seeds,
//     same steps and schedule, the link charged at --link-bandwidth, with
//     an eval before the first step (L0) and every --eval-every steps, and
//     greedy exact match at the end; each row's learning rate is the one
//     of --lrs (one grid for every row) whose first-seed run ends at the
//     lowest held-out loss, the other seeds run at it;
//  3. time each row in two short extra runs, sequential and pipelined;
//  4. write <out>/compare.png (eval-loss curves, mean over seeds),
//     compare.md (the table) and compare.json (every number), and return
//     the table, whose last lines are "lsp-quality: X.XX (row)" for the
//     best row with fitted projectors and "lsp-recovery: X.XX" = (L0 -
//     L_lsp) / (L0 - L_native), each the mean over seeds.
//
// Limits: the model is a preset trained from scratch; d and r are bounded
// by the preset's matrices (d <= min(m, n)/4, r <= d/4) so the lsp rows
// really compress; step times come from short runs (the first step's
// allocations included) on the CPU backend, whose "device" and link are
// far slower than a GPU's, so only their ratios mean much. Each seed also
// draws its own eval split, so L0 differs between seeds; recoveries are
// taken per seed. The learning rate is chosen on the held-out loss that
// the table then reports, so a row's loss is its best of the grid (the
// same advantage for every row), not an unbiased estimate.
package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
)

var flagErr = flagerr.New

// Fixed settings of the compare job's fine-tuning rows.
const (
	fineTuneWarmup = 10
)

// DefaultRows is --rows: every update the study compares, at the same d
// and at equal memory (README, "Which update wins").
const DefaultRows = "native,zero,lsp,lsp-fit,lsp-svd,lsp-gauss,galore,lora,lora-nf4,lsp-svd-em,lsp-gauss-em,galore-em,lora-em"

// DefaultLRs is --lrs: three points a factor of 10 apart around lsp-train's
// 3e-3, so that every row, lora (which usually wants about 10 times lsp's
// rate) as well as the others, can find its own.
const DefaultLRs = "3e-4,3e-3,3e-2"

// Config is one compare job; the flags of `lsp-train compare` map
// onto it one to one.
type Config struct {
	Out           string // --out: output directory
	Model         string // --model: the preset pretrained and fine-tuned (any family's)
	Steps         int    // --steps: fine-tuning steps of every row
	PretrainSteps int    // --pretrain-steps: native pretraining steps
	Task          string // --task: builtin task of the fine-tuning
	PretrainTask  string // --pretrain-task: builtin task of the pretraining
	D, R          int    // --d, --r: lsp projected size and non-zeros per projector row
	LinkBandwidth int64  // --link-bandwidth: bytes/s charged per device-host copy (0: free)
	TimingSteps   int    // --timing-steps: steps of each timing run
	EvalEvery     int    // --eval-every: steps between evals of the fine-tuning
	CheckEvery    int    // --check-every: steps between the projector checks (lsp), svd's refreshes and galore's
	EvalGenerate  int    // --eval-generate: held-out prompts scored by exact match at the end
	Threads       int    // --threads: compute threads (0: all cores)
	Seed          uint64 // --seed
	Seeds         int    // --seeds: fine-tuning runs per row, seeds Seed, Seed+1, ...
	Rows          string // --rows: comma-separated row names (RowNames)
	LRs           string // --lrs: comma-separated peak learning rates, the grid each row's is chosen from
	LoRAR         int    // --lora-r: the lora row's rank
	Batch, SeqLen int    // --batch, --seq-len of every run
	// DType (--dtype) stores the fine-tuning rows' weights and
	// activations (fp32, the zero value, or bf16); the pretraining is
	// fp32 either way.
	DType    backend.DType
	Truncate bool // --truncate: cut records longer than --seq-len instead of dropping them
	// The lsp rows' projector settings (the flags of lsp-train of the same
	// names); the zero values are the training defaults.
	Refit        lsp.Refit
	Accept       lsp.Accept
	Rewarm       lsp.Rewarm
	NoGain       bool
	Ortho        float64
	CheckAtStart bool
	ShareLayers  bool
	CalibSamples int
}

// Defaults is the default compare job: a few minutes on two cores.
func Defaults() Config {
	return Config{Out: "out/compare", Model: "tiny", Steps: 100, PretrainSteps: 300, Task: "builtin:copy",
		PretrainTask: "builtin:sort", D: 32, R: 8, LinkBandwidth: 100_000_000, TimingSteps: 10,
		EvalEvery: 10, CheckEvery: 50, EvalGenerate: 100, Seed: 1, Seeds: 3, Rows: DefaultRows, LRs: DefaultLRs, LoRAR: train.Defaults().LoRAR,
		Batch: train.Defaults().Batch, SeqLen: train.Defaults().SeqLen,
		CheckAtStart: train.Defaults().CheckAtStart, CalibSamples: 512}
}

// bounds is the largest --d and the largest --r for d that the
// compare job accepts: d <= min(m, n)/4 over the preset's block matrices and
// r <= d/4, so that S (d x d) is a real compression of every matrix and the
// projectors stay sparse.
func bounds(preset string, d int) (dmax, rmax int) {
	mc, err := catalog.Preset(preset)
	if err != nil {
		return 0, 0 // Validate names the unknown --model
	}
	dmax = math.MaxInt
	for _, mt := range mc.Matrices() {
		dmax = min(dmax, min(mt.M, mt.N)/4)
	}
	return dmax, d / 4
}

// builtinTask returns TASK of "builtin:TASK[:N]", or an error for --flag;
// data that is not builtin: must be an existing file (a text corpus, JSON
// lines or an Alpaca-style JSON file), for which it returns "".
func builtinTask(flag, spec string) (string, error) {
	if !strings.HasPrefix(spec, "builtin:") && spec != "" {
		if st, err := os.Stat(spec); err != nil || st.IsDir() {
			return "", flagErr(flag, "%q is neither builtin:TASK[:N] with TASK one of %s nor a data file", spec, strings.Join(data.BuiltinTasks(), ", "))
		}
		return "", nil
	}
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] != "builtin" || !slices.Contains(data.BuiltinTasks(), parts[1]) {
		return "", flagErr(flag, "%q is not builtin:TASK or builtin:TASK:N with TASK one of %s", spec, strings.Join(data.BuiltinTasks(), ", "))
	}
	if len(parts) == 3 {
		if n, err := strconv.Atoi(parts[2]); err != nil || n < 1 {
			return "", flagErr(flag, "%q: the record count %q is not a positive integer", spec, parts[2])
		}
	}
	return parts[1], nil
}

// Validate checks the job, naming the flag at fault.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, flag, format string, a ...any) {
		if !ok {
			errs = append(errs, flagErr(flag, format, a...))
		}
	}
	check(c.Out != "", "out", "must not be empty")
	check(c.Steps >= 1, "steps", "must be at least 1, got %d", c.Steps)
	check(c.PretrainSteps >= 1, "pretrain-steps", "must be at least 1, got %d", c.PretrainSteps)
	check(c.TimingSteps >= 1, "timing-steps", "must be at least 1, got %d", c.TimingSteps)
	check(c.EvalEvery >= 1, "eval-every", "must be at least 1, got %d", c.EvalEvery)
	check(c.CheckEvery >= 1, "check-every", "must be at least 1, got %d", c.CheckEvery)
	check(c.EvalGenerate >= 0, "eval-generate", "must be >= 0, got %d", c.EvalGenerate)
	check(c.LinkBandwidth >= 0, "link-bandwidth", "must be >= 0, got %d", c.LinkBandwidth)
	check(c.Threads >= 0, "threads", "must be >= 0, got %d", c.Threads)
	check(c.Seeds >= 1, "seeds", "must be at least 1, got %d", c.Seeds)
	check(c.CalibSamples >= 1, "calib-samples", "must be at least 1, got %d", c.CalibSamples)
	check(c.Batch >= 1, "batch", "must be at least 1, got %d", c.Batch)
	check(c.SeqLen >= 1, "seq-len", "must be at least 1, got %d", c.SeqLen)
	if _, err := c.rowSpecs(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.lrs(); err != nil {
		errs = append(errs, err)
	}
	check(c.LoRAR >= 1, "lora-r", "must be at least 1, got %d", c.LoRAR)
	_, err := catalog.Preset(c.Model)
	check(err == nil, "model", "%v (compare pretrains a preset from scratch)", err)
	if err == nil { // d and r are bounded by the preset's matrices
		dmax, rmax := bounds(c.Model, c.D)
		check(c.D >= 4 && c.D <= dmax, "d", "must be in [4, %d], got %d: %s's block matrices are at least %d on a side and compare keeps d <= min(m, n)/4 (and r <= d/4 >= 1)",
			dmax, c.D, c.Model, 4*dmax)
		check(c.R >= 1 && c.R <= max(rmax, 1), "r", "must be in [1, d/4 = %d], got %d: compare keeps the projectors sparse (r <= d/4)", max(rmax, 1), c.R)
	}
	ft, err1 := builtinTask("task", c.Task)
	pt, err2 := builtinTask("pretrain-task", c.PretrainTask)
	errs = append(errs, err1, err2)
	same := ft != "" && ft == pt || ft == "" && c.Task == c.PretrainTask
	check(err1 != nil || err2 != nil || !same, "task", "%s is the --pretrain-task too; fine-tuning must move the model to another task", ft)
	return errors.Join(errs...)
}

// lrs parses --lrs: positive, finite and distinct rates, in the order
// given.
func (c Config) lrs() ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(c.LRs, ",") {
		lr, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(lr > 0) || math.IsInf(lr, 0) {
			return nil, flagErr("lrs", "%q is not a positive learning rate (want comma-separated rates such as %s)", f, DefaultLRs)
		}
		if slices.Contains(out, lr) {
			return nil, flagErr("lrs", "%g is named twice", lr)
		}
		out = append(out, lr)
	}
	return out, nil
}

// EvalPoint is one eval of a fine-tuning run.
type EvalPoint struct {
	Step int     `json:"step"`
	Loss float64 `json:"eval_loss"`
}

// CheckPoint summarises one projector check of an lsp run over its
// matrices: the mean bias ratio before and after and the share of
// matrices whose new projectors were kept.
type CheckPoint struct {
	Step        int     `json:"step"`
	Matrices    int     `json:"matrices"`
	RatioBefore float64 `json:"ratio_before"`
	RatioAfter  float64 `json:"ratio_after"`
	Accepted    float64 `json:"accepted"` // share of matrices refitted
}

// SeedRun is one fine-tuning run of a row.
type SeedRun struct {
	Seed          uint64       `json:"seed"`
	Out           string       `json:"out"`
	StartEvalLoss float64      `json:"start_eval_loss"`
	FinalEvalLoss float64      `json:"final_eval_loss"`
	ExactMatch    *float64     `json:"exact_match,omitempty"`
	Curve         []EvalPoint  `json:"eval_curve"`
	Checks        []CheckPoint `json:"checks,omitempty"`
	// EverAccepted is the share of matrices whose refit was kept at one
	// check at least (lsp rows that fit).
	EverAccepted float64 `json:"ever_accepted"`
	CheckSeconds float64 `json:"check_s"`
	// CheckSteps are the steps of the run's projector checks (from its
	// metrics' check records); StepSeconds its mean engine step.
	CheckSteps  []int   `json:"check_steps,omitempty"`
	StepSeconds float64 `json:"step_s"`
	Seconds     float64 `json:"seconds"`
}

// GridPoint is one learning rate of --lrs tried on a row: the final
// held-out loss of the row's first-seed run at it.
type GridPoint struct {
	LR            float64 `json:"lr"`
	FinalEvalLoss float64 `json:"final_eval_loss"`
	Out           string  `json:"out"`
}

// Row is one row of the table: a mode's fine-tuning runs (one per seed)
// and its two timing runs.
type Row struct {
	Name  string `json:"name"` // native, zero, lsp, lsp (fitted), lsp (resampled), lora, lora (nf4)
	Mode  string `json:"mode"`
	Fit   bool   `json:"fit,omitempty"`   // the projectors are checked (--fit)
	Refit string `json:"refit,omitempty"` // lsp rows that check
	D     int    `json:"d,omitempty"`     // lsp rows only
	R     int    `json:"r,omitempty"`     // lsp rows' non-zeros per projector row, lora's and galore's rank
	Base  string `json:"base,omitempty"`  // lora rows' --base-dtype ("": the model dtype)
	// Projector is an lsp row's --projector ("": sparse); EqualMemory
	// says the row's rank is equalMemoryRanks', not --d.
	Projector   string `json:"projector,omitempty"`
	EqualMemory bool   `json:"equal_memory,omitempty"`
	Out         string `json:"out"` // the first seed's fine-tuning run's output directory
	// LR is the peak learning rate of the row's runs, the point of Grid
	// with the lowest held-out loss.
	LR   float64     `json:"lr"`
	Grid []GridPoint `json:"lr_grid"`
	// Recovery is (L0 - L_row) / (L0 - L_native), the mean over seeds
	// (absent without a native row, or when native did not lower the
	// loss).
	Recovery *float64 `json:"recovery,omitempty"`

	// Mean wall seconds of an optimizer step (the engine's step only) in
	// the timing runs, and over the first seed's (pipelined) fine-tuning run.
	StepSecondsSequential float64 `json:"step_s_sequential"`
	StepSecondsPipelined  float64 `json:"step_s_pipelined"`
	StepSecondsFineTune   float64 `json:"step_s_finetune"`
	CheckSeconds          float64 `json:"check_s"` // projector checks, mean per run

	DevicePredicted int64   `json:"device_bytes_predicted"` // the memory plan
	DevicePeak      int64   `json:"device_bytes_peak"`      // the backend's high-water mark
	Host            int64   `json:"host_bytes_predicted"`   // host memory the plan holds for the whole run (HostTotal)
	LinkPredicted   int64   `json:"link_bytes_per_step_predicted"`
	LinkMeasured    float64 `json:"link_bytes_per_step"`

	StartEvalLoss float64     `json:"start_eval_loss"` // step 0
	FinalEvalLoss float64     `json:"final_eval_loss"` // mean over seeds
	FinalEvalSD   float64     `json:"final_eval_loss_sd"`
	ExactMatch    *float64    `json:"exact_match,omitempty"` // mean; absent with --eval-generate 0
	Curve         []EvalPoint `json:"eval_curve"`            // mean over seeds
	Seeds         []SeedRun   `json:"seeds"`
	// Fitted: the row fits its projectors and most matrices kept a fit at
	// least once (mean over seeds); such a row counts for lsp-quality.
	Fitted  bool    `json:"fitted"`
	Seconds float64 `json:"seconds"` // wall time of the fine-tuning runs
	Study   Study   `json:"study"`
}

// Result is a finished compare job.
type Result struct {
	Config         Config  `json:"config"`
	Pretrained     string  `json:"pretrained"` // the Hugging Face export fine-tuned by every row
	PretrainReused bool    `json:"pretrain_reused"`
	L0             float64 `json:"l0"` // eval loss before fine-tuning (the native row's step 0, first seed)
	// PretrainEvalLoss is the pretrained model's held-out loss on its own
	// --pretrain-task (the pretraining's last eval); L0 minus it is how
	// far --task is from what the model was trained on.
	PretrainEvalLoss float64 `json:"pretrain_eval_loss"`
	// Recovery is (L0 - L_lsp) / (L0 - L_native) of the final eval losses
	// of the lsp row, the mean over seeds of each seed's (absent in JSON
	// when native did not lower the loss, or without an lsp or native row).
	Recovery *float64 `json:"lsp_recovery,omitempty"`
	// Quality is the recovery of the best lsp row with fitted projectors
	// (Row.Fitted), QualityRow its name; absent when there is none.
	Quality    *float64 `json:"lsp_quality,omitempty"`
	QualityRow string   `json:"lsp_quality_row,omitempty"`
	Rows       []Row    `json:"rows"`
	// EqualMemory are the equal-memory rows' ranks (equalMemoryRanks).
	EqualMemory []EqualMemory `json:"equal_memory,omitempty"`
	Table       string        `json:"-"` // what is printed: the table, footnotes, the recovery line
	PNG         string        `json:"-"`
	MD          string        `json:"-"`
	JSON        string        `json:"-"`
}

// ErrInterrupted reports a compare job stopped by its context.
var ErrInterrupted = errors.New("interrupted")

// rowSpec is what distinguishes the rows.
type rowSpec struct {
	name, dir string
	mode      engine.Mode
	fit       bool      // --fit: checks, and a fit at each unless refit is random
	refit     lsp.Refit // "": the job's --refit
	base      string    // lora: --base-dtype ("": the model dtype)
	projector lsp.Kind  // lsp rows: --projector ("": sparse)
	// rank is the dense projectors' d, lora's r or galore's rank, set by
	// Run (resolveRanks).
	rank int
	// equalMemory: the row's rank (dense projectors' d, lora's r,
	// galore's rank) is the one whose planned device memory at llama-7b
	// equals sparse lsp's at d 512, r 16 (equalMemoryRanks), scaled to
	// the job's --d; otherwise it is --d itself.
	equalMemory bool
}

// allRows are the rows --rows may name, by their directory names.
var allRows = []rowSpec{
	{name: "native", dir: "native", mode: engine.Native},
	{name: "zero", dir: "zero", mode: engine.Zero},
	{name: "lsp", dir: "lsp", mode: engine.LSP},
	{name: "lsp (fitted)", dir: "lsp-fit", mode: engine.LSP, fit: true},
	{name: "lsp (resampled)", dir: "lsp-resample", mode: engine.LSP, fit: true, refit: lsp.RefitRandom},
	{name: "lsp (svd)", dir: "lsp-svd", mode: engine.LSP, projector: lsp.KindSVD},
	{name: "lsp (gaussian)", dir: "lsp-gauss", mode: engine.LSP, projector: lsp.KindGaussian},
	{name: "galore", dir: "galore", mode: engine.Galore},
	{name: "lora", dir: "lora", mode: engine.LoRA},
	{name: "lora (nf4)", dir: "lora-nf4", mode: engine.LoRA, base: "nf4"},
	{name: "lsp (svd), equal memory", dir: "lsp-svd-em", mode: engine.LSP, projector: lsp.KindSVD, equalMemory: true},
	{name: "lsp (gaussian), equal memory", dir: "lsp-gauss-em", mode: engine.LSP, projector: lsp.KindGaussian, equalMemory: true},
	{name: "galore, equal memory", dir: "galore-em", mode: engine.Galore, equalMemory: true},
	{name: "lora, equal memory", dir: "lora-em", mode: engine.LoRA, equalMemory: true},
}

// RowNames are the names --rows accepts.
func RowNames() []string {
	var out []string
	for _, r := range allRows {
		out = append(out, r.dir)
	}
	return out
}

// rowSpecs parses --rows.
func (c Config) rowSpecs() ([]rowSpec, error) {
	var out []rowSpec
	for _, name := range strings.Split(c.Rows, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(allRows, func(r rowSpec) bool { return r.dir == name })
		if i < 0 {
			return nil, flagErr("rows", "%q is not a row (rows: %s)", name, strings.Join(RowNames(), ", "))
		}
		if slices.ContainsFunc(out, func(r rowSpec) bool { return r.dir == name }) {
			return nil, flagErr("rows", "%q is named twice", name)
		}
		out = append(out, allRows[i])
	}
	return out, nil
}

// pretrainStamp identifies a pretraining; an identical stamp next to the
// export lets a later compare reuse it.
type pretrainStamp struct {
	Version int     `json:"version"`
	Model   string  `json:"model"`
	Data    string  `json:"data"`
	Steps   int     `json:"steps"`
	Seed    uint64  `json:"seed"`
	Batch   int     `json:"batch"`
	SeqLen  int     `json:"seq_len"`
	LR      float64 `json:"lr"`
	MinLR   float64 `json:"min_lr"`
	Warmup  int     `json:"warmup"`
	DType   string  `json:"dtype"`
}

// pretrainStampFile is the stamp's name inside <out>/pretrain.
const pretrainStampFile = "compare-stamp.json"

// Run runs the compare job; log gets one line per finished run (nil:
// none). Cancelling ctx stops the run under way at its next step and
// returns an error wrapping ErrInterrupted.
func Run(ctx context.Context, c Config, log *slog.Logger) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	specs, err := c.rowSpecs()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return nil, flagErr("out", "%v", err)
	}
	res := &Result{Config: c, PNG: filepath.Join(c.Out, "compare.png"),
		MD: filepath.Join(c.Out, "compare.md"), JSON: filepath.Join(c.Out, "compare.json")}
	if res.EqualMemory, err = equalMemoryRanks(specs, c.D); err != nil {
		return nil, err
	}
	resolveRanks(c, specs, res.EqualMemory)
	if res.Pretrained, res.PretrainReused, err = pretrain(ctx, c, log); err != nil {
		return nil, err
	}
	if res.PretrainEvalLoss, err = lastEvalLoss(filepath.Join(c.Out, "pretrain", "metrics.jsonl")); err != nil {
		return nil, err
	}
	for _, spec := range specs {
		row, err := fineTuneRow(ctx, c, spec, res.Pretrained, log)
		if err != nil {
			return nil, err
		}
		res.Rows = append(res.Rows, row)
	}
	for i, spec := range specs {
		for _, sched := range []train.Schedule{train.Sequential, train.Pipelined} {
			sec, err := timing(ctx, c, spec, sched, res.Pretrained, res.Rows[i].LR, log)
			if err != nil {
				return nil, err
			}
			if sched == train.Sequential {
				res.Rows[i].StepSecondsSequential = sec
			} else {
				res.Rows[i].StepSecondsPipelined = sec
			}
		}
	}
	res.L0 = res.Rows[0].StartEvalLoss
	if err := res.finish(); err != nil {
		return nil, err
	}
	return res, nil
}

// Report re-reads the compare.json a finished job wrote into dir and
// rewrites its table, plot and JSON from it, running nothing: the
// study's measures and the table's format as this build has them.
func Report(dir string) (*Result, error) {
	path := filepath.Join(dir, "compare.json")
	js, err := os.ReadFile(path)
	if err != nil {
		return nil, flagErr("out", "%v (--report reads the compare.json of a finished compare)", err)
	}
	res := &Result{}
	if err := json.Unmarshal(js, res); err != nil {
		return nil, fmt.Errorf("compare: %s: %w", path, err)
	}
	if len(res.Rows) == 0 {
		return nil, fmt.Errorf("compare: %s holds no rows", path)
	}
	res.Config.Out = dir
	if res.Config.CheckEvery == 0 { // a compare.json from before --check-every, which was 50
		res.Config.CheckEvery = 50
	}
	if res.PretrainEvalLoss == 0 { // a compare.json from before the field
		if res.PretrainEvalLoss, err = lastEvalLoss(filepath.Join(dir, "pretrain", "metrics.jsonl")); err != nil {
			return nil, err
		}
	}
	res.PNG, res.MD, res.JSON = filepath.Join(dir, "compare.png"), filepath.Join(dir, "compare.md"), path
	if err := res.finish(); err != nil {
		return nil, err
	}
	return res, nil
}

// finish scores the rows, runs the study's measures, formats the table
// and writes the outputs.
func (res *Result) finish() error {
	res.score()
	if err := res.study(func(r Row) ([]Predicted, error) { return predict(r, res.EqualMemory, res.Config.CheckEvery) }); err != nil {
		return err
	}
	res.Table = table(res)
	return write(res)
}

// recovery is the mean over seeds of (L0 - L_row) / (L0 - L_native), L0
// the seed's eval loss before fine-tuning (the seed also draws the eval
// split), nil when native did not lower the loss for a seed.
func recovery(native, row Row) *float64 {
	var sum float64
	for j, s := range row.Seeds {
		l0 := native.Seeds[j].StartEvalLoss
		drop := l0 - native.Seeds[j].FinalEvalLoss
		if !(drop > 0) {
			return nil
		}
		sum += (l0 - s.FinalEvalLoss) / drop
	}
	return metrics.F(sum / float64(len(row.Seeds)))
}

// score fills each row's recovery, Recovery (the lsp row's) and Quality
// (the best fitted lsp row's).
func (res *Result) score() {
	i := slices.IndexFunc(res.Rows, func(r Row) bool { return r.Mode == string(engine.Native) })
	if i < 0 {
		return
	}
	native := res.Rows[i]
	for k := range res.Rows {
		res.Rows[k].Recovery = recovery(native, res.Rows[k])
	}
	for _, r := range res.Rows {
		rec := r.Recovery
		if r.Mode != string(engine.LSP) || rec == nil {
			continue
		}
		if r.Name == "lsp" {
			res.Recovery = rec
		}
		if r.Fitted && (res.Quality == nil || *rec > *res.Quality) {
			res.Quality, res.QualityRow = rec, r.Name
		}
	}
}

// base is the part of a training run's configuration that every run of
// the job shares.
func base(c Config) train.Config {
	cfg := train.Defaults()
	cfg.Threads, cfg.Seed = c.Threads, c.Seed
	cfg.Batch, cfg.SeqLen, cfg.Truncate = c.Batch, c.SeqLen, c.Truncate
	cfg.EvalGenerate, cfg.CheckpointEvery = 0, 0
	// Every run has its own subdirectory of --out, which the job re-runs
	// into on purpose (a new pretraining, every row on every call).
	cfg.Overwrite = true
	return cfg
}

// pretrain returns the pretrained export, training it unless an
// identical one is stamped in <out>/pretrain.
func pretrain(ctx context.Context, c Config, log *slog.Logger) (string, bool, error) {
	cfg := base(c)
	cfg.Model, cfg.Data, cfg.Steps, cfg.Mode = c.Model, c.PretrainTask, c.PretrainSteps, engine.Native
	cfg.EvalEvery = 0
	cfg.Out = filepath.Join(c.Out, "pretrain")
	stamp, err := json.MarshalIndent(pretrainStamp{Version: 1, Model: cfg.Model, Data: cfg.Data, Steps: cfg.Steps,
		Seed: cfg.Seed, Batch: cfg.Batch, SeqLen: cfg.SeqLen, LR: cfg.LR, MinLR: cfg.MinLR, Warmup: cfg.Warmup,
		DType: cfg.DType.String()}, "", "  ")
	if err != nil {
		return "", false, err
	}
	stamp = append(stamp, '\n')
	stampPath, hf := filepath.Join(cfg.Out, pretrainStampFile), filepath.Join(cfg.Out, "hf")
	if old, err := os.ReadFile(stampPath); err == nil && bytes.Equal(old, stamp) {
		if _, _, err := train.ResolveModel(hf); err == nil {
			log.Info("pretrain reused", "model", hf, "data", cfg.Data, "steps", cfg.Steps)
			return hf, true, nil
		}
	}
	// The stamp goes first, so an interrupted pretraining is not reused.
	if err := os.Remove(stampPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("compare: %w", err)
	}
	t0 := time.Now()
	r, err := train.Run(ctx, cfg, train.Options{})
	if err != nil {
		return "", false, fmt.Errorf("compare: pretrain: %w", err)
	}
	if r.Interrupted {
		return "", false, fmt.Errorf("compare: pretrain: %w at step %d", ErrInterrupted, r.Steps)
	}
	if err := atomicfile.WriteFile(stampPath, 0o644, func(w io.Writer) error {
		_, err := w.Write(stamp)
		return err
	}); err != nil {
		return "", false, fmt.Errorf("compare: %w", err)
	}
	log.Info("pretrain done", "model", r.Export, "data", cfg.Data, "steps", r.Steps,
		"eval_loss", fmt.Sprintf("%.4f", r.EvalLoss), "seconds", fmt.Sprintf("%.1f", time.Since(t0).Seconds()))
	return r.Export, false, nil
}

// lastEvalLoss is the last eval loss that the metrics file at path
// records.
func lastEvalLoss(path string) (float64, error) {
	recs, err := metrics.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("compare: %w", err)
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].EvalLoss != nil {
			return *recs[i].EvalLoss, nil
		}
	}
	return 0, fmt.Errorf("compare: %s records no eval loss (is the held-out split of --pretrain-task empty?)", path)
}

// rowConfig is a row's run with seed: fine-tuning (or timing, with the
// caller's changes) of the pretrained model.
func rowConfig(c Config, spec rowSpec, model string, seed uint64, lr float64) train.Config {
	cfg := base(c)
	cfg.Seed, cfg.DType = seed, c.DType
	cfg.Model, cfg.Data, cfg.Steps = model, c.Task, c.Steps
	// The cosine decays to a tenth of the peak, as lsp-train's defaults
	// (3e-3 to 3e-4) do.
	cfg.LR, cfg.MinLR, cfg.Warmup, cfg.EvalEvery = lr, lr/10, fineTuneWarmup, c.EvalEvery
	cfg.Mode, cfg.Schedule, cfg.LinkBandwidth = spec.mode, train.Pipelined, c.LinkBandwidth
	if spec.mode == engine.LSP {
		cfg.DenseParams, cfg.D, cfg.R, cfg.Fit = engine.DenseDevice, c.D, c.R, spec.fit
		if spec.projector != "" {
			cfg.Projector = spec.projector
		}
		if cfg.Projector.Dense() {
			cfg.D = spec.rank
		}
		cfg.CheckEvery, cfg.CalibSamples, cfg.CheckAtStart = c.CheckEvery, c.CalibSamples, c.CheckAtStart
		cfg.Refit, cfg.Accept, cfg.Rewarm, cfg.NoGain, cfg.ProjOrtho = c.Refit, c.Accept, c.Rewarm, c.NoGain, c.Ortho
		cfg.ShareLayers = c.ShareLayers
		if cfg.Projector == lsp.KindSVD {
			// The first refresh before step 1, as GaLore's: else the
			// first --check-every steps would run on a gaussian draw.
			cfg.CheckAtStart = true
		}
		if spec.refit != "" {
			cfg.Refit = spec.refit
		}
		if cfg.Refit == "" {
			cfg.Refit = train.Defaults().Refit
		}
		if cfg.Accept == "" {
			cfg.Accept = train.Defaults().Accept
		}
		if cfg.Rewarm == "" {
			cfg.Rewarm = train.Defaults().Rewarm
		}
	}
	if spec.mode == engine.LoRA {
		// The dense parameters train on the device as the lsp rows', so
		// that lora and lsp differ in the block matrices only.
		cfg.DenseParams, cfg.LoRAR, cfg.BaseDType = engine.DenseDevice, spec.rank, spec.base
	}
	if spec.mode == engine.Galore {
		cfg.DenseParams = engine.DenseDevice // as the lsp and lora rows'
		// Refreshes at svd's checks' cadence, so that the two differ in
		// what they update, not in how often they refresh.
		cfg.GaloreRank, cfg.GaloreEvery = spec.rank, c.CheckEvery
	}
	cfg.Out = filepath.Join(c.Out, spec.dir)
	if seed != c.Seed {
		cfg.Out = filepath.Join(c.Out, fmt.Sprintf("%s-seed%d", spec.dir, seed))
	}
	return cfg
}

// gridDir is the output directory of a row's first-seed run at lr when
// --lrs has several points (with one, the row's own directory).
func gridDir(c Config, spec rowSpec, lr float64) string {
	return filepath.Join(c.Out, spec.dir+"-lr"+strconv.FormatFloat(lr, 'g', -1, 64))
}

// fineTuneRow chooses a row's learning rate, the point of --lrs whose
// first-seed run ends at the lowest held-out loss, runs the other seeds
// at it and scores the row.
func fineTuneRow(ctx context.Context, c Config, spec rowSpec, model string, log *slog.Logger) (Row, error) {
	row := Row{Name: spec.name, Mode: string(spec.mode), Fit: spec.fit}
	lrs, err := c.lrs()
	if err != nil {
		return row, err
	}
	row.Projector, row.EqualMemory = string(spec.projector), spec.equalMemory
	switch spec.mode {
	case engine.LSP:
		row.D, row.R = c.D, c.R
		if spec.projector.Dense() {
			row.D, row.R = spec.rank, 0
		}
		if spec.fit {
			row.Refit = string(rowConfig(c, spec, model, c.Seed, lrs[0]).Refit)
		}
	case engine.LoRA:
		row.R, row.Base = spec.rank, spec.base
	case engine.Galore:
		row.R = spec.rank
	}
	type first struct {
		run SeedRun
		m   train.Measurements
	}
	var best first
	for i, lr := range lrs {
		out := ""
		if len(lrs) > 1 {
			out = gridDir(c, spec, lr)
		}
		run, m, err := fineTune(ctx, c, spec, model, c.Seed, lr, out, log)
		if err != nil {
			return row, err
		}
		row.Grid = append(row.Grid, GridPoint{LR: lr, FinalEvalLoss: run.FinalEvalLoss, Out: run.Out})
		if i == 0 || run.FinalEvalLoss < best.run.FinalEvalLoss {
			best, row.LR = first{run, m}, lr
		}
	}
	var losses, ems, accepted []float64
	for j := range c.Seeds {
		seed := c.Seed + uint64(j)
		run, m := best.run, best.m
		if j > 0 {
			if run, m, err = fineTune(ctx, c, spec, model, seed, row.LR, "", log); err != nil {
				return row, err
			}
		}
		if j == 0 {
			row.Out, row.StartEvalLoss, row.StepSecondsFineTune = run.Out, run.StartEvalLoss, m.StepSeconds
			row.DevicePredicted, row.DevicePeak, row.Host = m.Memory.DeviceTotal(), m.DevicePeak, m.Memory.HostTotal()
			row.LinkPredicted = m.Memory.LinkD2H + m.Memory.LinkH2D + m.Memory.BatchD2H + m.Memory.BatchH2D
			row.LinkMeasured = m.LinkBytesPerStep
		}
		row.Seeds = append(row.Seeds, run)
		row.Seconds += run.Seconds
		row.CheckSeconds += run.CheckSeconds / float64(c.Seeds)
		losses = append(losses, run.FinalEvalLoss)
		accepted = append(accepted, run.EverAccepted)
		if run.ExactMatch != nil {
			ems = append(ems, *run.ExactMatch)
		}
	}
	row.FinalEvalLoss, row.FinalEvalSD = meanSD(losses)
	if len(ems) == c.Seeds {
		em, _ := meanSD(ems)
		row.ExactMatch = &em
	}
	row.Curve = meanCurve(row.Seeds)
	if spec.mode == engine.LSP && spec.fit && spec.refit != lsp.RefitRandom {
		acc, _ := meanSD(accepted)
		row.Fitted = acc > 0.5
	}
	return row, nil
}

// meanSD is the mean and the sample standard deviation (0 for one value).
func meanSD(xs []float64) (mean, sd float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	for _, x := range xs {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(xs)-1))
}

// meanCurve averages the seeds' eval curves point by point (they eval at
// the same steps).
func meanCurve(runs []SeedRun) []EvalPoint {
	out := slices.Clone(runs[0].Curve)
	for i := range out {
		var sum float64
		for _, r := range runs {
			sum += r.Curve[i].Loss
		}
		out[i].Loss = sum / float64(len(runs))
	}
	return out
}

// fineTune runs one seed of a row's fine-tuning at peak learning rate lr,
// into out ("": the row's directory for the seed), and scores it.
func fineTune(ctx context.Context, c Config, spec rowSpec, model string, seed uint64, lr float64, out string, log *slog.Logger) (SeedRun, train.Measurements, error) {
	cfg := rowConfig(c, spec, model, seed, lr)
	if out != "" {
		cfg.Out = out
	}
	run := SeedRun{Seed: seed, Out: cfg.Out}
	t0 := time.Now()
	var m train.Measurements
	r, err := train.Run(ctx, cfg, train.Options{EvalAtStart: true, Measurements: &m})
	if err != nil {
		return run, m, fmt.Errorf("compare: %s (seed %d): %w", spec.name, seed, err)
	}
	if r.Interrupted {
		return run, m, fmt.Errorf("compare: %s (seed %d): %w at step %d", spec.name, seed, ErrInterrupted, r.Steps)
	}
	run.FinalEvalLoss, run.CheckSeconds, run.StepSeconds = r.EvalLoss, m.CheckSeconds, m.StepSeconds
	recs, err := metrics.ReadFile(r.Metrics)
	if err != nil {
		return run, m, fmt.Errorf("compare: %s: %w", spec.name, err)
	}
	run.StartEvalLoss = math.NaN()
	for _, rec := range recs {
		if rec.EvalLoss != nil {
			run.Curve = append(run.Curve, EvalPoint{Step: rec.Step, Loss: *rec.EvalLoss})
			if rec.Step == 0 {
				run.StartEvalLoss = *rec.EvalLoss
			}
		}
	}
	run.Checks, run.EverAccepted = checkPoints(recs)
	for _, cp := range run.Checks {
		run.CheckSteps = append(run.CheckSteps, cp.Step)
	}
	if len(run.Curve) == 0 || math.IsNaN(run.StartEvalLoss) || math.IsNaN(run.FinalEvalLoss) {
		return run, m, fmt.Errorf("compare: %s: %s holds no eval loss at step 0 and at the end (is the eval set of --task empty?)", spec.name, r.Metrics)
	}
	if c.EvalGenerate > 0 {
		em, err := exactMatch(cfg, r.Export, c.EvalGenerate)
		if err != nil {
			return run, m, fmt.Errorf("compare: %s: %w", spec.name, err)
		}
		if !math.IsNaN(em) {
			run.ExactMatch = &em
		}
	}
	run.Seconds = time.Since(t0).Seconds()
	args := []any{"row", spec.name, "seed", seed, "lr", lr, "steps", r.Steps, "eval_loss_start", fmt.Sprintf("%.4f", run.StartEvalLoss),
		"eval_loss", fmt.Sprintf("%.4f", run.FinalEvalLoss), "step_s", fmt.Sprintf("%.3f", m.StepSeconds)}
	if run.ExactMatch != nil {
		args = append(args, "exact_match", fmt.Sprintf("%.3f", *run.ExactMatch))
	}
	if len(run.Checks) > 0 {
		args = append(args, "ever_accepted", fmt.Sprintf("%.2f", run.EverAccepted))
	}
	log.Info("fine-tune done", append(args, "seconds", fmt.Sprintf("%.1f", run.Seconds))...)
	return run, m, nil
}

// checkPoints summarises a run's projector checks, one point per check
// step, and returns the share of matrices that kept a refit at least once.
func checkPoints(recs []metrics.Record) ([]CheckPoint, float64) {
	var out []CheckPoint
	ever := map[string]bool{}
	for _, rec := range recs {
		p := rec.Projector
		if p == nil {
			continue
		}
		if len(out) == 0 || out[len(out)-1].Step != rec.Step {
			out = append(out, CheckPoint{Step: rec.Step})
		}
		cp := &out[len(out)-1]
		cp.Matrices++
		cp.RatioBefore += p.RatioBefore
		cp.RatioAfter += p.RatioAfter
		if p.Resampled {
			cp.Accepted++
		}
		ever[p.Matrix] = ever[p.Matrix] || p.Resampled
	}
	for i := range out {
		n := float64(out[i].Matrices)
		out[i].RatioBefore /= n
		out[i].RatioAfter /= n
		out[i].Accepted /= n
	}
	var kept float64
	for _, v := range ever {
		if v {
			kept++
		}
	}
	if len(ever) == 0 {
		return out, 0
	}
	return out, kept / float64(len(ever))
}

// exactMatch scores the exported weights of a run by greedy exact
// match on the first n held-out records of its data. It runs after the
// training run, so that only the final weights pay for generation.
func exactMatch(cfg train.Config, export string, n int) (float64, error) {
	mc, vals, err := catalog.Load(export)
	if err != nil {
		return 0, err
	}
	tok, err := catalog.Tokenizer(mc, export, "")
	if err != nil {
		return 0, err
	}
	// The conversations' rendering is the training run's (train's
	// loadData), so that the held-out prompts are the same.
	chat, chatErr := train.ChatTemplate(tok, cfg.ChatTemplate)
	ds, err := data.Load(cfg.Data, tok, data.Options{SeqLen: cfg.SeqLen, Truncate: cfg.Truncate,
		EvalFraction: cfg.EvalFraction, Seed: cfg.Seed, Chat: chat, ChatErr: chatErr})
	if err != nil {
		return 0, err
	}
	if len(ds.EvalRecords) == 0 {
		return math.NaN(), nil
	}
	be, err := device.Open(device.Config{Kind: cfg.Device, Threads: cfg.Threads, Seed: cfg.Seed})
	if err != nil {
		return 0, err
	}
	defer be.Close()
	s := be.DefaultStream()
	mm, err := mc.NewModel(be, cfg.Batch, cfg.SeqLen, backend.F32, model.Options{})
	if err != nil {
		return 0, err
	}
	defer mm.Free()
	m := eval.Model{Model: mm, Spec: mc, B: cfg.Batch, T: cfg.SeqLen}
	if err := backend.Upload(be, s, m.Buffers().Params, vals); err != nil {
		return 0, err
	}
	return eval.ExactMatch(be, s, m, tok, ds.EvalRecords[:min(n, len(ds.EvalRecords))], eval.Watch{})
}

// timing runs a row for --timing-steps steps with schedule sched and
// no eval, and returns its mean step time.
func timing(ctx context.Context, c Config, spec rowSpec, sched train.Schedule, model string, lr float64, log *slog.Logger) (float64, error) {
	cfg := rowConfig(c, spec, model, c.Seed, lr)
	cfg.Steps, cfg.EvalEvery, cfg.EvalFraction, cfg.Schedule = c.TimingSteps, 0, 0, sched
	cfg.Out = filepath.Join(c.Out, "timing", spec.dir+"-"+string(sched))
	var m train.Measurements
	r, err := train.Run(ctx, cfg, train.Options{Measurements: &m})
	if err != nil {
		return 0, fmt.Errorf("compare: timing %s %s: %w", spec.name, sched, err)
	}
	if r.Interrupted {
		return 0, fmt.Errorf("compare: timing %s %s: %w at step %d", spec.name, sched, ErrInterrupted, r.Steps)
	}
	log.Info("timing done", "row", spec.name, "schedule", sched, "steps", r.Steps,
		"step_s", fmt.Sprintf("%.3f", m.StepSeconds), "link_bandwidth", c.LinkBandwidth)
	return m.StepSeconds, nil
}

func mib(b float64) string { return fmt.Sprintf("%.2f", b/(1<<20)) }

// table formats the table, its footnotes and the recovery line.
func table(res *Result) string {
	c := res.Config
	var b strings.Builder
	head := []string{"row", "d", "r", "lr", "step s (sequential)", "step s (pipelined)", "device MiB predicted",
		"device MiB peak", "host MiB", "link MiB/step", "final eval loss", "recovery", "exact match", "refits kept"}
	cells := [][]string{head}
	for _, r := range res.Rows {
		d, rr := "-", "-"
		switch r.Mode {
		case string(engine.LSP):
			d, rr = strconv.Itoa(r.D), strconv.Itoa(r.R)
		case string(engine.LoRA), string(engine.Galore):
			rr = strconv.Itoa(r.R)
		}
		if r.R == 0 {
			rr = "-"
		}
		rec := "-"
		if r.Recovery != nil {
			rec = fmt.Sprintf("%.2f", *r.Recovery)
		}
		em := "-"
		if r.ExactMatch != nil && !math.IsNaN(*r.ExactMatch) {
			em = fmt.Sprintf("%.1f%%", 100**r.ExactMatch)
		}
		loss := fmt.Sprintf("%.4f", r.FinalEvalLoss)
		if len(r.Seeds) > 1 {
			loss = fmt.Sprintf("%.4f ± %.4f", r.FinalEvalLoss, r.FinalEvalSD)
		}
		cells = append(cells, []string{r.Name, d, rr, fmt.Sprintf("%g", r.LR), fmt.Sprintf("%.3f", r.StepSecondsSequential),
			fmt.Sprintf("%.3f", r.StepSecondsPipelined), mib(float64(r.DevicePredicted)), mib(float64(r.DevicePeak)),
			mib(float64(r.Host)), fmt.Sprintf("%.3f", r.LinkMeasured/(1<<20)), loss, rec, em, keptCell(r)})
	}
	writeTable(&b, cells)

	bw := "free (0: no charge)"
	if c.LinkBandwidth > 0 {
		bw = fmt.Sprintf("%g MB/s", float64(c.LinkBandwidth)/1e6)
	}
	reused := ""
	if res.PretrainReused {
		reused = ", reused from an earlier identical compare"
	}
	em := "exact match: greedy generation on the first %d held-out prompts after the last step."
	if c.EvalGenerate == 0 {
		em = "exact match: not measured (--eval-generate %d)."
	}
	notes := []string{
		fmt.Sprintf("Model: %s pretrained natively on %s for %d steps (%s%s), then fine-tuned on %s for %d steps in every row: warmup %d, cosine decay to a tenth of the peak lr, batch %d x %d tokens, %s.",
			c.Model, c.PretrainTask, c.PretrainSteps, res.Pretrained, reused, c.Task, c.Steps, fineTuneWarmup,
			c.Batch, c.SeqLen, seedsNote(c)),
		lrNote(res),
		fmt.Sprintf("Eval loss: mean per target token over the held-out %s examples (%g of its records), before the first step (L0 = %.4f with the first seed) and every %d steps (curves: %s); "+em,
			c.Task, train.Defaults().EvalFraction, res.L0, c.EvalEvery, res.PNG, c.EvalGenerate),
		fmt.Sprintf("Shift: the pretrained model's held-out loss on its own %s is %.4f, so %s starts %.2f nats above it (L0 minus that).",
			c.PretrainTask, res.PretrainEvalLoss, c.Task, res.L0-res.PretrainEvalLoss),
		fmt.Sprintf("Link: the CPU backend charges every device-host copy at %s, scaled down from a GPU's PCIe link as the CPU \"device\" is slower than a GPU; the fine-tuning runs use the pipelined schedule. link MiB/step: bytes copied both ways during a step of the fine-tuning run, batch included.", bw),
		fmt.Sprintf("step s: mean wall time of the engine's step (no eval, projector checks or checkpoints) in a %d-step run per schedule; sequential runs one op at a time, pipelined overlaps copies and host Adam with the backward.", c.TimingSteps),
		"device MiB predicted: the memory plan that --device-mem is checked against; peak: the CPU backend's high-water mark; host MiB: the plan's host memory held for the whole run (the optimizer side's, the staging buffer, the data and the Go heap's headroom; not the CPU backend's device memory nor one phase's transients).",
		fmt.Sprintf("lsp rows: d = %d, r = %d for every block matrix; dense params (embeddings, norms and biases) are trained on the device with AdamW (--dense-params device), so all rows update the same parameters. Projector checks every %d steps (and at step 0 with --check-at-start) with %d calibration rows (not in step s; their time per run is in the lines below); lsp keeps the random projectors drawn at the start (lsp-train's default), lsp (fitted) fits them at every check (--fit, the paper's learned projectors) and lsp (resampled) draws fresh random ones at every check (--fit --refit random), a control.",
			c.D, c.R, c.CheckEvery, c.CalibSamples),
		fmt.Sprintf("lora: PEFT's adapters of rank r = %d (alpha %g) on every attention and MLP linear, the block matrices frozen; its dense params train on the device as the lsp rows'. lora (nf4): the same on a base whose block matrices are stored in 4-bit NormalFloat (--base-dtype nf4, QLoRA's), the dense params unquantized; it starts from the quantized base's own step-0 loss, and its recovery takes native's L0, so that what quantizing costs counts against it.",
			c.LoRAR, train.Defaults().LoRAAlpha),
		fmt.Sprintf("lsp (svd) and lsp (gaussian): dense projectors at d = %d (the svd rows' from the calibration gradient's top singular vectors, before step 1 and at every check; the gaussian ones drawn once); galore: GaLore's projected AdamW at rank %d (scale %g), its projectors refreshed every %d steps; the rows marked equal memory run at the ranks of the study's note.",
			c.D, c.D, train.Defaults().GaloreScale, c.CheckEvery),
		"recovery = (L0 - L_row) / (L0 - L_native), per seed, then the mean over seeds. lsp-recovery = (L0 - L_lsp) / (L0 - L_native) with L the final eval losses of the lsp row, per seed against native's, then the mean over seeds: the share of native fine-tuning's eval-loss drop that lsp reaches in the same steps (1: all of it). lsp-quality is the same for the best lsp row whose projectors are fitted and kept on most matrices (a row whose fits were mostly rejected counts as random).",
	}
	b.WriteString("\n")
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	if checks := checkLines(res); len(checks) > 0 {
		b.WriteString("\nProjector checks (mean over seeds and matrices): step: bias ratio before -> after, share of matrices refitted.\n\n")
		for _, l := range checks {
			b.WriteString("- " + l + "\n")
		}
	}
	b.WriteString(studyTable(res))
	quality := "n/a (no lsp row kept fitted projectors on most matrices)"
	if res.Quality != nil {
		quality = fmt.Sprintf("%.2f (%s)", *res.Quality, res.QualityRow)
	}
	fmt.Fprintf(&b, "\nlsp-quality: %s\n", quality)
	rec := math.NaN()
	if res.Recovery != nil {
		rec = *res.Recovery
	}
	fmt.Fprintf(&b, "lsp-recovery: %.2f\n", rec)
	return b.String()
}

// writeTable writes cells as a Markdown table, the first row its head,
// the first column left-aligned and the others right-aligned.
func writeTable(b *strings.Builder, cells [][]string) {
	width := make([]int, len(cells[0]))
	for _, row := range cells {
		for i, s := range row {
			width[i] = max(width[i], len(s))
		}
	}
	line := func(row []string) {
		b.WriteString("|")
		for i, s := range row {
			if i == 0 {
				fmt.Fprintf(b, " %-*s |", width[i], s)
			} else {
				fmt.Fprintf(b, " %*s |", width[i], s)
			}
		}
		b.WriteString("\n")
	}
	line(cells[0])
	b.WriteString("|")
	for i, w := range width {
		if i == 0 {
			b.WriteString(strings.Repeat("-", w+2) + "|")
		} else {
			b.WriteString(strings.Repeat("-", w+1) + ":|")
		}
	}
	b.WriteString("\n")
	for _, row := range cells[1:] {
		line(row)
	}
}

// meanChecks averages a row's checks over its seeds, check by check (the
// seeds check at the same steps); nil for rows that do not check.
func meanChecks(r Row) []CheckPoint {
	if len(r.Seeds) == 0 || len(r.Seeds[0].Checks) == 0 {
		return nil
	}
	out := slices.Clone(r.Seeds[0].Checks)
	for i := range out {
		var before, after, acc float64
		for _, s := range r.Seeds {
			if i < len(s.Checks) {
				before, after, acc = before+s.Checks[i].RatioBefore, after+s.Checks[i].RatioAfter, acc+s.Checks[i].Accepted
			}
		}
		n := float64(len(r.Seeds))
		out[i].RatioBefore, out[i].RatioAfter, out[i].Accepted = before/n, after/n, acc/n
	}
	return out
}

// keptCell is a row's "refits kept" cell: per check step, the share of
// matrices whose refit was kept, mean over seeds ("-" for rows that do
// not check).
func keptCell(r Row) string {
	checks := meanChecks(r)
	if checks == nil {
		return "-"
	}
	var parts []string
	for _, cp := range checks {
		parts = append(parts, fmt.Sprintf("%d: %.2f", cp.Step, cp.Accepted))
	}
	return strings.Join(parts, ", ")
}

// checkLines describes each lsp row's checks over time.
func checkLines(res *Result) []string {
	var out []string
	for _, r := range res.Rows {
		checks := meanChecks(r)
		if checks == nil {
			continue
		}
		var parts []string
		for _, cp := range checks {
			parts = append(parts, fmt.Sprintf("%d: %.3f -> %.3f, %.2f", cp.Step, cp.RatioBefore, cp.RatioAfter, cp.Accepted))
		}
		if r.Projector == string(lsp.KindSVD) {
			var steps []string
			for _, cp := range checks {
				steps = append(steps, strconv.Itoa(cp.Step))
			}
			out = append(out, fmt.Sprintf("%s (svd refreshes, no fit; %.1f s of checks per run): at steps %s", r.Name, r.CheckSeconds, strings.Join(steps, ", ")))
			continue
		}
		fitted := "counts as fitted"
		if !r.Fitted {
			fitted = "counts as random: most matrices never kept a fit"
		}
		if r.Refit == string(lsp.RefitRandom) {
			fitted = "random by construction"
		}
		out = append(out, fmt.Sprintf("%s (--refit %s, %s; %.1f s of checks per run): %s", r.Name, r.Refit, fitted, r.CheckSeconds, strings.Join(parts, "; ")))
	}
	return out
}

// lrNote says how the rows' learning rates were chosen, with each row's
// grid when there was one.
func lrNote(res *Result) string {
	c := res.Config
	lrs, _ := c.lrs() // validated
	if len(lrs) == 1 {
		return fmt.Sprintf("lr: %g in every row (--lrs).", lrs[0])
	}
	var parts []string
	for _, r := range res.Rows {
		var pts []string
		for _, g := range r.Grid {
			pts = append(pts, fmt.Sprintf("%g: %.4f", g.LR, g.FinalEvalLoss))
		}
		parts = append(parts, fmt.Sprintf("%s {%s}", r.Name, strings.Join(pts, ", ")))
	}
	return fmt.Sprintf("lr: each row's peak lr is the point of the grid %s (--lrs) whose seed-%d run ends at the lowest held-out loss, the loss also reported (so every row gets its best of the grid); the other seeds run at it. Final eval loss by lr: %s.",
		c.LRs, c.Seed, strings.Join(parts, "; "))
}

// seedsNote names the seeds of the fine-tuning runs.
func seedsNote(c Config) string {
	if c.Seeds == 1 {
		return fmt.Sprintf("seed %d", c.Seed)
	}
	return fmt.Sprintf("seeds %d to %d (final eval loss: mean ± sample standard deviation)", c.Seed, c.Seed+uint64(c.Seeds)-1)
}

// write writes the plot, the Markdown table and the JSON numbers.
func write(res *Result) error {
	var curves []metrics.Curve
	for _, r := range res.Rows {
		recs := make([]metrics.Record, len(r.Curve))
		for i, p := range r.Curve {
			recs[i] = metrics.Record{Step: p.Step, EvalLoss: metrics.F(p.Loss)}
		}
		curves = append(curves, metrics.Curve{Label: r.Name, Records: recs})
	}
	title := fmt.Sprintf("%s: fine-tuning on %s after %s", res.Config.Model, res.Config.Task, res.Config.PretrainTask)
	refs := []metrics.RefLine{{Label: fmt.Sprintf("L0 = %.2f (before fine-tuning)", res.L0), Y: res.L0}}
	if err := metrics.PlotEvalLoss(curves, refs, res.PNG, title); err != nil {
		return fmt.Errorf("compare: %w", err)
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("compare: %w", err)
	}
	for _, f := range []struct {
		path string
		body []byte
	}{{res.MD, []byte(res.Table)}, {res.JSON, append(js, '\n')}} {
		if err := atomicfile.WriteFile(f.path, 0o644, func(w io.Writer) error {
			_, err := w.Write(f.body)
			return err
		}); err != nil {
			return fmt.Errorf("compare: %w", err)
		}
	}
	return nil
}
