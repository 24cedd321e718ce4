// The sample command: generate from a trained model.

package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/eval"
)

// bindSampleFlags binds the sample command's flags to o, and -ids to ids.
func bindSampleFlags(fs *flag.FlagSet, o *eval.SampleOptions, ids *bool) {
	fs.StringVar(&o.Model, "model", "out/hf", "a Hugging Face `DIR` (such as <out>/hf; config.json model_type "+strings.Join(catalog.ModelTypes(), ", ")+"), a training output directory (its hf/, else its checkpoint), a checkpoint file (with the tokenizer its run recorded), or a llama2.c model .bin")
	fs.StringVar(&o.Tokenizer, "tokenizer", "", "the tokenizer `FILE` instead of --model's: a tokenizer.json, a vocab.json (merges.txt beside it), a directory holding one, a llama2.c tokenizer .bin, or byte or gpt2")
	fs.StringVar(&o.Prompt, "prompt", "", "the prompt `TEXT` (required; \"\" generates from the beginning-of-sequence token alone, as llama2.c does)")
	fs.BoolVar(&o.Alpaca, "alpaca", false, "wrap the prompt in the Alpaca instruction template")
	fs.StringVar(&o.Adapter, "adapter", "", "a PEFT LoRA adapter `DIR` (adapter_config.json, adapter_model.safetensors, such as <out>/adapter) merged into --model's weights, as peft's merge_and_unload does")
	fs.BoolVar(&o.Chat, "chat", false, "render the prompt as one user turn of a conversation, ending with the assistant's header, as training renders conversations: with --chat-template, else the model's tokenizer_config.json chat_template, else the fixed ChatML-like format")
	fs.StringVar(&o.ChatTemplate, "chat-template", "", "with --chat: the Jinja chat template `FILE` instead of the model's (give the one the model was trained with)")
	fs.IntVar(&o.MaxNew, "max-new", 64, "most tokens to generate")
	fs.Float64Var(&o.Temperature, "temperature", 0, "sampling temperature, >= 0 (0: greedy)")
	fs.IntVar(&o.TopK, "top-k", 0, "sample among the `K` most likely tokens only (0: all)")
	fs.Float64Var(&o.TopP, "top-p", 1, "nucleus sampling, in (0, 1]: keep the smallest set of tokens with this much probability")
	fs.Float64Var(&o.RepetitionPenalty, "repetition-penalty", 1, "Hugging Face's: divide a positive logit of a token already in the text by this, multiply a negative one (1: none)")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed for sampling")
	fs.BoolVar(&o.NoCache, "no-cache", false, "generate without the KV cache, rerunning the whole sequence per token (slow; the reference the cache is tested against)")
	fs.BoolVar(ids, "ids", false, "print the generated token ids instead of the text (for exact comparisons)")
	o.Device = device.CPU
	fs.Var(&o.Device, "device", strings.Replace(deviceUsage(), "to train on", "to generate on", 1))
	fs.IntVar(&o.Threads, "threads", 0, "compute threads (0: all cores)")
}

// sampleFlags is the sample command's flag set, bound to the options and
// the --ids it returns, which hold its defaults until parsed.
func sampleFlags() (*flag.FlagSet, *eval.SampleOptions, *bool) {
	fs := flag.NewFlagSet("lsp-train sample", flag.ContinueOnError)
	o, ids := new(eval.SampleOptions), new(bool)
	bindSampleFlags(fs, o, ids)
	return fs, o, ids
}

// newSampleFlags is the sample command's flag set with its defaults.
func newSampleFlags() *flag.FlagSet {
	fs, _, _ := sampleFlags()
	return fs
}

func sampleCmd(args []string, stdout io.Writer, stderr *os.File) error {
	fs, o, ids := sampleFlags()
	if err := parseSubcommandFlags(fs, args, stderr, "lsp-train sample --model DIR --prompt TEXT [flags]",
		"Continues the prompt with the model, a token a step with a KV cache: greedy by default, sampled with\n"+
			"--temperature above 0 (then --top-k and --top-p filter). Stops at the tokenizer's stop ids (EOS, and\n"+
			"generation_config.json's other eos ids) or after --max-new tokens. The text (or with --ids the token ids) goes to stdout, the speed in tokens/s to stderr."); err != nil {
		return err
	}
	// The ranges -h states, checked before the model is read. (The
	// library takes a TopP of 0 as "not set"; the flag's default is 1.)
	switch {
	case !flagGiven(fs, "prompt"):
		// An empty one is a prompt: generation starts from the
		// beginning-of-sequence token (EOS where the tokenizer has none).
		return fmt.Errorf("--prompt is required (--prompt \"\" generates from nothing)")
	case !(o.TopP > 0 && o.TopP <= 1): // also NaN
		return fmt.Errorf("--top-p: must be in (0, 1], got %g", o.TopP)
	case !(o.Temperature >= 0):
		return fmt.Errorf("--temperature: must be >= 0, got %g", o.Temperature)
	case o.MaxNew < 1:
		return fmt.Errorf("--max-new: must be at least 1, got %d", o.MaxNew)
	case o.TopK < 0:
		return fmt.Errorf("--top-k: must be >= 0, got %d", o.TopK)
	case !(o.RepetitionPenalty > 0): // also NaN
		return fmt.Errorf("--repetition-penalty: must be > 0, got %g", o.RepetitionPenalty)
	}
	res, err := eval.Sample(*o)
	if err != nil {
		return err
	}
	if *ids {
		parts := make([]string, len(res.IDs))
		for i, id := range res.IDs {
			parts[i] = strconv.Itoa(int(id))
		}
		fmt.Fprintln(stdout, strings.Join(parts, " "))
	} else {
		fmt.Fprintln(stdout, res.Text)
	}
	cache := "KV cache"
	if o.NoCache {
		cache = "no cache"
	}
	fmt.Fprintf(stderr, "%d prompt tokens, %d new in %.3fs: %.1f tokens/s (%s, %s)\n",
		res.PromptTokens, len(res.IDs), res.Elapsed.Seconds(), res.TokensPerSecond(), cache, o.Device)
	return nil
}
