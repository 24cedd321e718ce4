// The step loop: the optimizer steps until --steps, Ctrl-C or StopAfter,
// with the periodic evals and checkpoints, the handling of a step whose
// loss is not finite (--on-nonfinite, --max-skips), and the end of the
// run (checkpoint, export, final eval).
//
// Limits: a non-finite gradient behind a finite loss cannot be skipped,
// only stopped at (docs/DESIGN.md, "The schedule"); Ctrl-C is looked at
// between steps and between an evaluation's batches, never inside a step,
// a checkpoint or the export.

package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// ErrNonFinite reports a NaN or infinite loss (or gradient norm) that
// stopped the run: --on-nonfinite stop, more than --max-skips skipped
// steps in a row, or a non-finite gradient, which cannot be skipped.
var ErrNonFinite = errors.New("non-finite loss")

// loop trains the remaining steps, then finishes: checkpoint, and unless
// interrupted the export, the final eval and the plot.
func (r *run) loop(ctx context.Context) (*Result, error) {
	res := &Result{Out: r.cfg.Out, EvalLoss: math.NaN(), ExactMatch: math.NaN(), ResumedAt: r.resumedAt, Total: r.cfg.Steps, Rendering: r.ds.Rendering,
		Checkpoint: r.checkpointPath(), Metrics: r.metricsPath()}
	if r.opts.Progress != nil && r.world.rank0() {
		r.report.showProgress(r.opts.Progress, r.cfg.Steps)
	}
	err := r.trainSteps(ctx, res)
	r.report.stepsDone()
	if err != nil {
		return res, err
	}
	return res, r.finish(ctx, res)
}

// trainSteps runs steps until --steps, a cancelled ctx or StopAfter, with
// the periodic evals and checkpoints, and fills in res's step counts and
// throughput.
func (r *run) trainSteps(ctx context.Context, res *Result) error {
	if r.opts.EvalAtStart && !r.cfg.Resume && r.step == 0 {
		// Stopped by Ctrl-C, it records nothing, and the loop stops
		// before the first step.
		if err := r.evaluate(ctx, res, "eval"); err != nil && !errors.Is(err, errEvalStopped) {
			return err
		}
	}
	first := r.step
	defer func() {
		res.Steps, res.StepsRun = r.step, r.step-first
		if r.times.Train > 0 {
			res.TokensPerSec = float64(r.runTokens) / r.times.Train.Seconds()
		}
	}()
	if r.step >= r.cfg.Steps {
		// Resumed from a finished run: its final eval is in the metrics
		// already, unless a signal stopped it (finish writes the
		// checkpoint before it); another would duplicate that step.
		// Rank 0's metrics say; the ranks agree on it.
		missing := r.report.mw != nil && r.report.mw.LastEval() != r.step && len(r.ds.Eval)+len(r.evals.recs) > 0
		missing, err := r.world.agree(r.step, missing)
		if err != nil {
			return err
		}
		if !missing {
			r.lastEval = r.step
		}
	}
	for r.step < r.cfg.Steps {
		stop, err := r.world.agree(r.step+1, ctx.Err() != nil || (r.opts.StopAfter > 0 && r.step >= r.opts.StopAfter))
		if err != nil {
			return err
		}
		if stop {
			res.Interrupted = true
			break
		}
		if err := r.oneStep(res); err != nil {
			return err
		}
		if err := r.periodic(ctx, res); err != nil {
			return err
		}
	}
	return nil
}

// oneStep runs the next optimizer step and records it. The step's time
// (its data, a projector check when one is due, the engine's step, and
// any attempts skipped before it) is what every tokens/s figure divides
// by: the step's own in the metrics, the sum over this process's steps in
// the progress display and the summary.
//
// An attempt whose loss is not finite updated nothing (the engine skips
// it on the device); with --on-nonfinite skip it is recorded as skipped
// and the step is attempted again with the next batch, up to --max-skips
// times in a row, and otherwise the run stops. The retries happen here,
// before the loop looks at Ctrl-C or StopAfter again, so a checkpoint
// always follows a step that was taken: it never holds the position of a
// skipped batch without the step after it, and a run resumed from it
// meets the same batches (and skips) again.
func (r *run) oneStep(res *Result) error {
	lr := r.sched.At(r.step + 1)
	t0, tok0 := time.Now(), r.tokens
	for inARow := 1; ; inARow++ {
		tokA := r.tokens
		loss, err := r.trainStep(lr)
		if err == nil && r.eng.Skipped() {
			r.tokens = tokA // the skipped batch's tokens were read, not trained on
			if err = r.skipStep(loss, lr, inARow); err == nil {
				continue
			}
		}
		dt := time.Since(t0)
		r.times.Train += dt
		r.runTokens += r.tokens - tok0
		if err != nil {
			return err
		}
		// The engine's flag and the host's sum agree (a float64 sum of
		// finite fp32 losses cannot overflow); check anyway.
		if err := checkFinite(r.step+1, "loss", loss); err != nil {
			return err
		}
		r.step++
		res.TrainLoss = loss
		res.Losses = append(res.Losses, loss)
		if err := r.recordStep(loss, lr, float64(r.tokens-tok0)/dt.Seconds(), float64(r.runTokens)/r.times.Train.Seconds()); err != nil {
			return err
		}
		if r.opts.AfterStep != nil {
			return r.opts.AfterStep(StepTimes{Step: r.step, Total: dt.Seconds(), Engine: r.meter.lastEngine, Check: r.meter.lastCheck,
				Tokens: r.tokens - tok0})
		}
		return nil
	}
}

// skipStep handles an attempt at the next step whose loss was not finite
// and which the engine skipped: it stops the run (--on-nonfinite stop, or
// the attempt is one more than --max-skips in a row), or logs a warning and
// records the skip in the metrics.
func (r *run) skipStep(loss, lr float64, inARow int) error {
	step := r.step + 1
	if r.cfg.OnNonFinite != SkipNonFinite {
		return checkFinite(step, "loss", loss)
	}
	if inARow > r.cfg.MaxSkips {
		return fmt.Errorf("step %d: loss is %v for the %d%s attempt in a row, after --max-skips %d skipped: %w; "+
			"stopping without saving this step (the last checkpoint is kept); try a lower --lr",
			step, loss, inARow, ordinal(inARow), r.cfg.MaxSkips, ErrNonFinite)
	}
	r.report.warnf("skipped a step whose loss is not finite: nothing was updated; the step is taken again with the next batch",
		"step", step, "loss", loss, "in_a_row", inARow, "max_skips", r.cfg.MaxSkips)
	rec := metrics.Record{Step: step, LR: metrics.F(lr), Event: metrics.SkippedStepEvent,
		Skipped: &metrics.SkippedStep{Loss: fmt.Sprint(loss), InARow: inARow}}
	return diskHint(r.report.write(rec))
}

// ordinal is the English suffix of n: 1st, 2nd, 3rd, 4th, 11th, 21st.
func ordinal(n int) string {
	if n%100 >= 11 && n%100 <= 13 {
		return "th"
	}
	switch n % 10 {
	case 1:
		return "st"
	case 2:
		return "nd"
	case 3:
		return "rd"
	}
	return "th"
}

// trainStep runs one optimizer step over GradAccum micro-batches (after a
// projector check when one is due) and returns the mean loss per target
// token; the engine says whether it skipped the step (a non-finite loss).
func (r *run) trainStep(lr float64) (float64, error) {
	r.meter.newStep()
	if r.eng.CheckDue() {
		if err := r.checkProjectors(); err != nil {
			return 0, err
		}
	}
	// Every rank reads the whole global batch (ranks x --grad-accum
	// micro-batches) and trains on its own share, so the data position
	// is the same on every rank.
	batches := make([]data.Batch, r.world.size()*r.cfg.GradAccum)
	targets := 0
	for i := range batches {
		r.loader.Next(&batches[i])
		targets += batches[i].NumTargets
		r.tokens += int64(batches[i].B * batches[i].T)
	}
	if targets == 0 {
		return 0, fmt.Errorf("step %d: no target tokens in the batch", r.step+1)
	}
	mine := batches
	if r.world.comm != nil {
		k := r.world.comm.Rank() * r.cfg.GradAccum
		mine = batches[k : k+r.cfg.GradAccum]
	}
	sent0 := r.world.sent()
	tr0, t0 := r.be.Traffic(), time.Now()
	sum, err := r.eng.Step(mine, lr) // with several ranks, summed over them
	if err != nil {
		return 0, err
	}
	if r.world.comm != nil {
		r.meter.sent(r.world.sent() - sent0)
	}
	tr1 := r.be.Traffic()
	r.meter.engineStep(time.Since(t0).Seconds(), tr1.D2H-tr0.D2H+tr1.H2D-tr0.H2D)
	return sum / float64(targets), nil
}

// recordStep writes the metrics of the step just done (with its own
// throughput, stepRate) and updates the progress display (with this
// process's, runRate). A finite loss can still come with non-finite
// gradients; the update has used them, so the run stops before anything
// of this step is saved. --on-nonfinite skip cannot help there: the
// gradients are found layer by layer, when deeper layers are updated
// already (docs/DESIGN.md, "The schedule").
func (r *run) recordStep(loss, lr, stepRate, runRate float64) error {
	norm, err := r.eng.GradNorm()
	if err != nil {
		return fmt.Errorf("step %d: gradient norm: %w", r.step, err)
	}
	if err := checkFinite(r.step, "gradient norm", norm); err != nil {
		if r.cfg.OnNonFinite == SkipNonFinite {
			err = fmt.Errorf("%w (--on-nonfinite skip skips a non-finite loss only: a non-finite gradient with a finite loss "+
				"shows layer by layer, after deeper layers were updated)", err)
		}
		return err
	}
	// Time is left 0 so the Writer fills it in, continuing across resumes.
	rec := metrics.Record{Step: r.step, TrainLoss: metrics.F(loss), TokensPerSec: metrics.F(stepRate),
		LR: metrics.F(lr), GradNorm: metrics.F(norm)}
	if r.world.comm != nil {
		rec.CommBytes = metrics.F(float64(r.meter.lastComm))
	}
	if err := r.report.write(rec); err != nil {
		return diskHint(err)
	}
	r.report.tail(time.Duration(float64(r.evalsFrom(r.step)) * r.evalSeconds() * float64(time.Second)))
	r.report.progress(r.step, loss, lr, runRate)
	return faults.Point("step", "")
}

// periodic evaluates, checkpoints and exports when --eval-every,
// --checkpoint-every and --export-every say so; the last step's are
// finish's. An evaluation stopped by Ctrl-C records nothing; the loop
// then stops before the next step, after the checkpoint that finish
// writes.
func (r *run) periodic(ctx context.Context, res *Result) error {
	if r.step >= r.cfg.Steps {
		return nil
	}
	if r.cfg.EvalEvery > 0 && r.step%r.cfg.EvalEvery == 0 {
		switch err := r.evaluate(ctx, res, "eval"); {
		case errors.Is(err, errEvalStopped):
			return nil
		case err != nil:
			return err
		}
		r.lastEval = r.step
	}
	if r.cfg.CheckpointEvery > 0 && r.step%r.cfg.CheckpointEvery == 0 {
		if err := r.saveCheckpoint(); err != nil {
			return err
		}
	}
	if r.cfg.ExportEvery > 0 && r.step%r.cfg.ExportEvery == 0 {
		return r.world.rank0Only(r.exportStep)
	}
	return nil
}

// finish ends the run: the checkpoint of the last step and, unless the
// run was interrupted, its export come first, so that nothing of the
// training waits on the final evaluation, which can be long (a large
// model on a CPU); then the final evaluation (unless the last step had
// one), and the loss plot. Ctrl-C or SIGTERM during the final evaluation
// stops it with the checkpoint and export kept: the run counts as
// interrupted, and a resume of it runs the final evaluation.
func (r *run) finish(ctx context.Context, res *Result) error {
	if err := r.saveCheckpoint(); err != nil {
		return err
	}
	if res.Interrupted {
		r.log.Info("interrupted: checkpoint saved; continue with --resume", "step", r.step, "checkpoint", res.Checkpoint)
		return r.world.rank0Only(func() error { return r.plot(res) })
	}
	if err := r.world.rank0Only(func() error { return r.export(res) }); err != nil {
		return err
	}
	if r.lastEval != r.step {
		switch err := r.evaluate(ctx, res, "final eval"); {
		case errors.Is(err, errEvalStopped):
			res.Interrupted, res.EvalInterrupted = true, true
			res.EvalLoss, res.ExactMatch = math.NaN(), math.NaN()
			r.log.Info("interrupted during the final evaluation: the checkpoint and the export of the last step are saved; "+
				"--resume runs the final evaluation", "step", r.step, "checkpoint", res.Checkpoint, "export", res.Export)
		case err != nil:
			return err
		default:
			r.lastEval = r.step
		}
	}
	return r.world.rank0Only(func() error { return r.plot(res) })
}

// checkFinite is nil when v, the step's what (a loss or a norm), is
// finite, and otherwise the error that stops the run without saving the
// step.
func checkFinite(step int, what string, v float64) error {
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		return nil
	}
	hint := "try a lower --lr"
	if what == "loss" {
		hint += ", or --on-nonfinite skip to skip such steps"
	}
	return fmt.Errorf("step %d: %s is %v: %w; stopping without saving this step (the last checkpoint is kept); %s",
		step, what, v, ErrNonFinite, hint)
}
