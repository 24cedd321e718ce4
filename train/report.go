// What the run reports as it goes: metrics.jsonl and the same scalars as
// a TensorBoard events file in tb/ (rank 0's), the progress display, and
// log lines that go through the display when there is one so that the
// bar is not garbled.
//
// Limits: ranks other than 0 write no metrics and show no progress; the
// metrics are cut back to the resumed step on --resume.

package train

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// reporter is where the run's records go as the steps go: rank 0's
// metrics.jsonl, the progress display, and the log, which goes through
// the display while there is one.
type reporter struct {
	log  *slog.Logger
	mw   *metrics.Writer   // nil on ranks other than 0
	prog *metrics.Progress // nil without a display (Options.Progress, rank 0)
}

// openMetrics opens metrics.jsonl, cut back to the resumed step.
func (r *run) openMetrics() error {
	if r.world.rank0() {
		var err error
		if r.report.mw, err = metrics.Create(r.metricsPath(), r.resumedAt); err != nil {
			return diskHint(err)
		}
		// The same scalars for `tensorboard --logdir <out>/tb`.
		if err := r.report.mw.TensorBoard(filepath.Join(r.cfg.Out, "tb"), r.resumedAt); err != nil {
			return diskHint(err)
		}
	}
	r.log.Info("model", append(append([]any{"model", r.cfg.Model, "family", r.mc.Family()}, r.mc.Describe()...),
		"dtype", r.cfg.DType, "device", r.be.Name())...)
	if r.cfg.Mode == engine.LSP {
		projectors := "random, kept for the whole run (--fit learns them)"
		switch {
		case r.cfg.Projector == lsp.KindGaussian:
			projectors = "gaussian (dense), kept for the whole run"
		case r.cfg.Projector == lsp.KindSVD:
			projectors = fmt.Sprintf("svd (dense): gaussian until the first check, then the calibration gradient's top singular vectors, refreshed every %d steps on %d calibration rows",
				r.cfg.CheckEvery, r.cfg.CalibSamples)
		case r.cfg.Fit:
			projectors = fmt.Sprintf("fitted: checked every %d steps on %d calibration rows", r.cfg.CheckEvery, r.cfg.CalibSamples)
		}
		d := fmt.Sprint(r.cfg.D) // as asked; each matrix's is on the "lsp projectors" line
		if r.cfg.D == 0 {
			d = "auto (a quarter of each matrix's shorter side, at most 512)"
		}
		r.log.Info("lsp", "d", d, "r", r.cfg.R, "projectors", projectors, "dense_params", r.cfg.denseParams(r.fromCheckpoint))
	}
	return nil
}

// metricsPath is where rank 0 writes the metrics.
func (r *run) metricsPath() string { return filepath.Join(r.cfg.Out, "metrics.jsonl") }

// showProgress starts the progress display of a run of steps on out.
func (p *reporter) showProgress(out *os.File, steps int) {
	p.prog = metrics.NewProgress(out, steps, p.log)
}

// progress shows the step just recorded, with its learning rate and this
// process's throughput.
func (p *reporter) progress(step int, loss, lr, rate float64) {
	if p.prog != nil {
		p.prog.Update(step, loss, lr, rate)
	}
}

// tail sets the time the progress display's ETA adds for the
// evaluations still to come.
func (p *reporter) tail(d time.Duration) {
	if p.prog != nil {
		p.prog.SetTail(d)
	}
}

// task shows done of total batches of an evaluation's part (label) on the
// progress display, or in the log without one, with its ETA (whole: the
// part's expected time before a batch is done; after: what follows it).
func (p *reporter) task(label string, done, total int, whole, after time.Duration) {
	if p.prog != nil {
		p.prog.Task(label, done, total, whole, after)
		return
	}
	if done == 0 {
		p.log.Info(label, "batches", total)
	}
}

// stepsDone ends the progress bar; later lines still go through the
// display.
func (p *reporter) stepsDone() {
	if p.prog != nil {
		p.prog.Done()
	}
}

// write writes a metrics record on rank 0; the others have no metrics
// file.
func (p *reporter) write(rec metrics.Record) error {
	if p.mw == nil {
		return nil
	}
	return p.mw.Write(rec)
}

// logf logs through the progress display when there is one, so the bar
// is not garbled.
func (p *reporter) logf(msg string, args ...any) {
	if p.prog != nil {
		p.prog.Log(msg, args...)
	} else {
		p.log.Info(msg, args...)
	}
}

// warnf is logf at the warning level.
func (p *reporter) warnf(msg string, args ...any) {
	if p.prog != nil {
		p.prog.Warn(msg, args...)
	} else {
		p.log.Warn(msg, args...)
	}
}

func (p *reporter) close() {
	if p.mw != nil {
		p.mw.Close()
	}
}
