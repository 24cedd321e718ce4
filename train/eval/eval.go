// Package eval measures and uses a trained model: the mean loss on held-out
// examples, greedy exact match on held-out prompts, text generation with
// greedy, temperature, top-k, nucleus sampling and the repetition
// penalty, with a KV cache (kvgen.go) or without (generate.go), and the
// sample command's job (load a model, continue a prompt).
//
// Limits: the model runs on one backend stream; cached generation runs
// one prompt at a time.
package eval

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Model is a model allocated on a backend for batches of B x T, with the
// spec it was built from (its vocabulary size, for generation).
type Model struct {
	model.Model
	Spec model.Spec
	B, T int
}

// batchLoss uploads a batch, runs the forward pass and the loss (no
// backward), and returns the sum of the batch's per-token losses.
func batchLoss(be backend.Backend, s backend.Stream, m Model, b data.Batch) (float64, error) {
	buf := m.Buffers()
	if err := model.UploadBatch(be, s, buf, b.T, b.Inputs, b.Targets, b.Positions); err != nil {
		return 0, err
	}
	if err := m.Forward(s); err != nil {
		return 0, err
	}
	if err := m.CrossEntropy(s, 0); err != nil {
		return 0, err
	}
	losses, err := backend.Download(be, s, buf.Losses)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range losses {
		sum += float64(l)
	}
	return sum, nil
}

// Watch lets the caller of a long evaluation follow it and stop it.
// The zero Watch does neither.
type Watch struct {
	// Ctx, when cancelled, stops the evaluation between two batches with
	// its error.
	Ctx context.Context
	// Progress, when set, is called before the first batch and after each
	// one with the batches done and their number.
	Progress func(done, total int)
}

// next reports done of total batches and says whether to go on: the
// context's error when it is cancelled.
func (w Watch) next(done, total int) error {
	if w.Progress != nil {
		w.Progress(done, total)
	}
	if w.Ctx != nil && done < total {
		return w.Ctx.Err()
	}
	return nil
}

// Loss is the mean loss per target token over examples (NaN when they
// have no target), a batch of m.B x m.T at a time.
func Loss(be backend.Backend, s backend.Stream, m Model, examples []data.Example, w Watch) (float64, error) {
	var sum float64
	n := 0
	batches := data.EvalBatches(examples, m.B, m.T)
	for i, b := range batches {
		if err := w.next(i, len(batches)); err != nil {
			return 0, err
		}
		l, err := batchLoss(be, s, m, b)
		if err != nil {
			return 0, err
		}
		sum += l
		n += b.NumTargets
	}
	w.next(len(batches), len(batches))
	if n == 0 {
		return math.NaN(), nil
	}
	return sum / float64(n), nil
}

// ExactMatch is the share of records whose greedy continuation of the
// prompt, up to a stop id (tokenizer.StopIDs), equals the response
// exactly. It generates up to the longest response's tokens and the stop,
// m.B prompts at a time (w sees each group). An fp32 model generates with
// its KV cache, a bf16 one without (see below).
func ExactMatch(be backend.Backend, s backend.Stream, m Model, tok tokenizer.Tokenizer, recs []data.Record, w Watch) (float64, error) {
	return ExactMatchPrompts(be, s, m, tok, recs, nil, w)
}

// ExactMatchPrompts is ExactMatch generating record i from prompts[i]
// (its tokens, Prefix included: a conversation's, data.Dataset.EvalPrompts)
// instead of Prefix ++ Encode(Prompt); nil prompts encode every Prompt.
func ExactMatchPrompts(be backend.Backend, s backend.Stream, m Model, tok tokenizer.Tokenizer, recs []data.Record, prompts [][]int32, w Watch) (float64, error) {
	if prompts != nil && len(prompts) != len(recs) {
		return 0, fmt.Errorf("eval: %d prompts for %d records", len(prompts), len(recs))
	}
	given := prompts
	prompts = make([][]int32, len(recs))
	maxNew := 1
	for i, rec := range recs {
		if given != nil {
			prompts[i] = slices.Clone(given[i])
		} else {
			prompts[i] = append(tokenizer.Prefix(tok), tok.Encode(rec.Prompt)...)
		}
		maxNew = max(maxNew, len(tok.Encode(rec.Response))+1)
	}
	// The KV cache gives the uncached path's greedy tokens in fp32 (the
	// logits agree to float rounding); in bf16 they agree to bf16 rounding
	// only, where a near tie could flip a token, so the score keeps the
	// path it has always had there.
	gen := GenerateCached
	if m.Buffers().Logits.DType != backend.F32 {
		gen = Generate
	}
	outs := make([][]int32, 0, len(prompts))
	groups := (len(prompts) + m.B - 1) / m.B
	for g := range groups {
		if err := w.next(g, groups); err != nil {
			return 0, err
		}
		o, err := gen(be, s, m, prompts[g*m.B:min((g+1)*m.B, len(prompts))], maxNew, tokenizer.StopIDs(tok), Sampler{})
		if err != nil {
			return 0, err
		}
		outs = append(outs, o...)
	}
	w.next(groups, groups)
	hits := 0
	for i, o := range outs {
		if tok.Decode(o) == recs[i].Response {
			hits++
		}
	}
	return float64(hits) / float64(len(recs)), nil
}
