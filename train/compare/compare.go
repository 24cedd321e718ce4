// Package compare is the compare job (lsp-train compare): one table that
// puts the three update modes side by side on the same fine-tuning
// problem, from training runs it starts itself.
//
//  1. pretrain a preset (--model, tiny by default) natively on one builtin task (--pretrain-task)
//     into <out>/pretrain, or reuse it when a stamp says an identical earlier
//     compare made it;
//  2. fine-tune that checkpoint on another builtin task (--task) in four
//     rows: native, zero, lsp and lsp with never-fitted projectors (a
//     control), same steps and schedule, the link charged at
//     --link-bandwidth, with an eval before the first step (L0) and every
//     --eval-every steps, and greedy exact match at the end;
//  3. time each row in two short extra runs, sequential and pipelined;
//  4. write <out>/compare.png (eval-loss curves), compare.md (the table)
//     and compare.json (every number), and return the table, whose last
//     line is "lsp-recovery: X.XX" = (L0 - L_lsp) / (L0 - L_native).
//
// Limits: the model is a preset trained from scratch and the tasks builtin
// ones; d and r are bounded by the preset's matrices (d <= min(m, n)/4, r <= d/4) so
// the lsp rows really compress; step times come from 10-step runs (the
// first step's allocations included) on the CPU backend, whose "device"
// and link are far slower than a GPU's, so only their ratios mean much.
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
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/models"
)

var flagErr = flagerr.New

// Fixed settings of the compare job's fine-tuning rows.
const (
	fineTuneLR     = 3e-3
	fineTuneWarmup = 10
	checkEvery     = 50
	calibSamples   = 32
)

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
	EvalGenerate  int    // --eval-generate: held-out prompts scored by exact match at the end
	Threads       int    // --threads: compute threads (0: all cores)
	Seed          uint64 // --seed
}

// Defaults is the default compare job: a few minutes on two cores.
func Defaults() Config {
	return Config{Out: "out/compare", Model: "tiny", Steps: 100, PretrainSteps: 300, Task: "builtin:copy",
		PretrainTask: "builtin:sort", D: 32, R: 8, LinkBandwidth: 100_000_000, TimingSteps: 10,
		EvalEvery: 10, EvalGenerate: 100, Seed: 1}
}

// bounds is the largest --d and the largest --r for d that the
// compare job accepts: d <= min(m, n)/4 over the preset's block matrices and
// r <= d/4, so that S (d x d) is a real compression of every matrix and the
// projectors stay sparse.
func bounds(preset string, d int) (dmax, rmax int) {
	mc, err := models.Preset(preset)
	if err != nil {
		return 0, 0 // Validate names the unknown --model
	}
	dmax = math.MaxInt
	for _, mt := range mc.Matrices() {
		dmax = min(dmax, min(mt.M, mt.N)/4)
	}
	return dmax, d / 4
}

// builtinTask returns TASK of "builtin:TASK[:N]", or an error for --flag.
func builtinTask(flag, spec string) (string, error) {
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
	check(c.EvalGenerate >= 0, "eval-generate", "must be >= 0, got %d", c.EvalGenerate)
	check(c.LinkBandwidth >= 0, "link-bandwidth", "must be >= 0, got %d", c.LinkBandwidth)
	check(c.Threads >= 0, "threads", "must be >= 0, got %d", c.Threads)
	_, err := models.Preset(c.Model)
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
	check(err1 != nil || err2 != nil || ft != pt, "task", "%s is the --pretrain-task too; fine-tuning must move the model to another task", ft)
	return errors.Join(errs...)
}

// EvalPoint is one eval of a fine-tuning run.
type EvalPoint struct {
	Step int     `json:"step"`
	Loss float64 `json:"eval_loss"`
}

// Row is one row of the table: a mode's fine-tuning run and its
// two timing runs.
type Row struct {
	Name  string `json:"name"` // native, zero, lsp, lsp (no fit)
	Mode  string `json:"mode"`
	NoFit bool   `json:"no_fit,omitempty"`
	D     int    `json:"d,omitempty"` // lsp rows only
	R     int    `json:"r,omitempty"`
	Out   string `json:"out"` // the fine-tuning run's output directory

	// Mean wall seconds of an optimizer step (the engine's step only) in
	// the timing runs, and over the whole (pipelined) fine-tuning run.
	StepSecondsSequential float64 `json:"step_s_sequential"`
	StepSecondsPipelined  float64 `json:"step_s_pipelined"`
	StepSecondsFineTune   float64 `json:"step_s_finetune"`
	CheckSeconds          float64 `json:"check_s"` // projector checks of the fine-tuning run

	DevicePredicted int64   `json:"device_bytes_predicted"` // the memory plan
	DevicePeak      int64   `json:"device_bytes_peak"`      // the backend's high-water mark
	Host            int64   `json:"host_bytes_predicted"`   // optimizer-side host memory of the plan
	LinkPredicted   int64   `json:"link_bytes_per_step_predicted"`
	LinkMeasured    float64 `json:"link_bytes_per_step"`

	StartEvalLoss float64     `json:"start_eval_loss"` // step 0
	FinalEvalLoss float64     `json:"final_eval_loss"`
	ExactMatch    *float64    `json:"exact_match,omitempty"` // absent with --eval-generate 0
	Curve         []EvalPoint `json:"eval_curve"`
	Seconds       float64     `json:"seconds"` // wall time of the fine-tuning run
}

// Result is a finished compare job.
type Result struct {
	Config         Config  `json:"config"`
	Pretrained     string  `json:"pretrained"` // the Hugging Face export fine-tuned by every row
	PretrainReused bool    `json:"pretrain_reused"`
	L0             float64 `json:"l0"` // eval loss before fine-tuning (the native row's step 0)
	// Recovery is (L0 - L_lsp) / (L0 - L_native) of the final eval losses
	// (absent in JSON when native did not lower the loss).
	Recovery *float64 `json:"lsp_recovery,omitempty"`
	Rows     []Row    `json:"rows"`
	Table    string   `json:"-"` // what is printed: the table, footnotes, the recovery line
	PNG      string   `json:"-"`
	MD       string   `json:"-"`
	JSON     string   `json:"-"`
}

// ErrInterrupted reports a compare job stopped by its context.
var ErrInterrupted = errors.New("interrupted")

// rowSpec is what distinguishes the rows.
type rowSpec struct {
	name, dir string
	mode      engine.Mode
	noFit     bool
}

var rows = []rowSpec{
	{"native", "native", engine.Native, false},
	{"zero", "zero", engine.Zero, false},
	{"lsp", "lsp", engine.LSP, false},
	{"lsp (no fit)", "lsp-nofit", engine.LSP, true},
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
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return nil, flagErr("out", "%v", err)
	}
	res := &Result{Config: c, PNG: filepath.Join(c.Out, "compare.png"),
		MD: filepath.Join(c.Out, "compare.md"), JSON: filepath.Join(c.Out, "compare.json")}
	var err error
	if res.Pretrained, res.PretrainReused, err = pretrain(ctx, c, log); err != nil {
		return nil, err
	}
	for _, spec := range rows {
		row, err := fineTune(ctx, c, spec, res.Pretrained, log)
		if err != nil {
			return nil, err
		}
		res.Rows = append(res.Rows, row)
	}
	for i, spec := range rows {
		for _, sched := range []train.Schedule{train.Sequential, train.Pipelined} {
			sec, err := timing(ctx, c, spec, sched, res.Pretrained, log)
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
	native, lspRow := res.Rows[0], res.Rows[2]
	res.L0 = native.StartEvalLoss
	if drop := res.L0 - native.FinalEvalLoss; drop > 0 {
		res.Recovery = metrics.F((res.L0 - lspRow.FinalEvalLoss) / drop)
	}
	res.Table = table(res)
	if err := write(res); err != nil {
		return nil, err
	}
	return res, nil
}

// base is the part of a training run's configuration that every run of
// the job shares.
func base(c Config) train.Config {
	cfg := train.Defaults()
	cfg.Threads, cfg.Seed = c.Threads, c.Seed
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

// rowConfig is a row's run: fine-tuning (or timing, with the
// caller's changes) of the pretrained model.
func rowConfig(c Config, spec rowSpec, model string) train.Config {
	cfg := base(c)
	cfg.Model, cfg.Data, cfg.Steps = model, c.Task, c.Steps
	cfg.LR, cfg.Warmup, cfg.EvalEvery = fineTuneLR, fineTuneWarmup, c.EvalEvery
	cfg.Mode, cfg.Schedule, cfg.LinkBandwidth = spec.mode, train.Pipelined, c.LinkBandwidth
	if spec.mode == engine.LSP {
		cfg.DenseParams, cfg.D, cfg.R, cfg.NoFit = engine.DenseDevice, c.D, c.R, spec.noFit
		cfg.CheckEvery, cfg.CalibSamples = checkEvery, calibSamples
	}
	cfg.Out = filepath.Join(c.Out, spec.dir)
	return cfg
}

// fineTune runs one row's fine-tuning and scores it.
func fineTune(ctx context.Context, c Config, spec rowSpec, model string, log *slog.Logger) (Row, error) {
	cfg := rowConfig(c, spec, model)
	row := Row{Name: spec.name, Mode: string(spec.mode), NoFit: spec.noFit, Out: cfg.Out}
	if spec.mode == engine.LSP {
		row.D, row.R = c.D, c.R
	}
	t0 := time.Now()
	var m train.Measurements
	r, err := train.Run(ctx, cfg, train.Options{EvalAtStart: true, Measurements: &m})
	if err != nil {
		return row, fmt.Errorf("compare: %s: %w", spec.name, err)
	}
	if r.Interrupted {
		return row, fmt.Errorf("compare: %s: %w at step %d", spec.name, ErrInterrupted, r.Steps)
	}
	row.StepSecondsFineTune, row.CheckSeconds = m.StepSeconds, m.CheckSeconds
	row.DevicePredicted, row.DevicePeak, row.Host = m.Plan.DeviceTotal(), m.DevicePeak, m.Plan.HostTotal()
	row.LinkPredicted = m.Plan.LinkD2H + m.Plan.LinkH2D + m.Plan.BatchD2H + m.Plan.BatchH2D
	row.LinkMeasured, row.FinalEvalLoss = m.LinkBytesPerStep, r.EvalLoss
	recs, err := metrics.ReadFile(r.Metrics)
	if err != nil {
		return row, fmt.Errorf("compare: %s: %w", spec.name, err)
	}
	row.StartEvalLoss = math.NaN()
	for _, rec := range recs {
		if rec.EvalLoss != nil {
			row.Curve = append(row.Curve, EvalPoint{Step: rec.Step, Loss: *rec.EvalLoss})
			if rec.Step == 0 {
				row.StartEvalLoss = *rec.EvalLoss
			}
		}
	}
	if len(row.Curve) == 0 || math.IsNaN(row.StartEvalLoss) || math.IsNaN(row.FinalEvalLoss) {
		return row, fmt.Errorf("compare: %s: %s holds no eval loss at step 0 and at the end (is the eval set of --task empty?)", spec.name, r.Metrics)
	}
	if c.EvalGenerate > 0 {
		em, err := exactMatch(cfg, r.Export, c.EvalGenerate)
		if err != nil {
			return row, fmt.Errorf("compare: %s: %w", spec.name, err)
		}
		if !math.IsNaN(em) {
			row.ExactMatch = &em
		}
	}
	row.Seconds = time.Since(t0).Seconds()
	args := []any{"row", spec.name, "steps", r.Steps, "eval_loss_start", fmt.Sprintf("%.4f", row.StartEvalLoss),
		"eval_loss", fmt.Sprintf("%.4f", row.FinalEvalLoss), "step_s", fmt.Sprintf("%.3f", m.StepSeconds)}
	if row.ExactMatch != nil {
		args = append(args, "exact_match", fmt.Sprintf("%.3f", *row.ExactMatch))
	}
	log.Info("fine-tune done", append(args, "seconds", fmt.Sprintf("%.1f", row.Seconds))...)
	return row, nil
}

// exactMatch scores the exported weights of a run by greedy exact
// match on the first n held-out records of its data. It runs after the
// training run, so that only the final weights pay for generation.
func exactMatch(cfg train.Config, export string, n int) (float64, error) {
	mc, vals, err := models.Load(export)
	if err != nil {
		return 0, err
	}
	tok, err := models.Tokenizer(mc, export, "")
	if err != nil {
		return 0, err
	}
	ds, err := data.Load(cfg.Data, tok, data.Options{SeqLen: cfg.SeqLen, Truncate: cfg.Truncate,
		EvalFraction: cfg.EvalFraction, Seed: cfg.Seed})
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
	return eval.ExactMatch(be, s, m, tok, ds.EvalRecords[:min(n, len(ds.EvalRecords))])
}

// timing runs a row for --timing-steps steps with schedule sched and
// no eval, and returns its mean step time.
func timing(ctx context.Context, c Config, spec rowSpec, sched train.Schedule, model string, log *slog.Logger) (float64, error) {
	cfg := rowConfig(c, spec, model)
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
	head := []string{"row", "d", "r", "step s (sequential)", "step s (pipelined)", "device MiB predicted",
		"device MiB peak", "host MiB", "link MiB/step", "final eval loss", "exact match"}
	cells := [][]string{head}
	for _, r := range res.Rows {
		d, rr := "-", "-"
		if r.Mode == string(engine.LSP) {
			d, rr = strconv.Itoa(r.D), strconv.Itoa(r.R)
		}
		em := "-"
		if r.ExactMatch != nil && !math.IsNaN(*r.ExactMatch) {
			em = fmt.Sprintf("%.1f%%", 100**r.ExactMatch)
		}
		cells = append(cells, []string{r.Name, d, rr, fmt.Sprintf("%.3f", r.StepSecondsSequential),
			fmt.Sprintf("%.3f", r.StepSecondsPipelined), mib(float64(r.DevicePredicted)), mib(float64(r.DevicePeak)),
			mib(float64(r.Host)), fmt.Sprintf("%.3f", r.LinkMeasured/(1<<20)), fmt.Sprintf("%.4f", r.FinalEvalLoss), em})
	}
	width := make([]int, len(head))
	for _, row := range cells {
		for i, s := range row {
			width[i] = max(width[i], len(s))
		}
	}
	line := func(row []string) {
		b.WriteString("|")
		for i, s := range row {
			if i == 0 {
				fmt.Fprintf(&b, " %-*s |", width[i], s)
			} else {
				fmt.Fprintf(&b, " %*s |", width[i], s)
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

	var checks float64
	for _, r := range res.Rows {
		if r.Mode == string(engine.LSP) {
			checks += r.CheckSeconds
		}
	}
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
		fmt.Sprintf("Model: %s pretrained natively on %s for %d steps (%s%s), then fine-tuned on %s for %d steps in every row: lr %g (warmup %d, cosine decay), batch %d x %d tokens, seed %d.",
			c.Model, c.PretrainTask, c.PretrainSteps, res.Pretrained, reused, c.Task, c.Steps, fineTuneLR, fineTuneWarmup,
			train.Defaults().Batch, train.Defaults().SeqLen, c.Seed),
		fmt.Sprintf("Eval loss: mean per target token over the held-out %s examples (%g of its records), before the first step (L0 = %.4f) and every %d steps (curves: %s); "+em,
			c.Task, train.Defaults().EvalFraction, res.L0, c.EvalEvery, res.PNG, c.EvalGenerate),
		fmt.Sprintf("Link: the CPU backend charges every device-host copy at %s, scaled down from a GPU's PCIe link as the CPU \"device\" is slower than a GPU; the fine-tuning runs use the pipelined schedule. link MiB/step: bytes copied both ways during a step of the fine-tuning run, batch included.", bw),
		fmt.Sprintf("step s: mean wall time of the engine's step (no eval, projector checks or checkpoints) in a %d-step run per schedule; sequential runs one op at a time, pipelined overlaps copies and host Adam with the backward.", c.TimingSteps),
		"device MiB predicted: the memory plan that --device-mem is checked against; peak: the CPU backend's high-water mark; host MiB: the plan's optimizer-side host memory.",
		fmt.Sprintf("lsp rows: d = %d, r = %d for every block matrix; dense params (embeddings, norms and biases) are trained on the device with AdamW (--dense-params device), so all rows update the same parameters. Projector checks at step 0 and every %d steps with %d calibration rows took %.1f s in all (not in step s); lsp (no fit) keeps its random projectors (--no-fit), a control.",
			c.D, c.R, checkEvery, calibSamples, checks),
		"lsp-recovery = (L0 - L_lsp) / (L0 - L_native) with L the final eval losses: the share of native fine-tuning's eval-loss drop that lsp reaches in the same steps (1: all of it).",
	}
	b.WriteString("\n")
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	rec := math.NaN()
	if res.Recovery != nil {
		rec = *res.Recovery
	}
	fmt.Fprintf(&b, "\nlsp-recovery: %.2f\n", rec)
	return b.String()
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
