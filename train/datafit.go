// datafit.go: what the run says when --data's examples do not all fit
// --seq-len (a setup step of loadData's). Examples are dropped or cut
// to fit, never packed, so a length that suits the data matters: the run
// warns with the share dropped and the --seq-len that keeps most of the
// examples, and refuses to train on a sliver of them unless --truncate
// says that cutting them is meant. The all-dropped error (lengthHint)
// suggests the same --seq-len, so following either message gives a run
// that keeps the same examples.

package train

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/model"
)

const (
	// keepShare is the share of the examples a suggested --seq-len keeps
	// whole: all of them would let one outlier set the length (and the
	// memory) of every row.
	keepShare = 0.9
	// minKeptShare is the share of examples below which the run refuses
	// to train without --truncate: what is left is not the data set the
	// user named.
	minKeptShare = 0.1
	// smallEval is the eval-set size below which the warning says that
	// eval loss and exact match rest on too few examples to compare.
	smallEval = 10
)

// checkDataFit warns when examples of --data were dropped or cut for
// --seq-len, saying the share and the --seq-len that keeps keepShare of
// them, and fails when fewer than minKeptShare are left without
// --truncate.
func (r *run) checkDataFit() error {
	ds, cfg := r.ds, r.cfg
	total := len(ds.Lengths)
	if total == 0 || ds.Dropped+ds.Truncated == 0 {
		return nil
	}
	kept := total - ds.Dropped
	what := fmt.Sprintf("%d of %d examples (%s) of --data %s are longer than --seq-len %d + 1 tokens",
		ds.Dropped+ds.Truncated, total, percent(float64(ds.Dropped+ds.Truncated)/float64(total)), cfg.Data, cfg.SeqLen)
	if !cfg.Truncate && float64(kept) < minKeptShare*float64(total) {
		return flagErr("seq-len", "%s: only %d (%s) would be trained and evaluated on; %s; or --truncate cuts the long ones to fit",
			what, kept, percent(float64(kept)/float64(total)), r.fitAdvice(ds.Lengths))
	}
	how := "dropped"
	if cfg.Truncate {
		how = fmt.Sprintf("%d cut to fit", ds.Truncated)
		if ds.Dropped > 0 {
			how += fmt.Sprintf(", %d dropped (their prompts alone are too long)", ds.Dropped)
		}
	}
	msg := fmt.Sprintf("%s and %s; %s", what, how, r.fitAdvice(ds.Lengths))
	if (cfg.EvalFraction > 0 || cfg.EvalData != "") && len(ds.Eval) < smallEval {
		msg += fmt.Sprintf("; the eval set holds only %d example(s), too few for eval loss and exact match to mean much", len(ds.Eval))
	}
	r.log.Warn(msg)
	return nil
}

// fitAdvice names the --seq-len that keeps keepShare of examples of
// these token counts whole, capped at the model's context; when even the
// context keeps fewer, it says how many and names a preset of the
// model's family whose context holds them, if there is one.
func (r *run) fitAdvice(lengths []int) string {
	ctx := r.mc.MaxSeqLen()
	need := data.SeqLenKeeping(lengths, keepShare)
	if need <= ctx {
		return fmt.Sprintf("--seq-len %d keeps %s of them", need, percent(keepShare))
	}
	s := fmt.Sprintf("keeping %s of them takes --seq-len %d, longer than the model's context of %d, which keeps %s (--seq-len %d)",
		percent(keepShare), need, ctx, percent(data.ShareKept(lengths, ctx)), ctx)
	switch name, spec := longerPreset(r.mc, need); {
	case name != "" && spec.MaxSeqLen() >= need:
		s += fmt.Sprintf("; --model %s (a context of %d tokens) with --seq-len %d keeps at least %s", name, spec.MaxSeqLen(), need, percent(keepShare))
	case name != "":
		s += fmt.Sprintf("; --model %s, the longest context of its family (%d tokens), keeps at least %s with --seq-len %d",
			name, spec.MaxSeqLen(), percent(data.ShareKept(lengths, spec.MaxSeqLen())), spec.MaxSeqLen())
	}
	return s
}

// longerPreset returns the smallest preset of mc's family whose context
// holds need tokens, else the one with the longest context if that is
// longer than mc's, else "". Every preset's tokenizer takes at most a
// token per byte, and tiny's takes exactly one, so a context of need
// tokens is enough for any of them.
func longerPreset(mc model.Spec, need int) (string, model.Spec) {
	var best, longest string
	var bestSpec, longestSpec model.Spec
	if fam, err := catalog.Lookup(mc.Family()); err == nil {
		for _, name := range fam.Presets() {
			c, err := fam.Preset(name)
			if err != nil {
				continue
			}
			if c.MaxSeqLen() >= need && (best == "" || c.NumParams() < bestSpec.NumParams()) {
				best, bestSpec = name, c
			}
			if c.MaxSeqLen() > mc.MaxSeqLen() && (longest == "" || c.MaxSeqLen() > longestSpec.MaxSeqLen() ||
				c.MaxSeqLen() == longestSpec.MaxSeqLen() && c.NumParams() < longestSpec.NumParams()) {
				longest, longestSpec = name, c
			}
		}
	}
	if best != "" {
		return best, bestSpec
	}
	return longest, longestSpec
}

// percent writes a share as a percentage, "90%" or "4.3%".
func percent(share float64) string {
	if p := 100 * share; p == float64(int(p)) {
		return fmt.Sprintf("%d%%", int(p))
	}
	return fmt.Sprintf("%.1f%%", 100*share)
}
