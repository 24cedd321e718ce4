// Flags of the train command, the optional JSON config file, and byte
// sizes such as 8GiB. Modes, dtypes, clip modes, the schedule and the
// device are typed flag values: parsed once, here, and refused here when
// misspelled.

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train"
)

func bindTrainFlags(fs *flag.FlagSet, c *train.Config) {
	fs.StringVar(&c.Model, "model", c.Model, "model preset (tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl) or a Hugging Face GPT-2 checkpoint directory")
	fs.StringVar(&c.Data, "data", c.Data, "training data: builtin, builtin:TASK[:N] (tasks: reverse, sort, add, copy), an Alpaca .json/.jsonl file, or a plain-text file")
	fs.IntVar(&c.Steps, "steps", c.Steps, "optimizer steps (0: use --epochs)")
	fs.Float64Var(&c.Epochs, "epochs", c.Epochs, "passes over the training data, when --steps is 0")
	fs.IntVar(&c.Batch, "batch", c.Batch, "rows per micro-batch")
	fs.IntVar(&c.SeqLen, "seq-len", c.SeqLen, "tokens per row (at most the model context)")
	fs.IntVar(&c.GradAccum, "grad-accum", c.GradAccum, "micro-batches accumulated per optimizer step")
	fs.Float64Var(&c.LR, "lr", c.LR, "peak learning rate (after warmup; cosine decay to --min-lr)")
	fs.Float64Var(&c.MinLR, "min-lr", c.MinLR, "learning rate at the last step")
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, "linear warmup steps")
	fs.Float64Var(&c.WeightDecay, "weight-decay", c.WeightDecay, "decoupled weight decay of matrices and embeddings")
	fs.Float64Var(&c.Beta1, "beta1", c.Beta1, "AdamW beta1")
	fs.Float64Var(&c.Beta2, "beta2", c.Beta2, "AdamW beta2")
	fs.Var(&c.ClipMode, "clip-mode", "gradient clipping `mode`: none, matrix (each tensor by its norm) or global-prev (by the previous step's global norm)")
	fs.Float64Var(&c.GradClip, "grad-clip", c.GradClip, "max gradient norm for clipping")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "steps between evaluations (0: only at the end)")
	fs.Float64Var(&c.EvalFraction, "eval-fraction", c.EvalFraction, "share of the data held out for evaluation")
	fs.IntVar(&c.EvalGenerate, "eval-generate", c.EvalGenerate, "held-out prompts scored by greedy exact match at each evaluation")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "steps between checkpoints (0: only at the end)")
	fs.BoolVar(&c.Resume, "resume", c.Resume, "continue from <out>/checkpoint.safetensors")
	fs.BoolVar(&c.Overwrite, "overwrite", c.Overwrite, "start a new run in a non-empty --out, removing the earlier run's checkpoint, metrics, plot and hf/")
	fs.BoolVar(&c.Truncate, "truncate", c.Truncate, "cut records longer than --seq-len instead of dropping them")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (initialisation, data order, split)")
	fs.Var(&c.Device, "device", "`backend` to train on: cpu (cuda: not in this build yet)")
	fs.Var((*byteSize)(&c.DeviceMem), "device-mem", "device memory budget, e.g. 8GiB or 512MiB (0: unlimited); checked before training")
	fs.Var(&c.DType, "dtype", "storage `type` of weights and activations: fp32 or bf16 (default: bf16 with --device cuda, fp32 on cpu; fp32 master weights and moments either way)")
	fs.IntVar(&c.Threads, "threads", c.Threads, "compute threads (0: all cores)")
	fs.Var(&c.Mode, "mode", "update `mode`: native (everything on the device), zero (ZeRO-Offload: grads down, CPU Adam, weights up) or lsp (LSP-Offload: learned sparse projectors, d x d over the link)")
	fs.Var(&c.GradDType, "grad-dtype", "storage `type` of the parameter gradients: fp32 (the default) or bf16 (native and zero; lsp's compressed S is fp32)")
	fs.Var(&c.DenseParams, "dense-params", "lsp mode, `treatment` of the parameters other than block matrices: frozen, device or host (default: frozen from a checkpoint, device for a preset)")
	fs.IntVar(&c.D, "d", c.D, "lsp: projected size d of each matrix (capped at the matrix's sides)")
	fs.IntVar(&c.R, "r", c.R, "lsp: non-zeros per projector row (at most d)")
	fs.Float64Var(&c.Alpha, "alpha", c.Alpha, "lsp: bias ratio in (0,1) above which the projectors are refitted")
	fs.IntVar(&c.CheckEvery, "check-every", c.CheckEvery, "lsp: steps between projector checks")
	fs.IntVar(&c.CalibSamples, "calib-samples", c.CalibSamples, "lsp: rows of the calibration batch of a projector check")
	fs.Float64Var(&c.ProjLR, "proj-lr", c.ProjLR, "lsp: Adam step size of the projector fit")
	fs.IntVar(&c.FitIters, "fit-iters", c.FitIters, "lsp: Adam steps a projector fit may take")
	fs.BoolVar(&c.NoFit, "no-fit", c.NoFit, "lsp: never fit the projectors (keep the random ones; a control)")
	fs.Var(&c.Schedule, "schedule", "`order` of a step's ops: pipelined (copies and host Adam overlap the backward) or sequential (one op at a time; the reference)")
	fs.Var((*byteSize)(&c.LinkBandwidth), "link-bandwidth", "cpu device: charge device-host copies at this many bytes/s, e.g. 12GB (0: free)")
	fs.StringVar(&c.Out, "out", c.Out, "output `directory`; without --out each run reuses out/, while a given non-empty one needs --resume or --overwrite")
}

// reuseDefaultOut sets --overwrite when --out was given neither on the
// command line nor in the config file (and --resume is not set): the
// default out/ is the scratch directory of the plain command, which works
// twice in a row; a directory the user named is never replaced unasked.
func reuseDefaultOut(fs *flag.FlagSet, c *train.Config) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "out" || f.Name == "overwrite" })
	if !given && !c.Resume {
		c.Overwrite = true
	}
}

// applyConfigFile sets every flag named in a JSON object that was not given
// on the command line.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	// UseNumber keeps numbers as written: a float64 would turn 1234567
	// into "1.234567e+06", which integer flags reject.
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if dec.More() {
		return fmt.Errorf("--config %s: trailing data after the JSON object", path)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for k, v := range m {
		name := strings.ReplaceAll(k, "_", "-")
		if fs.Lookup(name) == nil || name == "config" {
			return fmt.Errorf("--config %s: unknown setting %q", path, k)
		}
		if given[name] {
			continue
		}
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case json.Number, bool:
			s = fmt.Sprint(v)
		default:
			return fmt.Errorf("--config %s: %s: want a string, number or boolean, got %s", path, k, jsonText(v))
		}
		if err := fs.Set(name, s); err != nil {
			return fmt.Errorf("--config %s: %s: %q: %w", path, k, s, err)
		}
	}
	return nil
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// byteSize is a flag holding bytes, written as 123, 4KiB, 8GiB, 2GB or 1.5G.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v >= 0) { // also rejects NaN
		return 0, fmt.Errorf("%q is not a byte size (examples: 8GiB, 512MiB, 1000000)", s)
	}
	// Converting a float64 at or above 2^63 (or +Inf) to int64 is
	// implementation-defined in Go; reject it instead.
	if v*mult >= 1<<63 {
		return 0, fmt.Errorf("%q is too large a byte size", s)
	}
	return int64(v * mult), nil
}
