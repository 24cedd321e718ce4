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

	"github.com/lsp-offload/lsp-offload/train/compare"
)

// bindCompareFlags binds the flags of the compare command to c.
func bindCompareFlags(fs *flag.FlagSet, c *compare.Config) {
	fs.StringVar(&c.Out, "out", c.Out, "output directory (pretrain/, one directory per run, compare.png, compare.md, compare.json)")
	fs.IntVar(&c.Steps, "steps", c.Steps, "fine-tuning steps of every row")
	fs.IntVar(&c.PretrainSteps, "pretrain-steps", c.PretrainSteps, "native pretraining steps of the tiny preset (reused when an identical earlier compare left them)")
	fs.StringVar(&c.Task, "task", c.Task, "fine-tuning data: builtin:TASK[:N] (tasks: reverse, sort, add, copy), not the --pretrain-task")
	fs.StringVar(&c.PretrainTask, "pretrain-task", c.PretrainTask, "pretraining data: builtin:TASK[:N]")
	fs.IntVar(&c.D, "d", c.D, "lsp: projected size d, at most min(m, n)/4 of tiny's matrices (32)")
	fs.IntVar(&c.R, "r", c.R, "lsp: non-zeros per projector row, at most d/4")
	fs.Var((*byteSize)(&c.LinkBandwidth), "link-bandwidth", "bytes/s charged per device-host copy on the CPU backend, e.g. 100MB (0: free)")
	fs.IntVar(&c.TimingSteps, "timing-steps", c.TimingSteps, "steps of each row's sequential and pipelined timing run")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "steps between evals of the fine-tuning (plus one before the first step)")
	fs.IntVar(&c.EvalGenerate, "eval-generate", c.EvalGenerate, "held-out prompts scored by greedy exact match after the last step (0: none)")
	fs.IntVar(&c.Threads, "threads", c.Threads, "compute threads (0: all cores)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (initialisation, data order, split, projectors)")
}

func compareCmd(args []string, stdout io.Writer, stderr *os.File) error {
	c := compare.Defaults()
	fs := flag.NewFlagSet("lsp-train compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bindCompareFlags(fs, &c)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lsp-train compare [flags]\n\n"+
			"Pretrains the tiny preset natively on --pretrain-task, fine-tunes it on --task in\n"+
			"native, zero, lsp and lsp-without-fitted-projectors rows, times each row with the\n"+
			"sequential and the pipelined schedule, and prints one table; the last line is\n"+
			"lsp-recovery: (L0 - L_lsp) / (L0 - L_native).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with -)", fs.Arg(0))
	}
	if err := c.Validate(); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, done := interruptible(logger, "interrupt: stopping after the current step (Ctrl-C again to quit at once)")
	defer done()
	res, err := compare.Run(ctx, c, logger)
	if err != nil {
		if errors.Is(err, compare.ErrInterrupted) {
			return fmt.Errorf("%w (a finished pretraining in %s/pretrain is reused by the next compare with the same settings)", err, c.Out)
		}
		return err
	}
	fmt.Fprint(stdout, res.Table)
	return nil
}
