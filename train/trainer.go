// The training run: set-up, the step loop, evaluation, checkpoints, and the
// outputs a user gets at the end.

package train

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Result summarises a finished (or interrupted) run.
type Result struct {
	Out          string // the output directory
	Steps        int    // the last step completed
	Interrupted  bool   // stopped by the context (Ctrl-C) after checkpointing
	TrainLoss    float64
	EvalLoss     float64 // NaN when there is no eval set
	ExactMatch   float64 // NaN when there are no eval records
	TokensPerSec float64
	Elapsed      time.Duration
	Checkpoint   string
	Export       string // Hugging Face directory with the final weights
	Metrics      string
	Plot         string
	Losses       []float64 // train loss of every step of this process, in order
}

// Measurements are what a run measured of its own steps in this process,
// beside the plan it was checked against: the figures a comparison of
// runs reads (Options.Measurements).
type Measurements struct {
	Plan             Plan    // the predicted memory and link traffic the run was checked against
	StepSeconds      float64 // mean wall time of an optimizer step (engine Step only: no checks, eval or checkpoints)
	CheckSeconds     float64 // total wall time of the projector checks (lsp)
	LinkBytesPerStep float64 // mean device-host bytes (both ways) copied during an optimizer step
	DevicePeak       int64   // the backend's device memory high-water mark at the end
}

// ErrNonFinite reports a NaN or infinite loss.
var ErrNonFinite = errors.New("non-finite loss")

// Options are the parts of a run that are not configuration.
type Options struct {
	Logger   *slog.Logger
	Progress *os.File // where the progress bar goes (nil: none)
	// Backend, when set, replaces the CPU backend built from Config (tests
	// use it for hazard mode).
	Backend backend.Backend
	// StopAfter > 0 stops the run as if interrupted after that step (tests).
	StopAfter int
	// EvalAtStart evaluates once before the first step (a step-0 eval
	// record) when the run starts fresh rather than resuming.
	EvalAtStart bool
	// Measurements, when set, receives the run's measurements when it
	// returns a Result.
	Measurements *Measurements
}

// run holds the state of one training run.
type run struct {
	cfg    Config
	opts   Options
	log    *slog.Logger
	be     backend.Backend
	s      backend.Stream
	model  *gpt2.Model
	eng    *engine.Engine
	tok    tokenizer.Tokenizer
	ds     *data.Dataset
	loader *data.Loader
	sched  optim.Schedule
	mw     *metrics.Writer
	prog   *metrics.Progress
	start  time.Time
	tokens int64
	step   int
	plan   Plan

	// Step measurements of this process (Result.StepSeconds and so on).
	stepSecs, checkSecs float64
	stepLink            int64
	stepsTimed          int
}

// Plan is the predicted memory and link traffic of a run.
type Plan = engine.Plan

// PlanMemory predicts the device and host memory of training cfg with the
// model mc, in cfg's mode.
func PlanMemory(mc gpt2.Config, c Config) (Plan, error) {
	st, err := os.Stat(c.Model)
	fromCheckpoint := err == nil && st.IsDir()
	return engine.PlanMemory(mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, c.engineConfig(fromCheckpoint))
}

// Run trains as cfg says until the steps are done or ctx is cancelled; on
// cancellation it drains, checkpoints and returns with Interrupted set.
func Run(ctx context.Context, cfg Config, opts Options) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, opts: opts, log: opts.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	defer r.close()
	if err := r.setup(); err != nil {
		return nil, err
	}
	res, err := r.loop(ctx)
	if res != nil && opts.Measurements != nil {
		*opts.Measurements = r.measurements()
	}
	return res, err
}

func (r *run) close() {
	if r.mw != nil {
		r.mw.Close()
	}
	if r.eng != nil {
		r.eng.Free() // also stops the host worker threads
	}
	if r.be != nil && r.opts.Backend == nil {
		r.be.Close()
	}
}

func (r *run) setup() error {
	cfg := r.cfg
	mc, fromCheckpoint, err := ResolveModel(cfg.Model)
	if err != nil {
		return err
	}
	if cfg.SeqLen > mc.MaxT {
		return flagErr("seq-len", "%d is longer than the model context n_positions=%d", cfg.SeqLen, mc.MaxT)
	}
	if r.tok, err = tokenizer.ByName(mc.Tokenizer()); err != nil {
		return err
	}
	if r.tok.VocabSize() > mc.V {
		return flagErr("model", "vocab_size %d is smaller than the %s tokenizer's %d", mc.V, r.tok.Name(), r.tok.VocabSize())
	}
	r.ds, err = data.Load(cfg.Data, r.tok, data.Options{SeqLen: cfg.SeqLen, Truncate: cfg.Truncate, EvalFraction: cfg.EvalFraction, Seed: cfg.Seed})
	if err != nil {
		return flagErr("data", "%v", err)
	}
	r.log.Info("data", "source", r.ds.Source, "train", len(r.ds.Train), "eval", len(r.ds.Eval),
		"dropped_too_long", r.ds.Dropped, "truncated", r.ds.Truncated)

	plan, err := PlanMemory(mc, cfg)
	if err != nil {
		return err
	}
	r.plan = plan
	r.log.Info("memory plan", "mode", cfg.Mode, "device_bytes", plan.DeviceTotal(), "host_bytes", plan.HostTotal(),
		"link_bytes_per_step", plan.LinkD2H+plan.LinkH2D, "detail", plan.String())
	if cfg.DeviceMem > 0 && plan.Total() > cfg.DeviceMem {
		hint := "lower --batch or --seq-len, use --mode lsp (or zero), or a smaller model"
		if cfg.Mode == engine.LSP {
			hint = "lower --batch, --seq-len or --d, or use a smaller model"
		}
		return flagErr("device-mem", "the run needs %d bytes of device memory (%.1f MiB: %s) but the budget is %d bytes; %s",
			plan.Total(), float64(plan.Total())/(1<<20), plan.String(), cfg.DeviceMem, hint)
	}

	r.be = r.opts.Backend
	if r.be == nil {
		if r.be, err = device.Open(device.Config{Kind: cfg.Device, MemBudget: cfg.DeviceMem, Threads: cfg.Threads,
			Seed: cfg.Seed, LinkBandwidth: cfg.LinkBandwidth}); err != nil {
			return flagErr("device", "%v", err)
		}
	}
	r.s = r.be.DefaultStream()
	if r.eng, err = engine.New(r.be, mc, cfg.Batch, cfg.SeqLen, cfg.GradAccum, cfg.DType, cfg.engineConfig(fromCheckpoint)); err != nil {
		return err
	}
	r.model = r.eng.Model
	if cfg.Mode == engine.LSP {
		for k := gpt2.Matrix(0); k < gpt2.NumMatrices; k++ {
			m, n := mc.MatrixShape(k)
			if d := lsp.CapD(cfg.D, m, n); d < cfg.D || lsp.CapR(cfg.R, d) < cfg.R {
				r.log.Info("lsp: d and r capped for this matrix", "matrix", k.String(), "shape", fmt.Sprintf("%dx%d", m, n),
					"d", d, "r", lsp.CapR(cfg.R, d), "requested_d", cfg.D, "requested_r", cfg.R)
			}
		}
	}
	if r.loader, err = data.NewLoader(r.ds.Train, cfg.Batch, cfg.SeqLen, cfg.Seed); err != nil {
		return flagErr("data", "%v", err)
	}
	total := cfg.Steps
	if total == 0 {
		perEpoch := max(1, r.loader.Len()/(cfg.Batch*cfg.GradAccum))
		total = max(1, int(math.Ceil(cfg.Epochs*float64(perEpoch))))
	}
	r.cfg.Steps = total
	r.sched = optim.Schedule{LR: cfg.LR, MinLR: cfg.MinLR, Warmup: cfg.Warmup, Total: total}

	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return flagErr("out", "%v", err)
	}
	resumeStep := -1
	ckPath := filepath.Join(cfg.Out, checkpoint.FileName)
	if cfg.Resume {
		ck, err := checkpoint.Load(ckPath, mc)
		if err != nil {
			return err
		}
		// Everything that decides the data order and the math must match, or
		// the resumed run would silently train on something else.
		saved := fmt.Sprintf("--dtype %s --batch %d --seq-len %d --grad-accum %d --data %s --seed %d --eval-fraction %g --truncate=%v --mode %s%s",
			ck.DType, ck.Batch, ck.SeqLen, ck.GradAccum, ck.Data, ck.Seed, ck.EvalFraction, ck.Truncate, ck.Mode, lspFlags(ck.Mode, ck.DenseParams, ck.D, ck.R))
		ec := cfg.engineConfig(fromCheckpoint)
		now := fmt.Sprintf("--dtype %s --batch %d --seq-len %d --grad-accum %d --data %s --seed %d --eval-fraction %g --truncate=%v --mode %s%s",
			cfg.DType, cfg.Batch, cfg.SeqLen, cfg.GradAccum, cfg.Data, cfg.Seed, cfg.EvalFraction, cfg.Truncate, cfg.Mode, lspFlags(cfg.Mode, ec.DenseParams, cfg.D, cfg.R))
		if saved != now {
			return fmt.Errorf("resume: %s was saved with %s; this run has %s; resume with the same values", ckPath, saved, now)
		}
		if err := ck.Restore(r.be, r.s, r.model.Params, r.eng); err != nil {
			return err
		}
		if err := r.loader.Seek(ck.Position); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		r.step, r.tokens, resumeStep = ck.Step, ck.Tokens, ck.Step
		r.log.Info("resumed", "checkpoint", ckPath, "step", ck.Step)
	} else {
		vals := gpt2.Init(mc, cfg.Seed)
		if fromCheckpoint {
			_, vals, err = gpt2.LoadHF(cfg.Model)
			if err != nil {
				return flagErr("model", "%v", err)
			}
		}
		if err := backend.Upload(r.be, r.s, r.model.Params, vals); err != nil {
			return err
		}
		if err := r.eng.Init(); err != nil {
			return err
		}
	}
	if r.mw, err = metrics.Create(filepath.Join(cfg.Out, "metrics.jsonl"), resumeStep); err != nil {
		return err
	}
	r.log.Info("model", "model", cfg.Model, "params", mc.NumParams(), "layers", mc.L, "width", mc.C,
		"heads", mc.NH, "vocab", mc.V, "dtype", cfg.DType, "device", r.be.Name())
	return nil
}

// trainStep runs one optimizer step over GradAccum micro-batches (after a
// projector check when one is due) and returns the mean loss per target
// token.
func (r *run) trainStep(lr float64) (float64, error) {
	if r.eng.CheckDue() {
		if err := r.checkProjectors(); err != nil {
			return 0, err
		}
	}
	batches := make([]data.Batch, r.cfg.GradAccum)
	targets := 0
	for i := range batches {
		r.loader.Next(&batches[i])
		targets += batches[i].NumTargets
		r.tokens += int64(batches[i].B * batches[i].T)
	}
	if targets == 0 {
		return 0, fmt.Errorf("step %d: no target tokens in the batch", r.step+1)
	}
	tr0, t0 := r.be.Traffic(), time.Now()
	sum, err := r.eng.Step(batches, lr)
	if err != nil {
		return 0, err
	}
	tr1 := r.be.Traffic()
	r.stepSecs += time.Since(t0).Seconds()
	r.stepLink += tr1.D2H - tr0.D2H + tr1.H2D - tr0.H2D
	r.stepsTimed++
	loss := sum / float64(targets)
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return loss, fmt.Errorf("step %d: loss is %v: %w; stopping without saving this step (the last checkpoint is kept); try a lower --lr", r.step+1, loss, ErrNonFinite)
	}
	return loss, nil
}

// checkProjectors runs the lsp projector check and logs every matrix's
// result to the metrics; a fit that misses alpha is a warning.
func (r *run) checkProjectors() error {
	// The calibration rows come from their own shuffle of the training
	// rows, keyed by the step, so the checks neither move the training
	// data's position nor depend on where a run was resumed.
	calib, err := data.NewLoader(r.ds.Train, r.cfg.Batch, r.cfg.SeqLen, r.cfg.Seed^0xca1b^uint64(r.step)*0x9e3779b97f4a7c15)
	if err != nil {
		return flagErr("data", "%v", err)
	}
	batches := make([]data.Batch, r.eng.CalibBatches())
	for i := range batches {
		calib.Next(&batches[i])
	}
	t0 := time.Now()
	reps, err := r.eng.Check(batches)
	r.checkSecs += time.Since(t0).Seconds()
	if err != nil {
		return err
	}
	missed := 0
	for _, p := range reps {
		if !p.Reached {
			missed++
			r.log.Warn("projector fit did not reach --alpha; training continues with the best projectors found",
				"matrix", p.Matrix, "ratio_before", p.RatioBefore, "ratio_after", p.RatioAfter, "alpha", r.cfg.Alpha, "iters", p.Iters)
		}
		rec := metrics.Record{Step: r.step, Event: "projector-check", Projector: &metrics.ProjectorCheck{
			Matrix: p.Matrix, RatioBefore: p.RatioBefore, RatioAfter: p.RatioAfter, Iters: p.Iters,
			Resampled: p.Resampled, Reached: p.Reached, Change: p.Change, Rewarm: p.Rewarm, Seconds: p.Seconds}}
		if err := r.mw.Write(rec); err != nil {
			return err
		}
	}
	r.log.Info("projector check", "step", r.step, "matrices", len(reps), "missed_alpha", missed,
		"seconds", fmt.Sprintf("%.2f", time.Since(t0).Seconds()))
	return nil
}

func (r *run) loop(ctx context.Context) (*Result, error) {
	cfg := r.cfg
	res := &Result{Out: cfg.Out, EvalLoss: math.NaN(), ExactMatch: math.NaN(),
		Checkpoint: filepath.Join(cfg.Out, checkpoint.FileName), Metrics: filepath.Join(cfg.Out, "metrics.jsonl")}
	if r.opts.Progress != nil {
		r.prog = metrics.NewProgress(r.opts.Progress, cfg.Steps, r.log)
	}
	logf := func(msg string, args ...any) {
		if r.prog != nil {
			r.prog.Log(msg, args...)
		} else {
			r.log.Info(msg, args...)
		}
	}
	// Before the clock starts, so tokens/s counts training only.
	if r.opts.EvalAtStart && !cfg.Resume && r.step == 0 {
		if err := r.evaluate(res, logf); err != nil {
			return res, err
		}
	}
	r.start = time.Now()
	startTokens := r.tokens
	lastEval := -1
	if r.step >= cfg.Steps {
		// Resumed from a finished run: its final eval is in the metrics
		// already; another would duplicate that step.
		lastEval = r.step
	}
	for r.step < cfg.Steps {
		if ctx.Err() != nil || (r.opts.StopAfter > 0 && r.step >= r.opts.StopAfter) {
			res.Interrupted = true
			break
		}
		lr := r.sched.At(r.step + 1)
		t0 := time.Now()
		tok0 := r.tokens
		loss, err := r.trainStep(lr)
		if err != nil {
			if r.prog != nil {
				r.prog.Done()
			}
			return res, err
		}
		r.step++
		res.TrainLoss = loss
		res.Losses = append(res.Losses, loss)
		tps := float64(r.tokens-tok0) / time.Since(t0).Seconds()
		// Time is left 0 so the Writer fills it in, continuing across resumes.
		rec := metrics.Record{Step: r.step, TrainLoss: metrics.F(loss),
			TokensPerSec: metrics.F(tps), LR: metrics.F(lr)}
		if gn, err := r.eng.GradNorm(); err == nil {
			norm := gn
			if math.IsNaN(norm) || math.IsInf(norm, 0) {
				// A finite loss can still give non-finite gradients; the update
				// has used them, so stop before anything of this step is saved.
				if r.prog != nil {
					r.prog.Done()
				}
				return res, fmt.Errorf("step %d: gradient norm is %v: %w; stopping without saving this step (the last checkpoint is kept); try a lower --lr", r.step, norm, ErrNonFinite)
			}
			rec.GradNorm = metrics.F(norm)
		}
		if err := r.mw.Write(rec); err != nil {
			return res, err
		}
		if r.prog != nil {
			r.prog.Update(r.step, loss, tps)
		}
		if cfg.EvalEvery > 0 && r.step%cfg.EvalEvery == 0 && r.step < cfg.Steps {
			if err := r.evaluate(res, logf); err != nil {
				return res, err
			}
			lastEval = r.step
		}
		if cfg.CheckpointEvery > 0 && r.step%cfg.CheckpointEvery == 0 && r.step < cfg.Steps {
			if err := r.saveCheckpoint(); err != nil {
				return res, err
			}
		}
	}
	if r.prog != nil {
		r.prog.Done()
	}
	res.Steps = r.step
	res.Elapsed = time.Since(r.start)
	res.TokensPerSec = float64(r.tokens-startTokens) / res.Elapsed.Seconds()
	if err := r.saveCheckpoint(); err != nil {
		return res, err
	}
	if res.Interrupted {
		r.log.Info("interrupted: checkpoint saved; continue with --resume", "step", r.step, "checkpoint", res.Checkpoint)
		return res, nil
	}
	if lastEval != r.step {
		if err := r.evaluate(res, logf); err != nil {
			return res, err
		}
	}
	vals, err := backend.Download(r.be, r.s, r.model.Params)
	if err != nil {
		return res, err
	}
	res.Export = filepath.Join(cfg.Out, "hf")
	if err := gpt2.ExportHF(res.Export, r.model.Cfg, vals); err != nil {
		return res, err
	}
	recs, err := metrics.ReadFile(res.Metrics)
	if err != nil {
		return res, err
	}
	res.Plot = filepath.Join(cfg.Out, "loss.png")
	if err := metrics.PlotLoss(recs, res.Plot, fmt.Sprintf("%s on %s", cfg.Model, cfg.Data)); err != nil {
		return res, err
	}
	return res, nil
}

// measurements are the run's Measurements so far.
func (r *run) measurements() Measurements {
	m := Measurements{Plan: r.plan, CheckSeconds: r.checkSecs, DevicePeak: r.be.MemStats().HighWater}
	if r.stepsTimed > 0 {
		m.StepSeconds = r.stepSecs / float64(r.stepsTimed)
		m.LinkBytesPerStep = float64(r.stepLink) / float64(r.stepsTimed)
	}
	return m
}

func (r *run) saveCheckpoint() error {
	st := checkpoint.State{Step: r.step, Position: r.loader.Position(), Seed: r.cfg.Seed, Model: r.model.Cfg,
		DType: r.cfg.DType, Data: r.cfg.Data, Batch: r.cfg.Batch, SeqLen: r.cfg.SeqLen, Tokens: r.tokens,
		GradAccum: r.cfg.GradAccum, EvalFraction: r.cfg.EvalFraction, Truncate: r.cfg.Truncate, Mode: r.cfg.Mode}
	if r.cfg.Mode == engine.LSP {
		st.DenseParams, st.D, st.R = r.eng.DenseParams(), r.cfg.D, r.cfg.R
	}
	return checkpoint.Save(filepath.Join(r.cfg.Out, checkpoint.FileName), r.be, r.s, r.model.Params, r.eng, st)
}

// evaluate computes the eval loss and the exact match of greedy generation
// on held-out prompts, logs them and writes them to the metrics.
func (r *run) evaluate(res *Result, logf func(string, ...any)) error {
	rec := metrics.Record{Step: r.step, Event: "eval"} // the Writer fills in Time
	if len(r.ds.Eval) > 0 {
		loss, err := eval.Loss(r.be, r.s, r.model, r.ds.Eval)
		if err != nil {
			return err
		}
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			// The weights diverged in this step's update; the next train
			// step would fail the same way, so stop before saving them.
			return fmt.Errorf("step %d: eval loss is %v: %w; stopping without saving this step (the last checkpoint is kept); try a lower --lr", r.step, loss, ErrNonFinite)
		}
		res.EvalLoss = loss
		rec.EvalLoss = metrics.F(loss)
	}
	if n := min(r.cfg.EvalGenerate, len(r.ds.EvalRecords)); n > 0 {
		em, err := eval.ExactMatch(r.be, r.s, r.model, r.tok, r.ds.EvalRecords[:n])
		if err != nil {
			return err
		}
		res.ExactMatch = em
		rec.ExactMatch = metrics.F(em)
	}
	if rec.EvalLoss == nil && rec.ExactMatch == nil {
		return nil
	}
	args := []any{"step", r.step}
	if rec.EvalLoss != nil {
		args = append(args, "eval_loss", fmt.Sprintf("%.4f", *rec.EvalLoss))
	}
	if rec.ExactMatch != nil {
		args = append(args, "exact_match", fmt.Sprintf("%.3f", *rec.ExactMatch))
	}
	logf("eval", args...)
	return r.mw.Write(rec)
}

// lspFlags is the part of a resume's identity that only lsp mode has.
func lspFlags(mode engine.Mode, dense engine.DenseParams, d, r int) string {
	if mode != engine.LSP {
		return ""
	}
	return fmt.Sprintf(" --dense-params %s --d %d --r %d", dense, d, r)
}
