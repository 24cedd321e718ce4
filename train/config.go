// Package train ties the pieces together into a training run: it resolves
// the model and data, checks the memory plan against the device budget,
// runs the steps with evaluation, checkpoints and metrics, and exports the
// result as a Hugging Face checkpoint.
package train

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// Config is one training run; the command's flags map onto it one to one
// (the flag name is in each comment).
type Config struct {
	Model     string  // --model: a preset name or a Hugging Face checkpoint directory
	Data      string  // --data: "builtin", "builtin:TASK[:N]", an Alpaca .json/.jsonl file, or a text file
	Steps     int     // --steps: optimizer steps (0: from --epochs)
	Epochs    float64 // --epochs: passes over the training set when --steps is 0
	Batch     int     // --batch: rows per micro-batch (B)
	SeqLen    int     // --seq-len: tokens per row (T)
	GradAccum int     // --grad-accum: micro-batches per step

	LR, MinLR   float64 // --lr, --min-lr: peak and final learning rate
	Warmup      int     // --warmup: linear warmup steps
	WeightDecay float64 // --weight-decay
	Beta1       float64 // --beta1
	Beta2       float64 // --beta2
	ClipMode    string  // --clip-mode: none, matrix or global-prev
	GradClip    float64 // --grad-clip: max norm

	EvalEvery       int     // --eval-every: steps between evaluations (0: only at the end)
	EvalFraction    float64 // --eval-fraction: share of the data held out
	EvalGenerate    int     // --eval-generate: held-out prompts scored by exact match per eval
	CheckpointEvery int     // --checkpoint-every: steps between checkpoints (0: only at the end)
	Resume          bool    // --resume: continue from <out>/checkpoint.safetensors
	Truncate        bool    // --truncate: cut over-long records instead of dropping them

	Mode          string  // --mode: native, zero or lsp (DESIGN.md section 1)
	GradDType     string  // --grad-dtype: fp32 or bf16 storage of the parameter gradients
	DenseParams   string  // --dense-params: frozen, device or host in lsp mode ("": frozen from a checkpoint, device for a preset)
	D, R          int     // --d, --r: projected size and non-zeros per projector row (capped per matrix)
	Alpha         float64 // --alpha: bias ratio the projector fit must reach
	CheckEvery    int     // --check-every: steps between projector checks
	CalibSamples  int     // --calib-samples: rows of the calibration pass
	ProjLR        float64 // --proj-lr: Adam step size of the projector fit
	FitIters      int     // --fit-iters: step budget of one projector fit
	NoFit         bool    // --no-fit: keep the random projectors (a control)
	Schedule      string  // --schedule: pipelined or sequential
	LinkBandwidth int64   // --link-bandwidth: bytes/s charged per device-host copy on the CPU backend (0: free)

	Seed      uint64 // --seed
	Device    string // --device: cpu (cuda comes later)
	DeviceMem int64  // --device-mem: device memory budget in bytes (0: unlimited)
	DType     string // --dtype: fp32 or bf16 storage of weights and activations
	Threads   int    // --threads: compute threads (0: all cores)
	Out       string // --out: output directory
}

// Defaults is the default job: the tiny model on the built-in sorting
// task (sort the letters of a word), sized to finish in about a minute on two cores.
func Defaults() Config {
	return Config{
		Model: "tiny", Data: "builtin:sort", Steps: 600, Batch: 32, SeqLen: 24, GradAccum: 1,
		LR: 3e-3, MinLR: 3e-4, Warmup: 30, WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95,
		ClipMode: "matrix", GradClip: 1, EvalEvery: 100, EvalFraction: 0.05, EvalGenerate: 200,
		CheckpointEvery: 200, Seed: 1, Device: "cpu", DType: "fp32", Out: "out",
		Mode: "native", GradDType: "fp32", D: 512, R: 16, Alpha: 0.5, CheckEvery: 100, CalibSamples: 32, ProjLR: 0.05, FitIters: 200,
		Schedule: "pipelined",
	}
}

// FlagError is a bad flag value; Flag names it.
type FlagError struct {
	Flag string
	Msg  string
}

func (e *FlagError) Error() string { return fmt.Sprintf("--%s: %s", e.Flag, e.Msg) }

func flagErr(flag, format string, a ...any) error {
	return &FlagError{Flag: flag, Msg: fmt.Sprintf(format, a...)}
}

// Validate checks the values that do not need the model or data.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, flag, format string, a ...any) {
		if !ok {
			errs = append(errs, flagErr(flag, format, a...))
		}
	}
	check(c.Steps >= 0, "steps", "must be >= 0, got %d", c.Steps)
	check(c.Steps > 0 || c.Epochs > 0, "steps", "set --steps or --epochs to a positive value")
	check(c.Batch > 0, "batch", "must be positive, got %d", c.Batch)
	check(c.SeqLen > 0, "seq-len", "must be positive, got %d", c.SeqLen)
	check(c.GradAccum > 0, "grad-accum", "must be positive, got %d", c.GradAccum)
	check(c.LR > 0, "lr", "must be positive, got %g", c.LR)
	check(c.MinLR >= 0 && c.MinLR <= c.LR, "min-lr", "must be in [0, --lr], got %g", c.MinLR)
	check(c.Warmup >= 0, "warmup", "must be >= 0, got %d", c.Warmup)
	check(c.WeightDecay >= 0, "weight-decay", "must be >= 0, got %g", c.WeightDecay)
	check(c.Beta1 >= 0 && c.Beta1 < 1, "beta1", "must be in [0, 1), got %g", c.Beta1)
	check(c.Beta2 >= 0 && c.Beta2 < 1, "beta2", "must be in [0, 1), got %g", c.Beta2)
	if _, err := optim.ParseClipMode(c.ClipMode); err != nil {
		errs = append(errs, flagErr("clip-mode", "%v", err))
	}
	check(c.ClipMode == "none" || c.GradClip > 0, "grad-clip", "must be positive with --clip-mode %s, got %g", c.ClipMode, c.GradClip)
	check(c.EvalEvery >= 0, "eval-every", "must be >= 0, got %d", c.EvalEvery)
	check(c.EvalFraction >= 0 && c.EvalFraction < 1, "eval-fraction", "must be in [0, 1), got %g", c.EvalFraction)
	check(c.EvalGenerate >= 0, "eval-generate", "must be >= 0, got %d", c.EvalGenerate)
	check(c.CheckpointEvery >= 0, "checkpoint-every", "must be >= 0, got %d", c.CheckpointEvery)
	check(c.Device == "cpu", "device", "%q is not available in this build (cpu only; cuda comes with the CUDA backend)", c.Device)
	check(c.DeviceMem >= 0, "device-mem", "must be >= 0, got %d", c.DeviceMem)
	if _, err := backend.ParseDType(c.DType); err != nil {
		errs = append(errs, flagErr("dtype", "%v", err))
	}
	check(c.Threads >= 0, "threads", "must be >= 0, got %d", c.Threads)
	if _, err := engine.ParseMode(c.Mode); err != nil {
		errs = append(errs, flagErr("mode", "%v", err))
	}
	if _, err := backend.ParseDType(c.GradDType); err != nil {
		errs = append(errs, flagErr("grad-dtype", "%v", err))
	}
	if c.DenseParams != "" {
		if _, err := engine.ParseDenseParams(c.DenseParams); err != nil {
			errs = append(errs, flagErr("dense-params", "%v", err))
		}
	}
	check(c.Schedule == "pipelined" || c.Schedule == "sequential", "schedule", "must be pipelined or sequential, got %q", c.Schedule)
	check(c.LinkBandwidth >= 0, "link-bandwidth", "must be >= 0, got %d", c.LinkBandwidth)
	if c.Mode == string(engine.LSP) {
		// The engine's own check names each flag (--d, --r, --alpha, ...).
		if err := c.engineConfig(false).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	check(c.Out != "", "out", "must not be empty")
	check(c.Model != "", "model", "must not be empty")
	check(c.Data != "", "data", "must not be empty")
	return errors.Join(errs...)
}

// ResolveModel returns the architecture of --model, a preset name or a
// checkpoint directory, and whether it is a checkpoint.
func ResolveModel(model string) (gpt2.Config, bool, error) {
	if st, err := os.Stat(model); err == nil && st.IsDir() {
		cfg, err := gpt2.ReadHFConfig(model)
		if err != nil {
			return gpt2.Config{}, false, flagErr("model", "%v", err)
		}
		return cfg, true, nil
	}
	cfg, err := gpt2.Preset(model)
	if err != nil {
		if filepath.IsAbs(model) || filepath.Base(model) != model {
			return gpt2.Config{}, false, flagErr("model", "%s is neither a checkpoint directory nor a preset", model)
		}
		return gpt2.Config{}, false, flagErr("model", "%v", err)
	}
	return cfg, false, nil
}

// engineConfig is the engine's part of the configuration; fromCheckpoint
// picks the default of --dense-params.
func (c Config) engineConfig(fromCheckpoint bool) engine.Config {
	clip, _ := optim.ParseClipMode(c.ClipMode)
	dense := engine.DenseParams(c.DenseParams)
	if dense == "" {
		dense = engine.DenseDevice
		if fromCheckpoint {
			dense = engine.DenseFrozen
		}
	}
	gdt, _ := backend.ParseDType(c.GradDType)
	return engine.Config{
		GradDType: gdt, Mode: engine.Mode(c.Mode), DenseParams: dense, Pipelined: c.Schedule != "sequential", Seed: c.Seed,
		Hyper: optim.Hyper{Beta1: float32(c.Beta1), Beta2: float32(c.Beta2), Eps: 1e-8,
			WeightDecay: float32(c.WeightDecay), Clip: clip, MaxNorm: float32(c.GradClip)},
		LSP: engine.LSPConfig{D: c.D, R: c.R, Alpha: c.Alpha, CheckEvery: c.CheckEvery, CalibSamples: c.CalibSamples,
			ProjLR: c.ProjLR, FitIters: c.FitIters, NoFit: c.NoFit},
		HostThreads: c.Threads,
	}
}
