// The compare command: native, zero and lsp fine-tuning side by side in one
// table (train/compare), with the table on stdout and one log line per
// finished run on stderr.

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/compare"
)

// bindCompareFlags binds the flags of the compare command to c.
func bindCompareFlags(fs *flag.FlagSet, c *compare.Config) {
	fs.StringVar(&c.Out, "out", c.Out, "output `DIR` (pretrain/, one directory per run, compare.png, compare.md, compare.json)")
	fs.StringVar(&c.Model, "model", c.Model, "the `PRESET` pretrained from scratch and fine-tuned in every row, of any family (e.g. tiny, llama-tiny)")
	fs.IntVar(&c.Steps, "steps", c.Steps, "fine-tuning steps of every row")
	fs.IntVar(&c.PretrainSteps, "pretrain-steps", c.PretrainSteps, "native pretraining steps of --model (reused when an identical earlier compare left them)")
	fs.StringVar(&c.Task, "task", c.Task, "fine-tuning `DATA`: builtin:TASK[:N] (tasks: reverse, sort, add, copy) or a data file (e.g. Alpaca-style JSON), not the --pretrain-task")
	fs.StringVar(&c.PretrainTask, "pretrain-task", c.PretrainTask, "pretraining `DATA`: builtin:TASK[:N] or a data file (e.g. a text corpus)")
	fs.IntVar(&c.D, "d", c.D, "lsp: projected size d, at most min(m, n)/4 of the preset's matrices (tiny: 32, llama-tiny: 16)")
	fs.IntVar(&c.R, "r", c.R, "lsp: non-zeros per projector row, at most d/4")
	fs.Var((*byteSize)(&c.LinkBandwidth), "link-bandwidth", "bytes/s charged per device-host copy on the CPU backend, e.g. 100MB (0: free)")
	fs.IntVar(&c.TimingSteps, "timing-steps", c.TimingSteps, "steps of each row's sequential and pipelined timing run")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "steps between evals of the fine-tuning (plus one before the first step)")
	fs.IntVar(&c.CheckEvery, "check-every", c.CheckEvery, "steps between the lsp rows' projector checks, svd's refreshes and galore's")
	fs.IntVar(&c.EvalGenerate, "eval-generate", c.EvalGenerate, "held-out prompts scored by greedy exact match after the last step (0: none)")
	fs.IntVar(&c.Threads, "threads", c.Threads, "compute threads (0: all cores)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (initialisation, data order, split, projectors) of the pretraining and of the first fine-tuning run of each row")
	fs.IntVar(&c.Seeds, "seeds", c.Seeds, "fine-tuning runs per row, with seeds --seed, --seed+1, ...; the table gives the mean and standard deviation")
	fs.StringVar(&c.Rows, "rows", c.Rows, "comma-separated `ROWS` of the table: "+strings.Join(compare.RowNames(), ", ")+" (lsp-resample: fresh random projectors at every check)")
	fs.StringVar(&c.LRs, "lrs", c.LRs, "comma-separated peak learning `RATES`: each row runs its first seed at each and keeps the one with the lowest held-out loss (one rate: every row's)")
	fs.IntVar(&c.LoRAR, "lora-r", c.LoRAR, "lora row: the adapters' rank r")
	fs.Var(&c.DType, "dtype", "storage `TYPE` of the fine-tuning rows' weights and activations: fp32 or bf16 (the pretraining is fp32)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "rows per batch of every run")
	fs.IntVar(&c.SeqLen, "seq-len", c.SeqLen, "tokens per row of every run")
	fs.BoolVar(&c.Truncate, "truncate", c.Truncate, "cut records longer than --seq-len instead of dropping them")
	fs.Var(&c.Refit, "refit", "lsp rows: `HOW` a check makes new projectors (sum, split or random; default: lsp-train's)")
	fs.Var(&c.Accept, "accept", "lsp rows: `WHAT` decides whether new projectors replace the old (heldout or fit; default: lsp-train's)")
	fs.Var(&c.Rewarm, "rewarm", "lsp rows: `WHEN` a refitted matrix's learning rate is re-warmed (measured, change or off; default: lsp-train's)")
	fs.BoolVar(&c.CheckAtStart, "check-at-start", c.CheckAtStart, "lsp rows: a projector check before step 1 too (by default the first is after --check-every steps)")
	fs.BoolVar(&c.ShareLayers, "share-layers", c.ShareLayers, "lsp rows: one projector pair per matrix kind, fitted on every layer")
	fs.IntVar(&c.CalibSamples, "calib-samples", c.CalibSamples, "lsp rows: rows of the calibration batches of a projector check")
	fs.BoolVar(&c.NoGain, "no-gain", c.NoGain, "lsp rows: apply the update without the projectors' per-column gains")
	fs.Float64Var(&c.Ortho, "proj-ortho", c.Ortho, "lsp rows: weight of the projector fit's penalty on non-orthogonal columns")
}

// compareFlags is the compare command's flag set, bound to the
// configuration it returns, which holds compare's defaults until parsed.
func compareFlags() (*flag.FlagSet, *compare.Config) {
	fs := flag.NewFlagSet("lsp-train compare", flag.ContinueOnError)
	c := compare.Defaults()
	bindCompareFlags(fs, &c)
	return fs, &c
}

// newCompareFlags is the compare command's flag set with its defaults.
func newCompareFlags() *flag.FlagSet {
	fs, _ := compareFlags()
	return fs
}

func compareCmd(args []string, stdout io.Writer, stderr *os.File) error {
	fs, c := compareFlags()
	report := fs.Bool("report", false, "run nothing: re-read --out's compare.json and rewrite its table, plot and JSON")
	if err := parseSubcommandFlags(fs, args, stderr, "lsp-train compare [flags]",
		"Pretrains a preset (tiny by default) natively on --pretrain-task, fine-tunes it on\n"+
			"--task in each of --rows (by default every update: native, zero, lsp with sparse random, fitted,\n"+
			"svd and gaussian projectors, galore, lora, lora on nf4, and the dense ones at lsp's memory) with --seeds seeds, each row at its best of --lrs on held-out\n"+
			"loss, times each row with the sequential and the\n"+
			"pipelined schedule, and prints one table; the last lines are lsp-quality (the best row\n"+
			"with fitted projectors) and lsp-recovery: (L0 - L_lsp) / (L0 - L_native), means over seeds."); err != nil {
		return err
	}
	if *report {
		res, err := compare.Report(c.Out)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, res.Table)
		return nil
	}
	if err := c.Validate(); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, sig, done := interruptible(logger, "interrupt: stopping after the current step (Ctrl-C again to quit at once)", nil)
	defer done()
	res, err := compare.Run(ctx, *c, logger)
	if err != nil {
		if errors.Is(err, compare.ErrInterrupted) {
			err = fmt.Errorf("%w (a finished pretraining in %s/pretrain is reused by the next compare with the same settings)", err, c.Out)
			if s := sig(); s != 0 {
				return &interrupted{sig: s, err: err}
			}
		}
		return err
	}
	fmt.Fprint(stdout, res.Table)
	return nil
}
