// The sample command: generate from a trained model.

package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/lsp-offload/lsp-offload/train/eval"
)

func sampleCmd(args []string, stdout io.Writer, stderr *os.File) error {
	fs := flag.NewFlagSet("lsp-train sample", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o eval.SampleOptions
	fs.StringVar(&o.Model, "model", "out/hf", "a Hugging Face GPT-2 directory (such as <out>/hf) or a training output directory")
	fs.StringVar(&o.Prompt, "prompt", "", "the prompt text")
	fs.BoolVar(&o.Alpaca, "alpaca", false, "wrap the prompt in the Alpaca instruction template")
	fs.IntVar(&o.MaxNew, "max-new", 64, "most tokens to generate")
	fs.Float64Var(&o.Temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fs.Float64Var(&o.TopP, "top-p", 1, "nucleus sampling: keep the smallest set of tokens with this much probability")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed for sampling")
	fs.IntVar(&o.Threads, "threads", 0, "compute threads (0: all cores)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Prompt == "" {
		return fmt.Errorf("--prompt is required")
	}
	text, err := eval.Sample(o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, text)
	return nil
}
