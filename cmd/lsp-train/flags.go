// Flags of the train command, their -h (grouped, with readable
// placeholders, the subcommands with theirs), the one-line answer to a
// mistyped flag, the optional JSON config file, and byte sizes such as
// 8GiB. Modes, dtypes, clip modes, the schedule and the device are typed
// flag values: parsed once, here, and refused here when misspelled.

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

func bindTrainFlags(fs *flag.FlagSet, c *train.Config) {
	fs.StringVar(&c.Model, "model", c.Model, "`MODEL`: a preset (from random weights; "+catalog.PresetList()+
		"), a Hugging Face checkpoint directory (config.json model_type "+strings.Join(catalog.ModelTypes(), ", ")+"), or a llama2.c model .bin (tokenizer.bin beside it)")
	fs.StringVar(&c.Tokenizer, "tokenizer", c.Tokenizer, "the tokenizer `FILE` instead of --model's: a tokenizer.json, a vocab.json (merges.txt beside it), a directory holding one, a llama2.c tokenizer .bin, or byte or gpt2")
	fs.StringVar(&c.Data, "data", c.Data, "training `DATA`: builtin (builtin:sort), builtin:TASK[:N] (tasks: reverse, sort, add, copy), a .json/.jsonl file of Alpaca records, OpenAI-style messages or ShareGPT conversations (told apart by the first record's fields; a conversation is rendered with the checkpoint's chat_template, else --chat-template, else a fixed ChatML-like format, and its loss is on its assistant turns), or a plain-text file")
	fs.StringVar(&c.ChatTemplate, "chat-template", c.ChatTemplate, "the Jinja chat template `FILE` conversations are rendered with instead of the checkpoint's tokenizer_config.json chat_template (a .json file: its chat_template field)")
	fs.IntVar(&c.Steps, "steps", c.Steps, fmt.Sprintf("optimizer steps (%d when neither --steps nor --epochs is given; not both)", train.DefaultSteps))
	fs.Float64Var(&c.Epochs, "epochs", c.Epochs, "passes over the training data, instead of --steps")
	fs.IntVar(&c.Batch, "batch", c.Batch, "rows per micro-batch")
	fs.IntVar(&c.SeqLen, "seq-len", c.SeqLen, "tokens per row (at most the model context); longer records are dropped (or cut: --truncate)")
	fs.IntVar(&c.GradAccum, "grad-accum", c.GradAccum, "micro-batches accumulated per optimizer step")
	fs.Float64Var(&c.LR, "lr", c.LR, "peak learning rate (after warmup; cosine decay to --min-lr)")
	fs.Float64Var(&c.MinLR, "min-lr", c.MinLR, "learning rate at the last step")
	// Its default follows --lr (defaultMinLR): -h says so instead of a number.
	fs.Lookup("min-lr").DefValue = fmt.Sprintf("%g x --lr", minLRFraction)
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, "linear warmup steps")
	fs.Float64Var(&c.WeightDecay, "weight-decay", c.WeightDecay, "decoupled weight decay of matrices and embeddings")
	fs.Float64Var(&c.Beta1, "beta1", c.Beta1, "AdamW beta1")
	fs.Float64Var(&c.Beta2, "beta2", c.Beta2, "AdamW beta2")
	fs.Var(&c.ClipMode, "clip-mode", "gradient clipping `MODE`: none, matrix (each tensor by its norm) or global-prev (by the previous step's global norm)")
	fs.Float64Var(&c.GradClip, "grad-clip", c.GradClip, "max gradient norm for clipping")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "steps between evaluations (0: only at the end)")
	fs.Float64Var(&c.EvalFraction, "eval-fraction", c.EvalFraction, "share of the data held out for evaluation (not with --eval-data)")
	fs.StringVar(&c.EvalData, "eval-data", c.EvalData, "the held-out `FILE` evaluated on, in any format --data reads, instead of a --eval-fraction share of --data (not both)")
	fs.IntVar(&c.EvalGenerate, "eval-generate", c.EvalGenerate, "held-out prompts scored by greedy exact match at each evaluation, at most")
	fs.IntVar(&c.EvalTokens, "eval-tokens", c.EvalTokens, "held-out tokens (rows x --seq-len) the eval loss reads, at most: evenly spaced rows of the held-out set (0: all of it)")
	fs.IntVar(&c.EvalMaxNew, "eval-max-new", c.EvalMaxNew, "exact match scores the held-out prompts whose response fits this many new tokens, the others are left out (0: no limit)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "steps between checkpoints (0: only at the end)")
	fs.IntVar(&c.KeepCheckpoints, "keep-checkpoints", c.KeepCheckpoints, "checkpoints kept: with N > 1 each checkpoint also gets a step-numbered name in <out>/checkpoints/ (a hard link: no extra write), the N newest kept; --resume reads the latest, so to go back to an older one run ln -f out/checkpoints/step-NNNNNN.safetensors out/checkpoint.safetensors (not cp, which would write into the newest)")
	fs.IntVar(&c.ExportEvery, "export-every", c.ExportEvery, "steps between Hugging Face exports into <out>/hf-step-NNNNNN/ (0: only the final one, <out>/hf/)")
	fs.BoolVar(&c.Resume, "resume", c.Resume, "continue from <out>/checkpoint.safetensors (the run's settings must match the checkpoint's, except the length, eval and checkpoint cadence, and where it runs)")
	fs.BoolVar(&c.Overwrite, "overwrite", c.Overwrite, "start a new run in a non-empty --out, removing the earlier run's checkpoint, metrics, plot, hf/, checkpoints/ and hf-step-*/")
	fs.BoolVar(&c.Truncate, "truncate", c.Truncate, "cut records longer than --seq-len instead of dropping them")
	fs.BoolVar(&c.Pack, "pack", c.Pack, "pack several examples into each row of --seq-len tokens, each attending only to itself with its positions from 0 (the same loss per token as unpacked rows, fewer padding tokens)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (initialisation, data order, split)")
	fs.Var(&c.Device, "device", deviceUsage())
	fs.Var((*byteSize)(&c.DeviceMem), "device-mem", "device memory budget, e.g. 8GiB or 512MiB (0: unlimited); checked before training")
	fs.Var((*byteSize)(&c.HostMem), "host-mem", "host memory budget, e.g. 16GiB (0: the memory the machine has available, MemAvailable of /proc/meminfo); checked before training")
	fs.Var(&c.DType, "dtype", "storage `TYPE` of weights and activations: fp32 or bf16 (default: bf16 with --device cuda, fp32 on cpu; Adam moments are fp32 either way, and so are the master weights of every parameter that has one: all but lsp's block matrices, whose bf16 weights are updated by stochastic rounding)")
	fs.IntVar(&c.Threads, "threads", c.Threads, "compute threads (0: all cores)")
	fs.Var(&c.Mode, "mode", "update `MODE`: native (everything on the device), zero (ZeRO-Offload: grads down, CPU Adam, weights up), lsp (LSP-Offload: learned sparse projectors, d x d over the link) lora (PEFT's low-rank adapters on frozen weights, all on the device) or galore (GaLore: each matrix's gradient projected on its top singular vectors, AdamW there, all on the device)")
	fs.Var(&c.GradDType, "grad-dtype", "storage `TYPE` of the parameter gradients: fp32 or bf16 (native and zero; lsp's compressed S is fp32)")
	fs.Var(&c.DenseParams, "dense-params", "lsp, lora and galore modes: `WHERE` the parameters other than block matrices train: frozen, device or host (default: frozen from a checkpoint, device for a preset)")
	fs.IntVar(&c.LoRAR, "lora-r", c.LoRAR, "lora: the adapters' rank r")
	fs.Float64Var(&c.LoRAAlpha, "lora-alpha", c.LoRAAlpha, "lora: alpha; the adapters' term is scaled by alpha / r")
	fs.Float64Var(&c.LoRADropout, "lora-dropout", c.LoRADropout, "lora: dropout on the adapters' input (only 0 is supported)")
	fs.StringVar(&c.LoRATargets, "lora-targets", c.LoRATargets, "lora: comma-separated Hugging Face `MODULES` to adapt, matched by the end of their path as PEFT does (default: every attention and MLP linear: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj for LLaMA and Qwen2; c_attn,c_proj,c_fc for GPT-2)")
	fs.StringVar(&c.BaseDType, "base-dtype", c.BaseDType, "lora: `nf4` or int8 stores the frozen block matrices quantized (QLoRA: bitsandbytes' blockwise formats, double-quantized scales), dequantized inside the GEMMs; default: in --dtype")
	fs.IntVar(&c.GaloreRank, "galore-rank", c.GaloreRank, "galore: the singular vectors kept per matrix (capped by its smaller side)")
	fs.IntVar(&c.GaloreEvery, "galore-every", c.GaloreEvery, "galore: `STEPS` between refreshes of each matrix's projector (a randomized SVD of its gradient)")
	fs.Float64Var(&c.GaloreScale, "galore-scale", c.GaloreScale, "galore: the factor of the update projected back (GaLore's alpha)")
	fs.StringVar(&c.Adapter, "adapter", c.Adapter, "lora: a PEFT LoRA adapter `DIR` (adapter_config.json, adapter_model.safetensors) to continue training; its rank, alpha and targets replace --lora-r, --lora-alpha and --lora-targets")
	fs.IntVar(&c.D, "d", c.D, "lsp: projected size d of each matrix; 0 (the default): a quarter of its shorter side, at most 512 (tiny: 32); a d at a matrix's side or above is capped there and compresses nothing")
	fs.IntVar(&c.R, "r", c.R, "lsp: non-zeros per projector row (at most d)")
	fs.Float64Var(&c.Alpha, "alpha", c.Alpha, "lsp: bias ratio in (0,1) above which the projectors are refitted")
	fs.IntVar(&c.CheckEvery, "check-every", c.CheckEvery, "lsp: steps between projector checks")
	fs.IntVar(&c.CalibSamples, "calib-samples", c.CalibSamples, "lsp: rows of the calibration batch of a projector check")
	fs.Float64Var(&c.ProjLR, "proj-lr", c.ProjLR, "lsp: Adam step size of the projector fit")
	fs.IntVar(&c.FitIters, "fit-iters", c.FitIters, "lsp: Adam steps a projector fit may take")
	fs.BoolVar(&c.Fit, "fit", c.Fit, "lsp: fit the projectors to the gradients every --check-every steps (the paper's learned projectors; without it the random ones drawn at the start are kept, which fine-tuned better on instruction data: README \"Learning the projectors\")")
	fs.Var(&c.Refit, "refit", "lsp: `HOW` a check makes new projectors: sum (fit to the calibration gradient), split (fit to each calibration micro-batch's at once) or random (draw, no fit; a control)")
	fs.Var(&c.Accept, "accept", "lsp: `WHAT` decides whether new projectors replace the old: heldout (half the calibration micro-batches, unseen by the fit) or fit (the fit's own data)")
	fs.Var(&c.Rewarm, "rewarm", "lsp: `WHEN` a refitted matrix's learning rate is re-warmed: measured (its carried second moment is below the new subspace's), change (after any large change), floor (no ramp: raise the carried second moment to the new subspace's) or off")
	fs.Float64Var(&c.ProjOrtho, "proj-ortho", c.ProjOrtho, "lsp: weight of the projector fit's penalty on non-orthogonal columns (0: none)")
	fs.BoolVar(&c.CheckAtStart, "check-at-start", c.CheckAtStart, "lsp: a projector check before step 1 too (by default step 1 to --check-every train on the random projectors drawn at the start)")
	fs.BoolVar(&c.ShareLayers, "share-layers", c.ShareLayers, "lsp: one projector pair per matrix kind, fitted on every layer's gradients (as the paper's code)")
	fs.Var(&c.Projector, "projector", "lsp: `KIND` of projectors: sparse ((d,r)-sparse: random, or fitted with --fit), svd (dense: the top-d singular vectors of the calibration gradient, refreshed at every check, which svd runs without --fit; q, k and v share P from their stacked gradients; gaussian before the first check) or gaussian (dense N(0, 1/d), drawn once, no checks); dense P and Q take m x d and n x d fp32 on the device")
	fs.BoolVar(&c.NoGain, "no-gain", c.NoGain, "lsp: apply the update without the projectors' per-column gains (a control)")
	fs.Var(&c.Collectives, "collectives", "`WHERE` several ranks (mpirun) sum lsp's S and the device AdamW's gradients: nccl (on the GPUs), host (copied to pinned memory, over MPI) or auto (nccl on the CUDA backend when libnccl.so.2 loads, else host)")
	fs.Var(&c.Schedule, "schedule", "`ORDER` of a step's ops: pipelined (copies and host Adam overlap the backward) or sequential (one op at a time; the reference)")
	fs.Var(&c.Recompute, "recompute", "`WHAT` the backward recomputes instead of keeping from the forward: none, attn (each block's attention) or layer (all of each block but its output); less device memory for more compute, the same results (lsp-train plan says which a model needs)")
	fs.Var(&c.GradResidency, "grad-residency", "zero and lsp: `WHERE` the gradients (lsp: S and the projectors) wait on the device: whole (all of them, for the step), ring (a few blocks' at a time, each copied down as its backward ends: less device memory, the gradients or S down once per micro-batch, lsp's projectors up once per micro-batch under --recompute layer) or auto (whole when it fits --device-mem)")
	fs.Var((*byteSize)(&c.LinkBandwidth), "link-bandwidth", "cpu device: charge device-host copies at this many bytes/s, e.g. 12GB (0: free)")
	fs.Var(&c.OnNonFinite, "on-nonfinite", "`ACTION` on a step whose loss is NaN or infinite: stop (without saving that step) or skip (update nothing, go on with the next batch)")
	fs.IntVar(&c.MaxSkips, "max-skips", c.MaxSkips, "with --on-nonfinite skip, the most steps skipped in a row; one more stops the run")
	fs.StringVar(&c.Out, "out", c.Out, "output `DIR`; without --out, out/, where a run replaces the outputs of an earlier run without --out (marked by its "+train.DefaultOutMarker+" file); any other non-empty directory needs --resume or --overwrite")
}

// The headings of the train command's -h, in order.
const (
	groupModelData = "Model and data"
	groupTraining  = "Training"
	groupOffload   = "Offload and LSP"
	groupOutput    = "Output"
	groupDevice    = "Device"
)

var trainGroupOrder = []string{groupModelData, groupTraining, groupOffload, groupOutput, groupDevice}

// trainFlagGroups puts every flag of the train command under a heading
// of -h, listed in this order. A new flag joins a group with one line
// here; TestHelp fails on a flag that has none.
var trainFlagGroups = []struct{ flag, group string }{
	{"model", groupModelData},
	{"tokenizer", groupModelData},
	{"data", groupModelData},
	{"chat-template", groupModelData},
	{"seq-len", groupModelData},
	{"truncate", groupModelData},
	{"pack", groupModelData},
	{"eval-fraction", groupModelData},
	{"eval-data", groupModelData},
	{"seed", groupModelData},
	{"config", groupTraining},
	{"steps", groupTraining},
	{"epochs", groupTraining},
	{"batch", groupTraining},
	{"grad-accum", groupTraining},
	{"lr", groupTraining},
	{"min-lr", groupTraining},
	{"warmup", groupTraining},
	{"weight-decay", groupTraining},
	{"beta1", groupTraining},
	{"beta2", groupTraining},
	{"clip-mode", groupTraining},
	{"grad-clip", groupTraining},
	{"eval-every", groupTraining},
	{"eval-generate", groupTraining},
	{"eval-tokens", groupTraining},
	{"eval-max-new", groupTraining},
	{"on-nonfinite", groupTraining},
	{"max-skips", groupTraining},
	{"mode", groupOffload},
	{"grad-dtype", groupOffload},
	{"dense-params", groupOffload},
	{"lora-r", groupOffload},
	{"lora-alpha", groupOffload},
	{"lora-dropout", groupOffload},
	{"lora-targets", groupOffload},
	{"galore-rank", groupOffload},
	{"galore-every", groupOffload},
	{"galore-scale", groupOffload},
	{"base-dtype", groupOffload},
	{"adapter", groupModelData},
	{"d", groupOffload},
	{"r", groupOffload},
	{"alpha", groupOffload},
	{"check-every", groupOffload},
	{"calib-samples", groupOffload},
	{"proj-lr", groupOffload},
	{"fit-iters", groupOffload},
	{"fit", groupOffload},
	{"refit", groupOffload},
	{"accept", groupOffload},
	{"rewarm", groupOffload},
	{"proj-ortho", groupOffload},
	{"no-gain", groupOffload},
	{"projector", groupOffload},
	{"check-at-start", groupOffload},
	{"share-layers", groupOffload},
	{"schedule", groupOffload},
	{"collectives", groupDevice},
	{"recompute", groupOffload},
	{"grad-residency", groupOffload},
	{"link-bandwidth", groupOffload},
	{"out", groupOutput},
	{"overwrite", groupOutput},
	{"resume", groupOutput},
	{"checkpoint-every", groupOutput},
	{"keep-checkpoints", groupOutput},
	{"export-every", groupOutput},
	{"device", groupDevice},
	{"device-mem", groupDevice},
	{"host-mem", groupDevice},
	{"dtype", groupDevice},
	{"threads", groupDevice},
}

// trainUsage is the train command's -h: the synopsis, the subcommands
// with their flags, the flags by group, and the exit statuses.
func trainUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, `Usage: lsp-train [flags]                train a model (no flags: the tiny preset on a built-in task)
       lsp-train SUBCOMMAND [flags]
       lsp-train help [SUBCOMMAND]      this help, or a subcommand's
       lsp-train --version              the version and the Go release that built it

Any flag may also come from a JSON file: --config FILE; flags on the command line win.
%s%s

Subcommands (lsp-train SUBCOMMAND -h describes their flags):
`, wrap(strings.Fields("A SIZE is "+sizeHelp+"."), 0, 78), backendsLine())
	for _, name := range subcommandNames {
		sc := subcommands[name]
		fmt.Fprintf(w, "  %-9s %s\n", name, sc.summary)
		var flags []string
		sc.flags().VisitAll(func(f *flag.Flag) {
			flags = append(flags, strings.TrimSpace("[--"+f.Name+" "+placeholder(f))+"]")
		})
		fmt.Fprint(w, wrap(flags, 12, 78))
	}
	grouped := map[string][]string{}
	for _, g := range trainFlagGroups {
		grouped[g.group] = append(grouped[g.group], g.flag)
	}
	for _, g := range trainGroupOrder {
		fmt.Fprintf(w, "\n%s:\n", g)
		printFlags(w, fs, grouped[g])
	}
	var other []string
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.ContainsFunc(trainFlagGroups, func(g struct{ flag, group string }) bool { return g.flag == f.Name }) {
			other = append(other, f.Name)
		}
	})
	if len(other) > 0 {
		fmt.Fprintf(w, "\nOther:\n")
		printFlags(w, fs, other)
	}
	fmt.Fprint(w, `
Exit status: 0 when the run finished, 1 on an error (a bad flag included),
130 after Ctrl-C (SIGINT) and 143 after SIGTERM, once the checkpoint and
the loss plot are saved (continue with the same flags plus --resume).
`)
}

// subcommandUsage is a subcommand's -h: its synopsis, what it does, and
// its flags.
func subcommandUsage(w io.Writer, fs *flag.FlagSet, synopsis, about string) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags:\n", synopsis, about)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	printFlags(w, fs, names)
}

// parseSubcommandFlags parses a subcommand's args into fs as parseFlags
// does, with subcommandUsage's synopsis and about as its -h.
func parseSubcommandFlags(fs *flag.FlagSet, args []string, stderr io.Writer, synopsis, about string) error {
	return parseFlags(fs, args, func(w io.Writer) { subcommandUsage(w, fs, synopsis, about) }, stderr)
}

// printFlags lists the named flags of fs, each with a placeholder for its
// value, its usage wrapped to the terminal's customary width, and its
// default when that is not the zero value.
func printFlags(w io.Writer, fs *flag.FlagSet, names []string) {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		_, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  %s\n", strings.TrimSpace("--"+f.Name+" "+placeholder(f)))
		// A usage that states its default itself ("(default: bf16 with
		// --device cuda, ...)") gets no second one from the flag's value.
		if def := f.DefValue; def != "" && def != "0" && def != "false" && !strings.Contains(usage, "(default") {
			if _, ok := f.Value.(*byteSize); ok {
				def = formatBytes(def)
			}
			usage += " (default " + def + ")"
		}
		fmt.Fprint(w, wrap(strings.Fields(usage), 8, 78))
	}
}

// placeholder is the name of a flag's value in the usage: the back-quoted
// word of its usage (FILE, DIR, MODE, ...), SIZE for a byte size, N for
// an integer, X for a real number, TEXT for a string, and none for a
// boolean.
func placeholder(f *flag.Flag) string {
	if _, ok := f.Value.(*byteSize); ok {
		return "SIZE"
	}
	name, _ := flag.UnquoteUsage(f)
	switch name {
	case "int", "uint":
		return "N"
	case "float":
		return "X"
	case "string":
		return "TEXT"
	case "value":
		return "VALUE"
	}
	return name // back-quoted, or "" for a boolean
}

// formatBytes writes a byte count flag default in binary units when it
// is a whole number of them (8589934592 as 8GiB).
func formatBytes(def string) string {
	n, err := strconv.ParseInt(def, 10, 64)
	if err != nil || n <= 0 {
		return def
	}
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return def
}

// wrap writes words, separated by spaces, in lines of at most width
// columns (a longer word stays whole), each indented by indent spaces.
func wrap(words []string, indent, width int) string {
	var b strings.Builder
	pad := strings.Repeat(" ", indent)
	line := 0
	for _, word := range words {
		switch {
		case line == 0:
			b.WriteString(pad)
			line = indent
		case line+1+len(word) > width:
			b.WriteString("\n" + pad)
			line = indent
		default:
			b.WriteByte(' ')
			line++
		}
		b.WriteString(word)
		line += len(word)
	}
	if line > 0 {
		b.WriteByte('\n')
	}
	return b.String()
}

// parseFlags parses args into fs. -h prints the usage (through usage, to
// stderr) and returns flag.ErrHelp; a bad flag returns a one-line error
// with a hint (the flag meant, and -h), not the whole usage; so does an
// argument that is not a flag.
func parseFlags(fs *flag.FlagSet, args []string, usage func(io.Writer), stderr io.Writer) error {
	fs.SetOutput(io.Discard) // the flag package would print the usage on every error
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		usage(stderr)
		return err
	}
	if err != nil {
		return fmt.Errorf("%s%s; %s -h lists the flags", doubleDash(err.Error()), didYouMean(fs, err), fs.Name())
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q%s; %s -h lists the flags", fs.Arg(0), afterSwitch(fs, args), fs.Name())
	}
	return nil
}

// flagInError is a flag name as the flag package's errors spell it, with
// one dash ("flag provided but not defined: -modle", "invalid value "x"
// for flag -mode: ...", "flag needs an argument: -steps").
var flagInError = regexp.MustCompile(`(: |for |for flag )-([A-Za-z][\w-]*)`)

// doubleDash spells the flags of a flag package error with two dashes,
// as -h and every other error do.
func doubleDash(msg string) string {
	return flagInError.ReplaceAllString(msg, "$1--$2")
}

// afterSwitch explains an unexpected argument that follows a switch (a
// boolean flag takes no value: "--resume out/x" leaves "out/x" over), ""
// for any other.
func afterSwitch(fs *flag.FlagSet, args []string) string {
	i := len(args) - fs.NArg()
	if i < 1 || !strings.HasPrefix(args[i-1], "-") {
		return ""
	}
	name := strings.TrimLeft(args[i-1], "-")
	f := fs.Lookup(name)
	if f == nil {
		return ""
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
		return ""
	}
	if name == "resume" {
		return " after --resume, which takes no path: it continues the run in --out; give --out DIR --resume " +
			"(DIR: the run's output directory, holding " + checkpoint.FileName + ")"
	}
	return fmt.Sprintf(" after --%s, which takes no value (--%s=false turns it off)", name, name)
}

// renamedFlags says what became of a flag that no longer exists, for
// the scripts that still give it.
var renamedFlags = map[string]string{
	"start-random": "--check-at-start replaced it, with the opposite sense: --start-random=false is --check-at-start, --start-random the default",
}

// didYouMean names the flags closest to an undefined one (" (did you
// mean --steps?)", " (did you mean --mode or --model?)" when several are
// as close), when any is close: at most two edits away, a swap of two
// neighbouring letters counting one, or one name holding the other.
func didYouMean(fs *flag.FlagSet, err error) string {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: ")
	if !ok {
		return ""
	}
	name = strings.TrimLeft(name, "-")
	if hint, ok := renamedFlags[name]; ok && fs.Lookup(strings.Fields(hint)[0][2:]) != nil {
		return " (" + hint + ")"
	}
	var best []string
	bestDist := 3
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if len(name) >= 3 && len(f.Name) >= 3 && (strings.Contains(f.Name, name) || strings.Contains(name, f.Name)) {
			d = min(d, 2)
		}
		switch {
		case d < bestDist:
			best, bestDist = []string{"--" + f.Name}, d
		case d == bestDist:
			best = append(best, "--"+f.Name)
		}
	})
	switch len(best) {
	case 0:
		return ""
	case 1:
		return " (did you mean " + best[0] + "?)"
	}
	return " (did you mean " + strings.Join(best[:len(best)-1], ", ") + " or " + best[len(best)-1] + "?)"
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and swaps of two neighbouring
// letters that turn one into the other (--modle is one swap from --model).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// fitFlags are the lsp settings of the projector checks, which run only
// with --fit.
var fitFlags = []string{"alpha", "check-every", "calib-samples", "proj-lr", "fit-iters", "refit", "accept", "rewarm",
	"proj-ortho", "check-at-start", "share-layers"}

// svdFlags are the check settings --projector svd uses: its checks
// refresh the projectors from the singular vectors, fitting nothing.
var svdFlags = []string{"check-every", "calib-samples", "check-at-start"}

// checkFitFlags refuses a check setting given (on the command line or in
// the config file) to an lsp run without --fit: since lsp keeps its
// random projectors by default, such a setting would be ignored, and a
// run that asked for checks would silently have none. --projector svd
// runs checks without --fit and takes their cadence, but no fit setting.
func checkFitFlags(fs *flag.FlagSet, c train.Config) error {
	if c.Mode != engine.LSP || c.Fit {
		return nil
	}
	svd := c.Projector == lsp.KindSVD
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(fitFlags, f.Name) && !(svd && slices.Contains(svdFlags, f.Name)) {
			given = append(given, "--"+f.Name)
		}
	})
	if len(given) == 0 {
		return nil
	}
	if svd {
		return fmt.Errorf("%s: only the fit of sparse projectors uses this; --projector svd refreshes its projectors from the singular vectors "+
			"at every check (--check-every, --calib-samples and --check-at-start apply): drop it", strings.Join(given, ", "))
	}
	return fmt.Errorf("%s: only projector checks use this, and lsp runs them with --fit only "+
		"(without it the random projectors drawn at the start are kept): add --fit or drop it", strings.Join(given, ", "))
}

// defaultOut says whether --out was given neither on the command line
// nor in the config file, and --overwrite neither: the default out/ is
// the scratch directory of the plain command, which works twice in a row,
// replacing the outputs of an earlier such run (train.DefaultOutMarker
// says which); a directory the user named, or files the plain command
// did not write, are never replaced unasked.
func defaultOut(fs *flag.FlagSet) bool {
	return !flagGiven(fs, "out") && !flagGiven(fs, "overwrite")
}

// minLRFraction is --min-lr's default as a share of --lr: cosine
// schedules commonly end at a tenth of their peak, and a fixed number
// would refuse any --lr below it.
const minLRFraction = 0.1

// defaultMinLR sets --min-lr to minLRFraction x --lr when neither the
// command line nor the config file gave it, rounded to 12 significant
// digits: 0.1 x 3e-3 is 0.00030000000000000003 in float64, and the
// default run's --min-lr has always been 3e-4 (its schedule, its
// checkpoints' recorded settings).
func defaultMinLR(fs *flag.FlagSet, c *train.Config) {
	if !flagGiven(fs, "min-lr") {
		c.MinLR, _ = strconv.ParseFloat(strconv.FormatFloat(minLRFraction*c.LR, 'g', 12, 64), 64)
	}
}

// checkEvalData refuses --eval-data with an explicit --eval-fraction (on
// the command line or in the config file), which would name a second
// held-out set, and otherwise turns the split off under --eval-data: its
// file is the held-out set, and the whole of --data trains.
func checkEvalData(fs *flag.FlagSet, c *train.Config) error {
	if !flagGiven(fs, "eval-data") {
		return nil
	}
	if c.EvalData == "" {
		return flagerr.New("eval-data", "is empty: give the held-out file, or leave --eval-data out to hold out --eval-fraction of --data")
	}
	if flagGiven(fs, "eval-fraction") {
		return flagerr.New("eval-fraction", "%g contradicts --eval-data %s: give one of them (--eval-data is the held-out set, --eval-fraction a share of --data held out)",
			c.EvalFraction, c.EvalData)
	}
	c.EvalFraction = 0
	return nil
}

// checkSteps refuses an explicit --steps 0: train.Config reads 0 as "not
// set" (600 steps, or --epochs), which is not what a user writing 0 means.
func checkSteps(fs *flag.FlagSet, c train.Config) error {
	if flagGiven(fs, "steps") && c.Steps == 0 {
		return flagerr.New("steps", "must be at least 1, got 0 (leave --steps out for %d steps, or give --epochs)", train.DefaultSteps)
	}
	return nil
}

// flagGiven says whether the flag name was set on the command line or by
// the config file.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
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
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	// Decoded as any, not straight into the map, so that an array or a
	// number is named as such rather than as a Go type error.
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("--config %s: must be a JSON object of flag settings, such as {\"steps\": 200}, not %s", path, jsonKind(v))
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

// jsonKind names the JSON kind of a decoded value: "an array", "a string", ...
func jsonKind(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "an object"
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// byteSize is a flag holding bytes, written as 123, 4KiB, 8GiB, 2GB or
// 1.5G, the unit in any case (8gb, 8gib).
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

// sizeUnits are the units of a byte size, longest first so that a suffix
// matches whole: KiB..TiB are powers of 1024, KB..TB powers of 1000 (as
// disks and links are sold), and a bare K..T of 1024 (as GPU memory is
// quoted: an "80G" card). Case does not matter.
var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// sizeHelp says what a byte size may be, for -h and the error.
const sizeHelp = "bytes, with an optional unit in any case: KiB, MiB, GiB, TiB and K, M, G, T are powers of 1024; KB, MB, GB, TB powers of 1000"

func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range sizeUnits {
		if len(t) >= len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v >= 0) { // also rejects NaN
		return 0, fmt.Errorf("%q is not a byte size: want %s (examples: 8GiB, 512MiB, 12GB, 1000000)", s, sizeHelp)
	}
	// Converting a float64 at or above 2^63 (or +Inf) to int64 is
	// implementation-defined in Go; reject it instead.
	if v*mult >= 1<<63 {
		return 0, fmt.Errorf("%q is too large a byte size", s)
	}
	return int64(v * mult), nil
}
