// Evaluation: the eval loss on the held-out set and the exact match of
// greedy generation on held-out prompts, logged and written to the
// metrics, with its progress shown and its cost bounded.
//
// What an evaluation reads is fixed at set-up (planEval), so every eval of
// a run scores the same rows: at most --eval-tokens held-out tokens for the
// loss, evenly spaced over the held-out set, and at most --eval-generate
// prompts whose response fits --eval-max-new tokens for exact match. A
// cancelled context (Ctrl-C, SIGTERM) stops an evaluation between two
// batches; it then records nothing (docs/DESIGN.md, "The end of a run").
//
// Limits: every rank evaluates (the same weights give the same figures),
// so that the ranks stay in step; a non-finite eval loss stops the run.
// The time an evaluation will take is estimated from the steps' throughput
// until one has been measured, and from the latest one after.

package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// errEvalStopped is what evaluate returns when the context stopped it
// between two batches: nothing of that evaluation was recorded.
var errEvalStopped = errors.New("evaluation stopped by the interrupt")

// evalPlan is what each evaluation of the run reads, and what the latest
// one took.
type evalPlan struct {
	loss []data.Example // the eval loss's rows
	recs []data.Record  // the prompts exact match scores
	// prompts are recs' tokens to generate from (a conversation's), nil
	// to encode their Prompt (data.Dataset.PromptTokens).
	prompts [][]int32
	// maxNew is the most tokens exact match generates for a prompt: the
	// longest response's and the stop; promptTokens are the tokens of
	// all its prompts.
	maxNew, promptTokens int
	// Seconds per loss batch and per group of B prompts generated, as
	// the latest evaluation measured them (0 before one).
	lossSec, genSec float64
}

// batches is the number of loss batches and of generation groups of b
// rows.
func (e *evalPlan) batches(b int) (loss, gen int) {
	return (len(e.loss) + b - 1) / b, (len(e.recs) + b - 1) / b
}

// planEval picks the rows each evaluation reads and says which, so that
// a user knows what the eval figures cover and how to widen them.
func (r *run) planEval() error {
	cfg := r.cfg
	loss := r.ds.Eval
	if cfg.EvalTokens > 0 {
		loss = spread(loss, max(1, cfg.EvalTokens/cfg.SeqLen))
	}
	var recs []data.Record
	var prompts [][]int32
	longer, maxNew, promptTokens := 0, 0, 0
	for i, rec := range r.ds.EvalRecords {
		if len(recs) == cfg.EvalGenerate {
			break
		}
		// The response's tokens and the stop token after them.
		if cfg.EvalMaxNew > 0 && len(r.tok.Encode(rec.Response))+1 > cfg.EvalMaxNew {
			longer++
			continue
		}
		recs = append(recs, rec)
		maxNew = max(maxNew, len(r.tok.Encode(rec.Response))+1)
		p := r.ds.PromptTokens(i, r.tok)
		promptTokens += len(p) - len(tokenizer.Prefix(r.tok))
		if r.ds.EvalPrompts != nil {
			prompts = append(prompts, p)
		}
	}
	r.evals = evalPlan{loss: loss, recs: recs, prompts: prompts, maxNew: maxNew, promptTokens: promptTokens}
	if len(r.ds.Eval) == 0 {
		return nil
	}
	args := []any{"loss_rows", len(loss), "of", len(r.ds.Eval), "eval_tokens", len(loss) * cfg.SeqLen}
	if len(loss) < len(r.ds.Eval) {
		args = append(args, "why", fmt.Sprintf("--eval-tokens %d caps the rows; --eval-tokens 0 reads them all", cfg.EvalTokens))
	}
	if len(r.ds.EvalRecords) > 0 {
		args = append(args, "exact_match_prompts", len(recs))
		if longer > 0 {
			args = append(args, "left_out", fmt.Sprintf("%d with a response longer than --eval-max-new %d tokens", longer, cfg.EvalMaxNew))
		}
	}
	r.log.Info("evaluation", args...)
	return nil
}

// spread returns n of xs, evenly spaced and in order (all of them when
// there are not more than n), so that a capped eval set covers the whole
// held-out split, not its start.
func spread[T any](xs []T, n int) []T {
	if len(xs) <= n {
		return xs
	}
	out := make([]T, n)
	for i := range out {
		out[i] = xs[i*len(xs)/n]
	}
	return out
}

// evaluate computes the eval loss and the exact match of greedy
// generation on the planned rows, showing its progress as label ("eval",
// "final eval"), logs them and writes them to the metrics. When ctx is
// cancelled it stops between two batches and returns errEvalStopped,
// having recorded nothing.
func (r *run) evaluate(ctx context.Context, res *Result, label string) error {
	t0 := time.Now()
	defer func() { r.times.Eval += time.Since(t0) }()
	rec := metrics.Record{Step: r.step, Event: "eval"} // the Writer fills in Time
	nLoss, nGen := r.evals.batches(r.cfg.Batch)
	lossSec, genSec := r.evalPace()
	after := time.Duration(float64(r.evalsFrom(r.step+1)) * r.evalSeconds() * float64(time.Second))
	if len(r.evals.loss) > 0 {
		start := time.Now()
		genLeft := time.Duration(float64(nGen) * genSec * float64(time.Second))
		w := r.evalWatch(ctx, label+": loss", time.Duration(float64(nLoss)*lossSec*float64(time.Second)), genLeft+after)
		loss, err := eval.Loss(r.be, r.s, r.model, r.evals.loss, w)
		if err != nil {
			return stopped(ctx, err)
		}
		r.evals.lossSec = time.Since(start).Seconds() / float64(nLoss)
		// Non-finite: the weights diverged in this step's update; the next
		// train step would fail the same way, so stop before saving them.
		if err := checkFinite(r.step, "eval loss", loss); err != nil {
			return err
		}
		res.EvalLoss = loss
		rec.EvalLoss = metrics.F(loss)
		rec.Perplexity = metrics.F(math.Exp(loss))
	}
	if len(r.evals.recs) > 0 {
		start := time.Now()
		w := r.evalWatch(ctx, label+": exact match", time.Duration(float64(nGen)*genSec*float64(time.Second)), after)
		em, err := eval.ExactMatchPrompts(r.be, r.s, r.model, r.tok, r.evals.recs, r.evals.prompts, w)
		if err != nil {
			return stopped(ctx, err)
		}
		r.evals.genSec = time.Since(start).Seconds() / float64(nGen)
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
		args = append(args, "eval_loss", fmt.Sprintf("%.4f", *rec.EvalLoss), "perplexity", fmt.Sprintf("%.4g", *rec.Perplexity))
	}
	if rec.ExactMatch != nil {
		args = append(args, "exact_match", fmt.Sprintf("%.3f", *rec.ExactMatch), "prompts", len(r.evals.recs))
	}
	r.report.logf(label, args...)
	return diskHint(r.report.write(rec))
}

// stopped is errEvalStopped when ctx was cancelled (err is then its
// error, from between two batches), and err otherwise.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return errEvalStopped
	}
	return err
}

// evalWatch follows one part of an evaluation (the loss, or generation)
// on the progress display: whole is what the part is expected to take
// until its first batch is done, after what follows it (the rest of this
// evaluation and the evaluations after; the display adds the steps).
func (r *run) evalWatch(ctx context.Context, label string, whole, after time.Duration) eval.Watch {
	return eval.Watch{Ctx: ctx, Progress: func(done, total int) {
		r.report.task(label, done, total, whole, after)
		if done > 0 {
			faults.Point("eval-batch", "") // a test's interrupt (never an error)
		}
	}}
}

// evalPace is the seconds a loss batch and a group of B prompts take: as
// the latest evaluation measured them, or before one, estimated from the
// steps' throughput (0 before a step either).
func (r *run) evalPace() (lossSec, genSec float64) {
	lossSec, genSec = r.evals.lossSec, r.evals.genSec
	// A forward pass is about a third of a step's forward and backward
	// per token.
	var fwd float64
	if r.runTokens > 0 {
		fwd = float64(r.cfg.Batch*r.cfg.SeqLen) / (3 * float64(r.runTokens) / r.times.Train.Seconds())
	}
	if lossSec == 0 {
		lossSec = fwd
	}
	if genSec == 0 && len(r.evals.recs) > 0 {
		genSec = fwd * r.generationForwards()
	}
	return lossSec, genSec
}

// decodeCost is what one token of cached decoding costs in batched
// forward tokens: a decoded token reads every weight for itself, where a
// batch of B x T shares that read. Measured on gpt2 (fp32, two cores,
// --batch 2 --seq-len 512): 0.12 s a decoded token against 3.6 ms a
// token of the batched forward. A rough figure; the first evaluation
// replaces it with what it measures.
const decodeCost = 32

// generationForwards estimates a group of B prompts' generation in
// forward passes of the batch: without the KV cache (bf16) one per new
// token; with it (fp32) each prompt's tokens and new tokens decoded one
// at a time at decodeCost.
func (r *run) generationForwards() float64 {
	_, cached := r.model.Model.(model.Cached)
	if !cached || r.model.Buffers().Logits.DType != backend.F32 {
		return float64(r.evals.maxNew)
	}
	perPrompt := float64(r.evals.promptTokens)/float64(len(r.evals.recs)) + float64(r.evals.maxNew)
	return float64(r.cfg.Batch) * perPrompt * decodeCost / float64(r.cfg.Batch*r.cfg.SeqLen)
}

// evalSeconds is what one evaluation is expected to take (evalPace).
func (r *run) evalSeconds() float64 {
	nLoss, nGen := r.evals.batches(r.cfg.Batch)
	lossSec, genSec := r.evalPace()
	return float64(nLoss)*lossSec + float64(nGen)*genSec
}

// evalsFrom is the number of evaluations the run still has at steps from
// step on: the periodic ones (--eval-every) before the last step, and the
// final one unless it is done.
func (r *run) evalsFrom(step int) int {
	if step > r.cfg.Steps || r.lastEval == r.cfg.Steps {
		return 0
	}
	n := 1 // the final one
	if e := r.cfg.EvalEvery; e > 0 && step < r.cfg.Steps {
		n += (r.cfg.Steps-1)/e - (max(step, 1)-1)/e
	}
	return n
}
