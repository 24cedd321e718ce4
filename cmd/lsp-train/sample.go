// The sample command: generate from a trained model.

package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/models"
)

// bindSampleFlags binds the sample command's flags to o.
func bindSampleFlags(fs *flag.FlagSet, o *eval.SampleOptions) {
	fs.StringVar(&o.Model, "model", "out/hf", "a Hugging Face `DIR` (such as <out>/hf; config.json model_type "+strings.Join(models.ModelTypes(), ", ")+") or a training output directory")
	fs.StringVar(&o.Tokenizer, "tokenizer", "", "the tokenizer `FILE` instead of --model's: a tokenizer.json, a vocab.json (merges.txt beside it), a directory holding one, or byte or gpt2")
	fs.StringVar(&o.Prompt, "prompt", "", "the prompt `TEXT` (required)")
	fs.BoolVar(&o.Alpaca, "alpaca", false, "wrap the prompt in the Alpaca instruction template")
	fs.IntVar(&o.MaxNew, "max-new", 64, "most tokens to generate")
	fs.Float64Var(&o.Temperature, "temperature", 0, "sampling temperature, >= 0 (0: greedy)")
	fs.Float64Var(&o.TopP, "top-p", 1, "nucleus sampling, in (0, 1]: keep the smallest set of tokens with this much probability")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed for sampling")
	fs.IntVar(&o.Threads, "threads", 0, "compute threads (0: all cores)")
}

// newSampleFlags is the sample command's flag set with its defaults.
func newSampleFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("lsp-train sample", flag.ContinueOnError)
	bindSampleFlags(fs, new(eval.SampleOptions))
	return fs
}

func sampleCmd(args []string, stdout io.Writer, stderr *os.File) error {
	fs := flag.NewFlagSet("lsp-train sample", flag.ContinueOnError)
	var o eval.SampleOptions
	bindSampleFlags(fs, &o)
	usage := func(w io.Writer) {
		subcommandUsage(w, fs, "lsp-train sample --model DIR --prompt TEXT [flags]",
			"Continues the prompt with the model: greedy by default, sampled with --temperature above 0.")
	}
	if err := parseFlags(fs, args, usage, stderr); err != nil {
		return err
	}
	// The ranges -h states, checked before the model is read. (The
	// library takes a TopP of 0 as "not set"; the flag's default is 1.)
	switch {
	case o.Prompt == "":
		return fmt.Errorf("--prompt is required")
	case !(o.TopP > 0 && o.TopP <= 1): // also NaN
		return fmt.Errorf("--top-p: must be in (0, 1], got %g", o.TopP)
	case !(o.Temperature >= 0):
		return fmt.Errorf("--temperature: must be >= 0, got %g", o.Temperature)
	case o.MaxNew < 1:
		return fmt.Errorf("--max-new: must be at least 1, got %d", o.MaxNew)
	}
	text, err := eval.Sample(o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, text)
	return nil
}
