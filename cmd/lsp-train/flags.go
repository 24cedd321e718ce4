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
	"slices"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/engine"
)

func bindTrainFlags(fs *flag.FlagSet, c *train.Config) {
	fs.StringVar(&c.Model, "model", c.Model, "`MODEL`: a preset (from random weights; "+catalog.PresetList()+
		"), a Hugging Face checkpoint directory (config.json model_type "+strings.Join(catalog.ModelTypes(), ", ")+"), or a llama2.c model .bin (tokenizer.bin beside it)")
	fs.StringVar(&c.Tokenizer, "tokenizer", c.Tokenizer, "the tokenizer `FILE` instead of --model's: a tokenizer.json, a vocab.json (merges.txt beside it), a directory holding one, a llama2.c tokenizer .bin, or byte or gpt2")
	fs.StringVar(&c.Data, "data", c.Data, "training `DATA`: builtin (builtin:sort), builtin:TASK[:N] (tasks: reverse, sort, add, copy), an Alpaca .json/.jsonl file, or a plain-text file")
	fs.IntVar(&c.Steps, "steps", c.Steps, fmt.Sprintf("optimizer steps (%d when neither --steps nor --epochs is given; not both)", train.DefaultSteps))
	fs.Float64Var(&c.Epochs, "epochs", c.Epochs, "passes over the training data, instead of --steps")
	fs.IntVar(&c.Batch, "batch", c.Batch, "rows per micro-batch")
	fs.IntVar(&c.SeqLen, "seq-len", c.SeqLen, "tokens per row (at most the model context); longer records are dropped (or cut: --truncate)")
	fs.IntVar(&c.GradAccum, "grad-accum", c.GradAccum, "micro-batches accumulated per optimizer step")
	fs.Float64Var(&c.LR, "lr", c.LR, "peak learning rate (after warmup; cosine decay to --min-lr)")
	fs.Float64Var(&c.MinLR, "min-lr", c.MinLR, "learning rate at the last step")
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, "linear warmup steps")
	fs.Float64Var(&c.WeightDecay, "weight-decay", c.WeightDecay, "decoupled weight decay of matrices and embeddings")
	fs.Float64Var(&c.Beta1, "beta1", c.Beta1, "AdamW beta1")
	fs.Float64Var(&c.Beta2, "beta2", c.Beta2, "AdamW beta2")
	fs.Var(&c.ClipMode, "clip-mode", "gradient clipping `MODE`: none, matrix (each tensor by its norm) or global-prev (by the previous step's global norm)")
	fs.Float64Var(&c.GradClip, "grad-clip", c.GradClip, "max gradient norm for clipping")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "steps between evaluations (0: only at the end)")
	fs.Float64Var(&c.EvalFraction, "eval-fraction", c.EvalFraction, "share of the data held out for evaluation")
	fs.IntVar(&c.EvalGenerate, "eval-generate", c.EvalGenerate, "held-out prompts scored by greedy exact match at each evaluation")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "steps between checkpoints (0: only at the end)")
	fs.BoolVar(&c.Resume, "resume", c.Resume, "continue from <out>/checkpoint.safetensors (the run's settings must match the checkpoint's, except the length, eval and checkpoint cadence, and where it runs)")
	fs.BoolVar(&c.Overwrite, "overwrite", c.Overwrite, "start a new run in a non-empty --out, removing the earlier run's checkpoint, metrics, plot and hf/")
	fs.BoolVar(&c.Truncate, "truncate", c.Truncate, "cut records longer than --seq-len instead of dropping them")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (initialisation, data order, split)")
	fs.Var(&c.Device, "device", deviceUsage())
	fs.Var((*byteSize)(&c.DeviceMem), "device-mem", "device memory budget, e.g. 8GiB or 512MiB (0: unlimited); checked before training")
	fs.Var((*byteSize)(&c.HostMem), "host-mem", "host memory budget, e.g. 16GiB (0: the memory the machine has available, MemAvailable of /proc/meminfo); checked before training")
	fs.Var(&c.DType, "dtype", "storage `TYPE` of weights and activations: fp32 or bf16 (default: bf16 with --device cuda, fp32 on cpu; Adam moments are fp32 either way, and so are the master weights of every parameter that has one: all but lsp's block matrices, whose bf16 weights are updated by stochastic rounding)")
	fs.IntVar(&c.Threads, "threads", c.Threads, "compute threads (0: all cores)")
	fs.Var(&c.Mode, "mode", "update `MODE`: native (everything on the device), zero (ZeRO-Offload: grads down, CPU Adam, weights up) or lsp (LSP-Offload: learned sparse projectors, d x d over the link)")
	fs.Var(&c.GradDType, "grad-dtype", "storage `TYPE` of the parameter gradients: fp32 or bf16 (native and zero; lsp's compressed S is fp32)")
	fs.Var(&c.DenseParams, "dense-params", "lsp mode: `WHERE` the parameters other than block matrices train: frozen, device or host (default: frozen from a checkpoint, device for a preset)")
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
	fs.BoolVar(&c.StartRandom, "start-random", c.StartRandom, "lsp: no projector check before step 1 (train on the random projectors until the first --check-every)")
	fs.BoolVar(&c.ShareLayers, "share-layers", c.ShareLayers, "lsp: one projector pair per matrix kind, fitted on every layer's gradients (as the paper's code)")
	fs.BoolVar(&c.NoGain, "no-gain", c.NoGain, "lsp: apply the update without the projectors' per-column gains (a control)")
	fs.Var(&c.Collectives, "collectives", "`WHERE` several ranks (mpirun) sum lsp's S and the device AdamW's gradients: nccl (on the GPUs), host (copied to pinned memory, over MPI) or auto (nccl on the CUDA backend when libnccl.so.2 loads, else host)")
	fs.Var(&c.Schedule, "schedule", "`ORDER` of a step's ops: pipelined (copies and host Adam overlap the backward) or sequential (one op at a time; the reference)")
	fs.Var(&c.Recompute, "recompute", "`WHAT` the backward recomputes instead of keeping from the forward: none, attn (each block's attention) or layer (all of each block but its output); less device memory for more compute, the same results (lsp-train plan says which a model needs)")
	fs.Var(&c.GradResidency, "grad-residency", "zero and lsp: `WHERE` the gradients (lsp: S and the projectors) wait on the device: whole (all of them, for the step), ring (a few blocks' at a time, each copied down as its backward ends: less device memory, the gradients or S down once per micro-batch, lsp's projectors up once per micro-batch under --recompute layer) or auto (whole when it fits --device-mem)")
	fs.Var((*byteSize)(&c.LinkBandwidth), "link-bandwidth", "cpu device: charge device-host copies at this many bytes/s, e.g. 12GB (0: free)")
	fs.Var(&c.OnNonFinite, "on-nonfinite", "`ACTION` on a step whose loss is NaN or infinite: stop (without saving that step) or skip (update nothing, go on with the next batch)")
	fs.IntVar(&c.MaxSkips, "max-skips", c.MaxSkips, "with --on-nonfinite skip, the most steps skipped in a row; one more stops the run")
	fs.StringVar(&c.Out, "out", c.Out, "output `DIR`; without --out each run reuses out/, while a given non-empty one needs --resume or --overwrite")
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
	{"seq-len", groupModelData},
	{"truncate", groupModelData},
	{"eval-fraction", groupModelData},
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
	{"on-nonfinite", groupTraining},
	{"max-skips", groupTraining},
	{"mode", groupOffload},
	{"grad-dtype", groupOffload},
	{"dense-params", groupOffload},
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
	{"start-random", groupOffload},
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

Any flag may also come from a JSON file: --config FILE; flags on the command line win.
%s

Subcommands (lsp-train SUBCOMMAND -h describes their flags):
`, backendsLine())
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
		if def := f.DefValue; def != "" && def != "0" && def != "false" {
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
		return fmt.Errorf("%v%s; %s -h lists the flags", err, didYouMean(fs, err), fs.Name())
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with -); %s -h lists the flags", fs.Arg(0), fs.Name())
	}
	return nil
}

// didYouMean names the flag closest to an undefined one (" (did you
// mean --steps?)"), when one is close: at most two edits away, or one
// name holding the other.
func didYouMean(fs *flag.FlagSet, err error) string {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: ")
	if !ok {
		return ""
	}
	name = strings.TrimLeft(name, "-")
	best, bestDist := "", 3
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if len(name) >= 3 && len(f.Name) >= 3 && (strings.Contains(f.Name, name) || strings.Contains(name, f.Name)) {
			d = min(d, 2)
		}
		if d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	if best == "" {
		return ""
	}
	return " (did you mean --" + best + "?)"
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// fitFlags are the lsp settings of the projector checks, which run only
// with --fit.
var fitFlags = []string{"alpha", "check-every", "calib-samples", "proj-lr", "fit-iters", "refit", "accept", "rewarm",
	"proj-ortho", "start-random", "share-layers"}

// checkFitFlags refuses a check setting given (on the command line or in
// the config file) to an lsp run without --fit: since lsp keeps its
// random projectors by default, such a setting would be ignored, and a
// run that asked for checks would silently have none.
func checkFitFlags(fs *flag.FlagSet, c train.Config) error {
	if c.Mode != engine.LSP || c.Fit {
		return nil
	}
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(fitFlags, f.Name) {
			given = append(given, "--"+f.Name)
		}
	})
	if len(given) == 0 {
		return nil
	}
	return fmt.Errorf("%s: only projector checks use this, and lsp runs them with --fit only "+
		"(without it the random projectors drawn at the start are kept): add --fit or drop it", strings.Join(given, ", "))
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
