// Package train is the training run: from its configuration (the
// command's flags) it resolves the model and data, checks the memory plan
// against the device budget, runs the steps with evaluation, checkpoints
// and metrics, and exports the result as a Hugging Face checkpoint.
//
// The run uses the other packages for the rest of the work: train/device
// opens the backend, train/engine runs the steps, train/eval scores the
// model, train/checkpoint is the checkpoint format; the compare job, which
// starts runs of its own, is train/compare.
package train

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
	"github.com/lsp-offload/lsp-offload/train/galore"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// Config is one training run; the command's flags map onto it one to one
// (the flag name is in each comment).
type Config struct {
	Model     string  // --model: a preset name or a Hugging Face checkpoint directory
	Data      string  // --data: "builtin", "builtin:TASK[:N]", a .json/.jsonl file (Alpaca, messages or ShareGPT), or a text file
	Tokenizer string  // --tokenizer: a tokenizer.json, vocab.json, directory or builtin name instead of --model's ("": --model's)
	Steps     int     // --steps: optimizer steps (0: from --epochs, or DefaultSteps when neither is set)
	Epochs    float64 // --epochs: passes over the training set instead of --steps (0: unset)
	Batch     int     // --batch: rows per micro-batch (B)
	SeqLen    int     // --seq-len: tokens per row (T)
	GradAccum int     // --grad-accum: micro-batches per step

	// --chat-template: a Jinja file (or a JSON file with chat_template)
	// conversations are rendered with instead of the checkpoint's
	// tokenizer_config.json chat_template ("": the checkpoint's, else the
	// fixed format).
	ChatTemplate string

	LR, MinLR   float64        // --lr, --min-lr: peak and final learning rate
	Warmup      int            // --warmup: linear warmup steps
	WeightDecay float64        // --weight-decay
	Beta1       float64        // --beta1
	Beta2       float64        // --beta2
	ClipMode    optim.ClipMode // --clip-mode: none, matrix or global-prev
	GradClip    float64        // --grad-clip: max norm

	EvalEvery       int     // --eval-every: steps between evaluations (0: only at the end)
	EvalFraction    float64 // --eval-fraction: share of the data held out
	EvalData        string  // --eval-data: a held-out file of its own, in any format --data reads, instead of the split (EvalFraction 0)
	EvalGenerate    int     // --eval-generate: held-out prompts scored by exact match per eval, at most
	EvalTokens      int     // --eval-tokens: held-out tokens (rows x --seq-len) of the eval loss, at most
	EvalMaxNew      int     // --eval-max-new: exact match scores prompts whose response fits this many new tokens
	CheckpointEvery int     // --checkpoint-every: steps between checkpoints (0: only at the end)
	KeepCheckpoints int     // --keep-checkpoints: checkpoints kept, the latest and step-numbered ones in <out>/checkpoints/ (0 or 1: the latest only)
	ExportEvery     int     // --export-every: steps between Hugging Face exports into <out>/hf-step-NNNNNN/ (0: only the final hf/)
	Resume          bool    // --resume: continue from <out>/checkpoint.safetensors
	Overwrite       bool    // --overwrite: replace the outputs of an earlier run in a non-empty --out
	Truncate        bool    // --truncate: cut over-long records instead of dropping them

	Mode          engine.Mode        // --mode: native, zero, lsp, lora or galore (docs/DESIGN.md, "The update modes")
	GradDType     backend.DType      // --grad-dtype: fp32 or bf16 storage of the parameter gradients
	DenseParams   engine.DenseParams // --dense-params: frozen, device or host in lsp and lora modes ("": frozen from a checkpoint, device for a preset)
	LoRAR         int                // --lora-r: the adapters' rank
	LoRAAlpha     float64            // --lora-alpha: the term is scaled by alpha / r
	LoRADropout   float64            // --lora-dropout
	LoRATargets   string             // --lora-targets: comma-separated Hugging Face module names ("": the family's every attention and MLP linear)
	BaseDType     string             // --base-dtype: nf4 or int8 stores lora's frozen block matrices quantized (QLoRA); "": in --dtype
	GaloreRank    int                // --galore-rank: the singular vectors GaLore keeps per matrix
	GaloreEvery   int                // --galore-every: steps between GaLore's projector refreshes
	GaloreScale   float64            // --galore-scale: the back-projected update's factor
	Adapter       string             // --adapter: a PEFT LoRA adapter directory to start from (lora mode) or to sample with
	D, R          int                // --d, --r: projected size and non-zeros per projector row (capped per matrix)
	Alpha         float64            // --alpha: bias ratio the projector fit must reach
	CheckEvery    int                // --check-every: steps between projector checks
	CalibSamples  int                // --calib-samples: rows of the calibration pass
	ProjLR        float64            // --proj-lr: Adam step size of the projector fit
	FitIters      int                // --fit-iters: step budget of one projector fit
	Fit           bool               // --fit: fit the projectors at each check (the paper's learned projectors); otherwise the random ones are kept
	Refit         lsp.Refit          // --refit: how a check makes new projectors (sum, split or random)
	Accept        lsp.Accept         // --accept: what decides whether they replace the old ones (heldout or fit)
	Rewarm        lsp.Rewarm         // --rewarm: how a refitted matrix is re-warmed (floor, measured, change or off)
	NoGain        bool               // --no-gain: apply Delta without the projectors' per-column gains (a control)
	ProjOrtho     float64            // --proj-ortho: weight of the fit's column-orthogonality penalty
	CheckAtStart  bool               // --check-at-start: a projector check before step 1 too (with --fit)
	ShareLayers   bool               // --share-layers: one projector pair per matrix kind, fitted on every layer
	Projector     lsp.Kind           // --projector: sparse, svd (top singular vectors of the calibration gradient) or gaussian (dense, drawn once)
	Schedule      Schedule           // --schedule: pipelined or sequential
	Collectives   Collectives        // --collectives: where several ranks sum what the device reads back (auto, host or nccl)
	Recompute     model.Recompute    // --recompute: none, attn or layer (activations recomputed in the backward)
	Pack          bool               // --pack: several examples per row, attention and positions per example
	LinkBandwidth int64              // --link-bandwidth: bytes/s charged per device-host copy on the CPU backend (0: free)

	// GradResidency is --grad-residency: where zero mode keeps the
	// gradients on the device, whole or in a ring of per-group slots;
	// auto: whole when the run's plan fits --device-mem, the ring
	// otherwise (ResolveGradResidency).
	GradResidency engine.GradResidency

	OnNonFinite NonFinite // --on-nonfinite: stop (the default) or skip a step whose loss is NaN or infinite
	MaxSkips    int       // --max-skips: with skip, the most steps skipped in a row; one more stops the run

	Seed      uint64        // --seed
	Device    device.Kind   // --device: cpu, cuda or cuda:N (cuda in a -tags cuda build)
	DeviceMem int64         // --device-mem: device memory budget in bytes (0: unlimited)
	HostMem   int64         // --host-mem: host memory budget in bytes (0: the machine's available memory, where known)
	DType     backend.DType // --dtype: fp32 or bf16 storage of weights and activations (the command's default: Device.DefaultDType)
	Threads   int           // --threads: compute threads (0: all cores)
	Out       string        // --out: output directory
}

// DefaultSteps is the length of a run given neither --steps nor --epochs.
const DefaultSteps = 600

// The default caps of an evaluation's cost (docs/DESIGN.md, "The end of a
// run"): the eval loss reads at most DefaultEvalTokens held-out tokens
// (16 windows of 1024, 64 of 256), and exact match generates for prompts
// whose response fits DefaultEvalMaxNew tokens, so that on a CPU an
// evaluation of a 1B model takes minutes, not the hour a whole held-out
// split of a text corpus takes; --eval-tokens 0 and --eval-max-new 0
// lift them.
const (
	DefaultEvalTokens = 16384
	DefaultEvalMaxNew = 32
)

// Defaults is the default job: the tiny model on the built-in sorting
// task (sort the letters of a word), sized to finish in about a minute on
// two cores. Steps and Epochs are both unset, so that either may be given
// alone (DefaultSteps when neither is).
func Defaults() Config {
	return Config{
		Model: "tiny", Data: "builtin:sort", Batch: 32, SeqLen: 24, GradAccum: 1,
		LR: 3e-3, MinLR: 3e-4, Warmup: 30, WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95,
		ClipMode: optim.ClipMatrix, GradClip: 1, EvalEvery: 100, EvalFraction: 0.05, EvalGenerate: 200,
		EvalTokens: DefaultEvalTokens, EvalMaxNew: DefaultEvalMaxNew,
		CheckpointEvery: 200, KeepCheckpoints: 1, Seed: 1, Device: device.CPU, DType: backend.F32, Out: "out", GradResidency: engine.ResidencyAuto,
		LoRAR: lora.DefaultR, LoRAAlpha: lora.DefaultAlpha,
		GaloreRank: galore.DefaultRank, GaloreEvery: galore.DefaultEvery, GaloreScale: galore.DefaultScale,
		Mode: engine.Native, GradDType: backend.F32, D: 0, R: 16, Alpha: 0.5, CheckEvery: 100, CalibSamples: 256, ProjLR: 0.05, FitIters: 200,
		Refit: lsp.RefitSplit, Accept: lsp.AcceptHeldOut, Rewarm: lsp.RewarmFloor, Projector: lsp.KindSparse,
		Schedule: Pipelined, Collectives: CollectivesAuto, OnNonFinite: StopOnNonFinite, MaxSkips: 10,
	}
}

// NonFinite is what a run does with a step whose loss is NaN or infinite
// (--on-nonfinite).
type NonFinite string

// What to do with a non-finite loss.
const (
	// StopOnNonFinite stops the run without saving the step (the last
	// checkpoint is kept).
	StopOnNonFinite NonFinite = "stop"
	// SkipNonFinite skips the step: nothing is updated, the batch is
	// consumed, the step is tried again with the next batch; --max-skips
	// in a row are allowed.
	SkipNonFinite NonFinite = "skip"
)

// ParseNonFinite reads an --on-nonfinite value.
func ParseNonFinite(s string) (NonFinite, error) {
	switch v := NonFinite(s); v {
	case StopOnNonFinite, SkipNonFinite:
		return v, nil
	}
	return "", fmt.Errorf("unknown value %q (want stop or skip)", s)
}

// String is the flag spelling.
func (n NonFinite) String() string { return string(n) }

// Set parses an --on-nonfinite value (flag.Value).
func (n *NonFinite) Set(v string) error { return flagerr.Set(n, ParseNonFinite, v) }

// Schedule is the order the engine runs a step's ops in (--schedule).
type Schedule string

// Schedules.
const (
	Pipelined  Schedule = "pipelined"  // copies and host Adam overlap the backward
	Sequential Schedule = "sequential" // one op at a time: the reference
)

// ParseSchedule reads a --schedule value.
func ParseSchedule(s string) (Schedule, error) {
	switch v := Schedule(s); v {
	case Pipelined, Sequential:
		return v, nil
	}
	return "", fmt.Errorf("unknown schedule %q (want pipelined or sequential)", s)
}

// String is the flag spelling.
func (s Schedule) String() string { return string(s) }

// Set parses a --schedule value (flag.Value).
func (s *Schedule) Set(v string) error { return flagerr.Set(s, ParseSchedule, v) }

// Collectives says where the ranks of a data-parallel run sum what the
// device reads back: lsp's S and the gradients of a device AdamW
// (--collectives).
type Collectives string

// Collectives choices.
const (
	// CollectivesAuto sums on the device (NCCL) on a backend that has a
	// device communicator and can start it, else on the host.
	CollectivesAuto Collectives = "auto"
	// CollectivesHost copies them to pinned memory and sums them on the
	// host over MPI.
	CollectivesHost Collectives = "host"
	// CollectivesNCCL sums them on the device with NCCL, or fails.
	CollectivesNCCL Collectives = "nccl"
)

// ParseCollectives reads a --collectives value.
func ParseCollectives(s string) (Collectives, error) {
	switch v := Collectives(s); v {
	case CollectivesAuto, CollectivesHost, CollectivesNCCL:
		return v, nil
	}
	return "", fmt.Errorf("unknown collectives %q (want auto, host or nccl)", s)
}

// String is the flag spelling.
func (c Collectives) String() string { return string(c) }

// Set parses a --collectives value (flag.Value).
func (c *Collectives) Set(v string) error { return flagerr.Set(c, ParseCollectives, v) }

// FlagError is a bad flag value; Flag names it.
type FlagError = flagerr.Error

var flagErr = flagerr.New

// Validate checks the values that do not need the model or data.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, flag, format string, a ...any) {
		if !ok {
			errs = append(errs, flagErr(flag, format, a...))
		}
	}
	check(c.Steps >= 0, "steps", "must be >= 0, got %d", c.Steps)
	check(c.Epochs >= 0 && !math.IsInf(c.Epochs, 0), "epochs", "must be >= 0 and finite, got %g", c.Epochs)
	// Both set would leave one silently ignored.
	check(c.Steps == 0 || c.Epochs == 0, "epochs", "%g contradicts --steps %d: give one of them (--steps counts optimizer steps, --epochs passes over the data)",
		c.Epochs, c.Steps)
	check(c.Batch > 0, "batch", "must be positive, got %d", c.Batch)
	check(c.SeqLen > 0, "seq-len", "must be positive, got %d", c.SeqLen)
	check(c.GradAccum > 0, "grad-accum", "must be positive, got %d", c.GradAccum)
	check(c.LR > 0, "lr", "must be positive, got %g", c.LR)
	check(c.MinLR >= 0 && c.MinLR <= c.LR, "min-lr", "must be in [0, --lr = %g], got %g (with a lower --lr, give --min-lr too, say a tenth of it)", c.LR, c.MinLR)
	check(c.Warmup >= 0, "warmup", "must be >= 0, got %d", c.Warmup)
	check(c.WeightDecay >= 0, "weight-decay", "must be >= 0, got %g", c.WeightDecay)
	check(c.Beta1 >= 0 && c.Beta1 < 1, "beta1", "must be in [0, 1), got %g", c.Beta1)
	check(c.Beta2 >= 0 && c.Beta2 < 1, "beta2", "must be in [0, 1), got %g", c.Beta2)
	if _, err := optim.ParseClipMode(string(c.ClipMode)); err != nil {
		errs = append(errs, flagErr("clip-mode", "%v", err))
	}
	check(c.ClipMode == optim.ClipNone || c.GradClip > 0, "grad-clip", "must be positive with --clip-mode %s, got %g", c.ClipMode, c.GradClip)
	check(c.EvalEvery >= 0, "eval-every", "must be >= 0, got %d", c.EvalEvery)
	check(c.EvalFraction >= 0 && c.EvalFraction < 1, "eval-fraction", "must be in [0, 1), got %g", c.EvalFraction)
	// Both would hold out two eval sets, one of them silently unused.
	check(c.EvalData == "" || c.EvalFraction == 0, "eval-fraction", "%g contradicts --eval-data %s: give one of them (--eval-data is the held-out set, --eval-fraction a share of --data held out)",
		c.EvalFraction, c.EvalData)
	check(c.EvalGenerate >= 0, "eval-generate", "must be >= 0, got %d", c.EvalGenerate)
	check(c.EvalTokens >= 0, "eval-tokens", "must be >= 0 (0: the whole held-out set), got %d", c.EvalTokens)
	check(c.EvalMaxNew >= 0, "eval-max-new", "must be >= 0 (0: no limit), got %d", c.EvalMaxNew)
	check(c.CheckpointEvery >= 0, "checkpoint-every", "must be >= 0, got %d", c.CheckpointEvery)
	check(c.KeepCheckpoints >= 0, "keep-checkpoints", "must be >= 0 (0 and 1: the latest only), got %d", c.KeepCheckpoints)
	check(c.ExportEvery >= 0, "export-every", "must be >= 0, got %d", c.ExportEvery)
	if err := device.Check(c.Device); err != nil {
		errs = append(errs, flagErr("device", "%v", err))
	}
	check(c.DeviceMem >= 0, "device-mem", "must be >= 0, got %d", c.DeviceMem)
	check(c.HostMem >= 0, "host-mem", "must be >= 0, got %d", c.HostMem)
	check(storageDType(c.DType), "dtype", "%v is not a storage type (want fp32 or bf16)", c.DType)
	if err := device.CheckDType(c.Device, c.DType); err != nil {
		errs = append(errs, flagErr("dtype", "%v with --device %s: %v", c.DType, c.Device, err))
	}
	check(c.Threads >= 0, "threads", "must be >= 0, got %d", c.Threads)
	if _, err := engine.ParseMode(string(c.Mode)); err != nil {
		errs = append(errs, flagErr("mode", "%v", err))
	}
	check(storageDType(c.GradDType), "grad-dtype", "%v is not a storage type (want fp32 or bf16)", c.GradDType)
	if c.DenseParams != "" {
		if _, err := engine.ParseDenseParams(string(c.DenseParams)); err != nil {
			errs = append(errs, flagErr("dense-params", "%v", err))
		}
	}
	if c.GradResidency != "" { // "": auto, as in a Config not from Defaults
		if _, err := engine.ParseGradResidency(string(c.GradResidency)); err != nil {
			errs = append(errs, flagErr("grad-residency", "%v", err))
		}
	}
	check(c.GradResidency != engine.ResidencyRing || c.Mode != engine.Native, "grad-residency",
		"ring is zero's and lsp's (their host Adam takes the gradients, or S, block by block); --mode %s keeps its gradients whole on the device", c.Mode)
	if _, err := ParseSchedule(string(c.Schedule)); err != nil {
		errs = append(errs, flagErr("schedule", "%v", err))
	}
	if _, err := ParseCollectives(string(c.Collectives)); err != nil {
		errs = append(errs, flagErr("collectives", "%v", err))
	}
	if c.Collectives == CollectivesNCCL && c.Device.Base() != device.CUDA {
		errs = append(errs, flagErr("collectives", "nccl sums on CUDA devices; --device is %s (use host or auto)", c.Device))
	}
	check(c.LinkBandwidth >= 0, "link-bandwidth", "must be >= 0, got %d", c.LinkBandwidth)
	if _, err := ParseNonFinite(string(c.OnNonFinite)); err != nil {
		errs = append(errs, flagErr("on-nonfinite", "%v", err))
	}
	check(c.MaxSkips >= 1, "max-skips", "must be at least 1, got %d (--on-nonfinite stop skips none)", c.MaxSkips)
	check(c.LoRADropout == 0 || c.Mode != engine.LoRA, "lora-dropout", "%g: only 0 is supported (the adapters take the matrix's input as it is; dropout on it is not implemented)", c.LoRADropout)
	check(c.BaseDType == "" || c.Mode == engine.LoRA, "base-dtype", "%s quantizes the frozen base of --mode lora (--mode is %s: its block matrices are trained, so they stay in --dtype)", c.BaseDType, c.Mode)
	if _, err := lora.ParseBaseDType(c.BaseDType); err != nil {
		errs = append(errs, flagErr("base-dtype", "%v", strings.TrimPrefix(err.Error(), "--base-dtype: ")))
	}
	check(c.Adapter == "" || c.Mode == engine.LoRA, "adapter", "loads a LoRA adapter to train on in --mode lora (--mode is %s); sample takes one too", c.Mode)
	// svd projectors are refreshed at every check without it: --fit fits
	// sparse ones.
	check(!c.Fit || c.Projector != lsp.KindSVD || c.Mode != engine.LSP, "fit", "with --projector svd: svd projectors are refreshed from the calibration gradient's singular vectors at every check, which svd runs without --fit (--fit fits sparse projectors)")
	if c.Mode == engine.LSP || c.Mode == engine.LoRA || c.Mode == engine.Galore {
		// The engine's own check names each flag (--d, --r, --alpha,
		// --lora-r, --galore-rank, ...).
		if err := c.engineConfig(false).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	check(c.Out != "", "out", "must not be empty")
	check(!c.Resume || !c.Overwrite, "overwrite", "contradicts --resume: --resume continues the run in --out, --overwrite replaces it")
	check(c.Model != "", "model", "must not be empty")
	check(c.Data != "", "data", "must not be empty")
	return errors.Join(errs...)
}

// engineConfig is the engine's part of the configuration; fromCheckpoint
// picks the default of --dense-params.
func (c Config) engineConfig(fromCheckpoint bool) engine.Config {
	return engine.Config{
		GradDType: c.GradDType, Mode: c.Mode, DenseParams: c.denseParams(fromCheckpoint), Pipelined: c.Schedule != Sequential, Seed: c.Seed,
		Recompute: c.Recompute, GradResidency: c.GradResidency, Packed: c.Pack,
		Hyper: optim.Hyper{Beta1: float32(c.Beta1), Beta2: float32(c.Beta2), Eps: 1e-8,
			WeightDecay: float32(c.WeightDecay), Clip: c.ClipMode, MaxNorm: float32(c.GradClip)},
		LSP: lsp.Config{D: c.D, R: c.R, Alpha: c.Alpha, CheckEvery: c.CheckEvery, CalibSamples: c.CalibSamples,
			ProjLR: c.ProjLR, FitIters: c.FitIters, NoFit: !c.Fit && c.Projector != lsp.KindSVD, Refit: c.Refit, Accept: c.Accept, Rewarm: c.Rewarm, NoGain: c.NoGain, Ortho: c.ProjOrtho, StartRandom: !c.CheckAtStart, ShareLayers: c.ShareLayers,
			Projector: c.Projector},
		LoRA:        lora.Config{R: c.LoRAR, Alpha: c.LoRAAlpha, Dropout: c.LoRADropout, Targets: lora.ParseTargets(c.LoRATargets), Base: c.baseFormat()},
		Galore:      galore.Config{Rank: c.GaloreRank, Every: c.GaloreEvery, Scale: c.GaloreScale},
		HostThreads: c.Threads,
	}
}

// baseFormat is --base-dtype's format (0: none, or a value Validate
// refuses).
func (c Config) baseFormat() backend.QFormat {
	f, _ := lora.ParseBaseDType(c.BaseDType)
	return f
}

// denseParams is --dense-params with its default resolved: frozen when the
// run starts from a checkpoint, device for a preset.
func (c Config) denseParams(fromCheckpoint bool) engine.DenseParams {
	switch {
	case c.DenseParams != "":
		return c.DenseParams
	case fromCheckpoint:
		return engine.DenseFrozen
	}
	return engine.DenseDevice
}

// storageDType says whether d is a type weights, activations or gradients
// may be stored in.
func storageDType(d backend.DType) bool { return d == backend.F32 || d == backend.BF16 }
