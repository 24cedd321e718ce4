// Evaluation: the eval loss on the held-out set and the exact match of
// greedy generation on held-out prompts, logged and written to the
// metrics.
//
// Limits: every rank evaluates (the same weights give the same figures),
// so that the ranks stay in step; a non-finite eval loss stops the run.

package train

import (
	"fmt"
	"time"

	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// evaluate computes the eval loss and the exact match of greedy generation
// on held-out prompts, logs them and writes them to the metrics.
func (r *run) evaluate(res *Result) error {
	t0 := time.Now()
	defer func() { r.times.Eval += time.Since(t0) }()
	rec := metrics.Record{Step: r.step, Event: "eval"} // the Writer fills in Time
	if len(r.ds.Eval) > 0 {
		loss, err := eval.Loss(r.be, r.s, r.model, r.ds.Eval)
		if err != nil {
			return err
		}
		// Non-finite: the weights diverged in this step's update; the next
		// train step would fail the same way, so stop before saving them.
		if err := checkFinite(r.step, "eval loss", loss); err != nil {
			return err
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
	if err := faults.Point("eval", ""); err != nil {
		return err
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
	r.report.logf("eval", args...)
	return diskHint(r.report.write(rec))
}
