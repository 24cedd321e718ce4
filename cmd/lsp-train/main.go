// Command lsp-train fine-tunes GPT-2 style language models. With no flags it
// trains the tiny preset on a built-in task on the CPU and says where its
// outputs are; `lsp-train sample` generates text from a trained model, and
// `lsp-train compare` fine-tunes in every update mode and prints a table.
//
//	lsp-train [flags]                 train (see -h)
//	lsp-train sample -model DIR -prompt TEXT [flags]
//	lsp-train compare [flags]         native, zero and lsp side by side
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/lsp-offload/lsp-offload/train"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// subcommands are the commands after the first argument; anything else
// is the train command's flags.
var subcommands = map[string]func(args []string, stdout io.Writer, stderr *os.File) error{
	"compare": compareCmd,
	"sample":  sampleCmd,
}

// run runs the command args name and returns the exit code: 0 also for
// -h, whose usage the flag package has printed already.
func run(args []string, stdout io.Writer, stderr *os.File) int {
	name, cmd := "lsp-train", trainCmd
	if len(args) > 0 && subcommands[args[0]] != nil {
		name, cmd, args = "lsp-train "+args[0], subcommands[args[0]], args[1:]
	}
	if err := cmd(args, stdout, stderr); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, name+":", err)
		return 1
	}
	return 0
}

func trainCmd(args []string, stdout io.Writer, stderr *os.File) error {
	cfg := train.Defaults()
	fs := flag.NewFlagSet("lsp-train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "JSON file of flag values (`{\"steps\": 100, ...}`); flags given on the command line win")
	bindTrainFlags(fs, &cfg)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lsp-train [flags]\n       lsp-train sample -model DIR -prompt TEXT\n       lsp-train compare [flags]\n\nTrains a GPT-2 style model; with no flags, the tiny preset on a built-in task.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with -)", fs.Arg(0))
	}
	if *configFile != "" {
		if err := applyConfigFile(fs, *configFile); err != nil {
			return err
		}
	}
	reuseDefaultOut(fs, &cfg)
	defaultDType(fs, &cfg)
	var logger *slog.Logger
	var progress *os.File
	if term.IsTerminal(int(stderr.Fd())) {
		progress = stderr
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	} else {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
		progress = stderr // plain log lines when not a terminal
	}
	ctx, done := interruptible(logger, "interrupt: finishing the current step and saving a checkpoint (Ctrl-C again to quit without saving)")
	defer done()
	res, err := train.Run(ctx, cfg, train.Options{Logger: logger, Progress: progress})
	if err != nil {
		return err
	}
	report(stdout, cfg, res)
	return nil
}

func report(w io.Writer, cfg train.Config, res *train.Result) {
	if res.Interrupted {
		fmt.Fprintf(w, "\nInterrupted at step %d. Checkpoint: %s\nContinue with the same flags plus --resume.\n", res.Steps, res.Checkpoint)
		return
	}
	fmt.Fprintf(w, "\nTrained %s on %s: %d steps in %s (%.0f tokens/s).\n", cfg.Model, cfg.Data, res.Steps,
		res.Elapsed.Round(1e8), res.TokensPerSec)
	fmt.Fprintf(w, "  final train loss  %.4f\n", res.TrainLoss)
	if res.EvalLoss == res.EvalLoss {
		fmt.Fprintf(w, "  eval loss         %.4f\n", res.EvalLoss)
	}
	if res.ExactMatch == res.ExactMatch {
		fmt.Fprintf(w, "  eval exact match  %.1f%% (greedy generation on held-out prompts)\n", 100*res.ExactMatch)
	}
	fmt.Fprintf(w, "Outputs in %s:\n", res.Out)
	fmt.Fprintf(w, "  %-40s Hugging Face checkpoint (transformers: GPT2LMHeadModel.from_pretrained)\n", res.Export)
	fmt.Fprintf(w, "  %-40s checkpoint for --resume\n", res.Checkpoint)
	fmt.Fprintf(w, "  %-40s metrics, one JSON object per line\n", res.Metrics)
	fmt.Fprintf(w, "  %-40s loss curves\n", res.Plot)
	switch {
	case strings.HasPrefix(cfg.Data, "builtin:sort"):
		fmt.Fprintf(w, "Try: ./bin/lsp-train sample -model %s -prompt 'sort hello='\n", res.Export)
	case strings.HasSuffix(cfg.Data, ".json"), strings.HasSuffix(cfg.Data, ".jsonl"):
		fmt.Fprintf(w, "Try: ./bin/lsp-train sample -model %s -alpaca -prompt 'Name three colours.'\n", res.Export)
	}
}

// interruptible returns a context cancelled by the first Ctrl-C (or
// SIGTERM), which logs msg; a second one kills the process at once. Call
// done when the work has finished.
func interruptible(logger *slog.Logger, msg string) (ctx context.Context, done func()) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	finished := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stop() // a second Ctrl-C kills at once
			logger.Info(msg)
		case <-finished:
		}
	}()
	return ctx, func() { close(finished); stop() }
}
