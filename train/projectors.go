// lsp mode's part of the run: the matrices whose projector size or
// density is capped below --d or --r (logged at set-up), and the periodic
// projector check, whose every matrix goes to the metrics.
//
// Limits: the calibration rows of a check are drawn from the training
// set, never the eval set; the check's own cadence and decisions are the
// engine's.

package train

import (
	"fmt"
	"time"

	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// logLSPCaps says which matrices get a smaller d or r than asked for (lsp).
func (r *run) logLSPCaps() error {
	if r.cfg.Mode != engine.LSP {
		return nil
	}
	for _, c := range lspCaps(r.mc, r.cfg.D, r.cfg.R) {
		r.log.Info("lsp: d and r capped for this matrix", "matrix", c.matrix, "shape", fmt.Sprintf("%dx%d", c.m, c.n),
			"d", c.d, "r", c.r, "requested_d", r.cfg.D, "requested_r", r.cfg.R)
	}
	return nil
}

// lspCap is one matrix whose projector size or density lsp caps below the
// requested --d or --r.
type lspCap struct {
	matrix string
	m, n   int // the matrix's shape
	d, r   int // what the projectors get
}

// lspCaps lists the matrices of mc whose d or r are capped.
func lspCaps(mc model.Spec, d, r int) []lspCap {
	var caps []lspCap
	for _, mt := range mc.Matrices() {
		if cd := lsp.CapD(d, mt.M, mt.N); cd < d || lsp.CapR(r, cd) < r {
			caps = append(caps, lspCap{matrix: mt.Name, m: mt.M, n: mt.N, d: cd, r: lsp.CapR(r, cd)})
		}
	}
	return caps
}

// checkProjectors runs the lsp projector check and writes every matrix's
// result to the metrics; one log line counts them, fits that missed
// --alpha included.
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
	r.meter.check(time.Since(t0).Seconds())
	if err != nil {
		return err
	}
	// One line per check, not per matrix: a fit that misses --alpha or is
	// rejected by the held-out data is the normal case on gradients whose
	// directions move fast, and metrics.jsonl has every matrix.
	missed, accepted, rejected, rewarmed := 0, 0, 0, 0
	for _, p := range reps {
		missed += count(!p.Reached)
		accepted += count(p.Resampled)
		rejected += count(p.Rejected)
		rewarmed += count(p.Rewarm)
		rec := metrics.Record{Step: r.step, Event: metrics.ProjectorCheckEvent, Projector: &metrics.ProjectorCheck{
			Matrix: p.Matrix, RatioBefore: p.RatioBefore, RatioAfter: p.RatioAfter, Iters: p.Iters,
			Resampled: p.Resampled, Reached: p.Reached, Change: p.Change, Rewarm: p.Rewarm, Seconds: p.Seconds,
			Rejected: p.Rejected, CaptureBefore: p.CaptureBefore, CaptureAfter: p.CaptureAfter}}
		if err := r.report.write(rec); err != nil {
			return err
		}
	}
	r.log.Info("projector check", "step", r.step, "matrices", len(reps), "refitted", accepted, "rejected", rejected,
		"rewarmed", rewarmed, "missed_alpha", missed,
		"seconds", fmt.Sprintf("%.2f", time.Since(t0).Seconds()))
	return nil
}

// count is 1 for true.
func count(b bool) int {
	if b {
		return 1
	}
	return 0
}
