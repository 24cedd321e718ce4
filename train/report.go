// What the run reports as it goes: metrics.jsonl (rank 0's), the progress
// display, and log lines that go through the display when there is one so
// that the bar is not garbled.
//
// Limits: ranks other than 0 write no metrics and show no progress; the
// metrics are cut back to the resumed step on --resume.

package train

import (
	"fmt"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// openMetrics opens metrics.jsonl, cut back to the resumed step.
func (r *run) openMetrics() error {
	if r.world.rank0() {
		var err error
		if r.mw, err = metrics.Create(r.metricsPath(), r.resumedAt); err != nil {
			return diskHint(err)
		}
	}
	r.log.Info("model", append(append([]any{"model", r.cfg.Model, "family", r.mc.Family()}, r.mc.Describe()...),
		"dtype", r.cfg.DType, "device", r.be.Name())...)
	if r.cfg.Mode == engine.LSP {
		projectors := "random, kept for the whole run (--fit learns them)"
		if r.cfg.Fit {
			projectors = fmt.Sprintf("fitted: checked every %d steps on %d calibration rows", r.cfg.CheckEvery, r.cfg.CalibSamples)
		}
		r.log.Info("lsp", "d", r.cfg.D, "r", r.cfg.R, "projectors", projectors, "dense_params", r.cfg.denseParams(r.fromCheckpoint))
	}
	return nil
}

func (r *run) metricsPath() string { return filepath.Join(r.cfg.Out, "metrics.jsonl") }

// writeMetrics writes a metrics record on rank 0; the others have no
// metrics file.
func (r *run) writeMetrics(rec metrics.Record) error {
	if r.mw == nil {
		return nil
	}
	return r.mw.Write(rec)
}

// logf logs through the progress display when there is one, so the bar
// is not garbled.
func (r *run) logf(msg string, args ...any) {
	if r.prog != nil {
		r.prog.Log(msg, args...)
	} else {
		r.log.Info(msg, args...)
	}
}

// warnf is logf at the warning level.
func (r *run) warnf(msg string, args ...any) {
	if r.prog != nil {
		r.prog.Warn(msg, args...)
	} else {
		r.log.Warn(msg, args...)
	}
}
