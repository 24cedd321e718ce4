// lsp mode's part of the run: the d and r each matrix gets, capped by
// its sides (logged at set-up), and the periodic
// projector check, whose every matrix goes to the metrics.
//
// Limits: the calibration rows of a check are drawn from the training
// set, never the eval set; the check's own cadence and decisions are the
// engine's.

package train

import (
	"fmt"
	"strings"
	"time"

	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// logLSPCaps logs the d and r every block matrix really gets (lsp), one
// entry per distinct shape, and which are capped at the matrix's side,
// where the subspace is the whole side and nothing is compressed: a
// --d above a small model's width asks for more than it can give.
func (r *run) logLSPCaps() error {
	if r.cfg.Mode != engine.LSP {
		return nil
	}
	mats, share, err := lspProjectors(r.mc, r.cfg.D, r.cfg.R, r.cfg.Projector)
	if err != nil {
		return err
	}
	r.log.Info("lsp projectors", "matrices", mats, "s_of_gradient", fmt.Sprintf("%.1f%%", 100*share))
	return nil
}

// lspProjectors describes the projectors of mc's block matrices for the
// requested d and r and kind (lsp.Dims: r = d for dense kinds), one entry
// per distinct shape, d and r,
// e.g. "128x384 d=32 r=16 (qkv, x4)", and the share of the dense
// gradient's numbers that S (d x d per matrix) holds, over all blocks.
func lspProjectors(mc model.Spec, d, r int, kind lsp.Kind) (string, float64, error) {
	x, err := model.NewIndex(mc)
	if err != nil {
		return "", 0, err
	}
	ds, rs := lsp.Dims(x, lsp.Config{D: d, R: r, Projector: kind})
	type shape struct{ m, n, d, r int }
	var order []shape
	names := map[shape][]string{}
	var sNums, gNums float64
	for k, mt := range x.Mats {
		s := shape{mt.M, mt.N, ds[k], rs[k]}
		if names[s] == nil {
			order = append(order, s)
		}
		names[s] = append(names[s], mt.Name)
		sNums += float64(ds[k] * ds[k])
		gNums += float64(mt.M * mt.N)
	}
	var parts []string
	for _, s := range order {
		part := fmt.Sprintf("%dx%d d=%d r=%d (%s, x%d)", s.m, s.n, s.d, s.r, strings.Join(names[s], ", "), len(names[s])*mc.Layers())
		if d > 0 && s.d < d && s.d == min(s.m, s.n) {
			part += fmt.Sprintf(" capped at the matrix's side from --d %d: the subspace is the whole side, which compresses nothing", d)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; "), sNums / gNums, nil
}

// checkProjectors runs the lsp projector check and writes every matrix's
// result to the metrics; one log line counts them, fits that missed
// --alpha included.
func (r *run) checkProjectors() error {
	// The calibration rows come from their own shuffle of the training
	// rows, keyed by the step, so the checks neither move the training
	// data's position nor depend on where a run was resumed.
	calib, err := data.NewLoader(r.ds.Train, r.cfg.Batch, r.cfg.SeqLen, r.cfg.Seed^0xca1b^uint64(r.step)*0x9e3779b97f4a7c15)
	if err == nil {
		calib.SetPack(r.cfg.Pack) // the rows the steps train on
	}
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
	if r.cfg.Projector == lsp.KindSVD {
		// Nothing is fitted or accepted: the singular vectors replace
		// the projectors (but where a gradient was zero).
		r.log.Info("projector check", "step", r.step, "matrices", len(reps), "svd_refreshed", accepted,
			"seconds", fmt.Sprintf("%.2f", time.Since(t0).Seconds()))
		return nil
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
