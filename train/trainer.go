// The training run: set-up in named steps, the step loop, evaluation,
// checkpoints, and the outputs a user gets at the end.
//
// Limits: one run per process at a time holds the backend it opens; the
// step measurements (Measurements) cover this process's steps only, not
// those before a resume.

package train

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Result summarises a finished (or interrupted) run.
type Result struct {
	Out         string // the output directory
	Steps       int    // the last step completed, resumed ones included
	Total       int    // the run's length in steps: --steps, from --epochs, or DefaultSteps
	StepsRun    int    // the steps this process ran
	ResumedAt   int    // the checkpoint's step when the run resumed, -1 when it started fresh
	Interrupted bool   // stopped by the context (Ctrl-C) after checkpointing
	TrainLoss   float64
	EvalLoss    float64 // NaN when there is no eval set
	ExactMatch  float64 // NaN when there are no eval records
	// TokensPerSec is the one throughput figure of a run: tokens of this
	// process's steps over their wall time (Times.Train). The progress
	// display shows it as the steps go; metrics.jsonl has each step's
	// own tokens over its own time.
	TokensPerSec float64
	Elapsed      time.Duration // wall time of the whole run in this process, every phase
	Times        Times         // Elapsed by phase
	Checkpoint   string
	Export       string // Hugging Face directory with the final weights ("" when interrupted)
	Metrics      string
	Plot         string    // the loss plot ("" when there was no loss to plot)
	Losses       []float64 // train loss of every step of this process, in order
	// Ranks is the number of processes that trained together (1 alone).
	Ranks int
	// CommBytesPerStep is the mean payload this rank sent to other ranks
	// per optimizer step (comm.Stats; 0 alone).
	CommBytesPerStep float64
	// Comm is what each step all-reduced (with several ranks).
	Comm engine.CommStep
}

// Times are the wall times of a run's phases in this process. Elapsed
// minus their sum is the rest: metrics lines, logging, the progress
// display.
type Times struct {
	Setup      time.Duration // model, data, memory plan, engine, resume or initial weights
	Train      time.Duration // the optimizer steps, projector checks (lsp) included
	Eval       time.Duration // evaluations (loss and exact match)
	Checkpoint time.Duration // checkpoint writes
	Export     time.Duration // the Hugging Face export and the loss plot
}

// Measurements are what a run measured of its own steps in this process,
// beside the plan it was checked against: the figures a comparison of
// runs reads (Options.Measurements).
type Measurements struct {
	Memory           Memory  // the predicted memory and link traffic the run was checked against
	StepSeconds      float64 // mean wall time of an optimizer step (engine Step only: no checks, eval or checkpoints)
	CheckSeconds     float64 // total wall time of the projector checks (lsp)
	LinkBytesPerStep float64 // mean device-host bytes (both ways) copied during an optimizer step
	DevicePeak       int64   // the backend's device memory high-water mark at the end
}

// ErrNonFinite reports a NaN or infinite loss (or gradient norm) that
// stopped the run: --on-nonfinite stop, more than --max-skips skipped
// steps in a row, or a non-finite gradient, which cannot be skipped.
var ErrNonFinite = errors.New("non-finite loss")

// Options are the parts of a run that are not configuration.
type Options struct {
	Logger   *slog.Logger
	Progress *os.File // where the progress bar goes (nil: none)
	// Backend, when set, replaces the backend opened from Config (tests
	// use it for hazard mode); the run does not close it.
	Backend backend.Backend
	// StopAfter > 0 stops the run as if interrupted after that step (tests).
	StopAfter int
	// EvalAtStart evaluates once before the first step (a step-0 eval
	// record) when the run starts fresh rather than resuming.
	EvalAtStart bool
	// Measurements, when set, receives the run's measurements when it
	// returns a Result.
	Measurements *Measurements
	// Ready, when set, is called with the engine once setup is done,
	// before the first step (lsp-train profile wraps its graphs).
	Ready func(*engine.Engine) error
	// AfterStep, when set, is called after each step is recorded, with
	// its wall times (lsp-train profile reads the step's timed ops).
	AfterStep func(StepTimes) error
	// CommTimeout is Comm's timeout of a collective, which a run raises
	// to Rank0Wait while the other ranks wait for rank 0 to write and
	// restores after (when Comm has SetTimeout: comm/mpi's).
	CommTimeout time.Duration
	// Comm, when it has more than one rank, trains data-parallel with the
	// other ranks (dataparallel.go); nil or one rank trains alone.
	Comm comm.Communicator
}

// StepTimes are one optimizer step's wall times (Options.AfterStep).
type StepTimes struct {
	Step   int     // the step just taken
	Total  float64 // the whole step: data, projector check, engine step, skipped attempts
	Engine float64 // the engine's Step (the last attempt's)
	Check  float64 // the projector check before it (0: none was due)
	Tokens int64   // tokens of the step
}

// run holds the state of one training run.
type run struct {
	cfg  Config
	opts Options
	log  *slog.Logger

	// Set by setup, in the order of its steps.
	mc             model.Spec // the model's architecture
	fromCheckpoint bool       // --model is a checkpoint directory, not a preset
	src            string     // that directory ("" for a preset)
	tok            tokenizer.Tokenizer
	ds             *data.Dataset
	memory         Memory
	be             backend.Backend
	s              backend.Stream
	eng            *engine.Engine
	model          eval.Model // the engine's model
	loader         *data.Loader
	sched          optim.Schedule
	resumedAt      int    // the checkpoint's step, -1 when the run starts fresh
	restoreGC      func() // undoes limitGarbage
	mw             *metrics.Writer

	// The loop's state.
	prog      *metrics.Progress
	step      int   // optimizer steps completed, resumed ones included
	tokens    int64 // tokens trained on, resumed ones included
	lastEval  int   // step of the latest eval record, -1 when none is known
	times     Times // this process's wall time by phase
	runTokens int64 // tokens of this process's steps

	// Step measurements of this process (Measurements).
	stepSecs, checkSecs float64
	stepLink            int64
	stepsTimed          int
	// The latest step's engine and check times (StepTimes).
	lastEngine, lastCheck float64

	comm      comm.Communicator // several ranks; nil alone
	devComm   device.Comm       // and their devices' (--collectives); nil: the host sums
	commBytes int64             // payload this rank sent during its steps
	lastComm  int64             // and during the latest step
}

// Run trains as cfg says until the steps are done or ctx is cancelled; on
// cancellation it drains, checkpoints and returns with Interrupted set.
func Run(ctx context.Context, cfg Config, opts Options) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	r := &run{cfg: cfg, opts: opts, log: opts.Logger, resumedAt: -1, lastEval: -1}
	if opts.Comm != nil && opts.Comm.Size() > 1 {
		r.comm = opts.Comm
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	defer r.close()
	if err := r.setup(); err != nil {
		return nil, err
	}
	r.times.Setup = time.Since(start)
	res, err := r.loop(ctx)
	if err == nil {
		err = r.barrier()
	}
	res.Elapsed, res.Times = time.Since(start), r.times
	res.Ranks = r.ranks()
	if r.eng != nil {
		res.Comm = r.eng.CommPerStep()
	}
	if r.stepsTimed > 0 {
		res.CommBytesPerStep = float64(r.commBytes) / float64(r.stepsTimed)
	}
	if opts.Measurements != nil {
		*opts.Measurements = r.measurements()
	}
	return res, err
}

func (r *run) close() {
	if r.restoreGC != nil {
		r.restoreGC()
	}
	if r.mw != nil {
		r.mw.Close()
	}
	if r.eng != nil {
		r.eng.Free() // also stops the host worker threads
	}
	if r.devComm != nil {
		if err := r.devComm.Close(); err != nil {
			r.log.Warn("closing the device communicator", "err", err)
		}
	}
	if r.be != nil && r.opts.Backend == nil {
		r.be.Close()
	}
}

// setup prepares everything the loop needs, in steps that each fail with
// an error naming the flag at fault. Nothing is written to --out before
// the memory plan is checked and the engine is built.
func (r *run) setup() error {
	for _, step := range []func() error{
		r.checkOut,
		r.resolveModel,
		r.loadData,
		r.checkMemory,
		r.openEngine,
		r.limitGarbage,
		r.logLSPCaps,
		r.buildLoader,
		r.resumeOrInit,
		r.openMetrics,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	if r.opts.Ready != nil {
		return r.opts.Ready(r.eng)
	}
	return nil
}

// checkOut refuses a non-empty --out unless --resume continues the run
// in it or --overwrite replaces its outputs, so that another run's
// checkpoint and metrics are never overwritten by mistake.
func (r *run) checkOut() error {
	if r.cfg.Resume || r.cfg.Overwrite || !r.rank0() {
		return nil
	}
	ents, err := os.ReadDir(r.cfg.Out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return flagErr("out", "%v", err)
	}
	if len(ents) == 0 {
		return nil
	}
	var names []string
	for _, e := range ents[:min(len(ents), 4)] {
		names = append(names, e.Name())
	}
	if len(ents) > 4 {
		names = append(names, "...")
	}
	return flagErr("out", "%s is not empty (%s): it holds another run's outputs; continue that run with --resume, "+
		"replace its outputs with --overwrite, or choose another --out", r.cfg.Out, strings.Join(names, ", "))
}

// previousOutputs are the files and directories of a run's outputs that
// --overwrite removes before a new run starts in the same --out.
var previousOutputs = []string{checkpoint.FileName, "metrics.jsonl", "loss.png", "hf"}

// prepareOut creates --out, removes what a killed run's atomic writes
// left there, and with --overwrite (and no --resume) the outputs of the
// run before, so that a kill before this run's first checkpoint cannot
// leave another run's checkpoint to resume.
func (r *run) prepareOut() error {
	if !r.rank0() {
		return nil // rank 0 alone writes --out
	}
	if err := os.MkdirAll(r.cfg.Out, 0o755); err != nil {
		return flagErr("out", "%v", err)
	}
	removed, err := atomicfile.Clean(r.cfg.Out)
	if err != nil {
		return flagErr("out", "%v", err)
	}
	if len(removed) > 0 {
		r.log.Info("removed the leftovers of an interrupted write", "out", r.cfg.Out, "names", removed)
	}
	if !r.cfg.Overwrite || r.cfg.Resume {
		return nil
	}
	for _, name := range previousOutputs {
		p := filepath.Join(r.cfg.Out, name)
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return flagErr("out", "--overwrite: %v", err)
		}
		r.log.Info("--overwrite: removed an earlier run's output", "path", p)
	}
	return nil
}

// resolveModel finds the architecture of --model and its tokenizer, and
// checks that they fit --seq-len and each other.
func (r *run) resolveModel() error {
	var err error
	if r.mc, r.src, err = ResolveModel(r.cfg.Model); err != nil {
		return err
	}
	r.fromCheckpoint = r.src != ""
	if r.cfg.SeqLen > r.mc.MaxSeqLen() {
		return flagErr("seq-len", "%d is longer than the model context %s=%d", r.cfg.SeqLen, catalog.ContextName(r.mc), r.mc.MaxSeqLen())
	}
	if r.tok, err = catalog.Tokenizer(r.mc, r.src, r.cfg.Tokenizer); err != nil {
		if r.cfg.Tokenizer != "" {
			return flagErr("tokenizer", "%v", err)
		}
		return flagErr("model", "%v", err)
	}
	return nil
}

// loadData reads and tokenizes --data and splits off the eval set.
func (r *run) loadData() error {
	cfg := r.cfg
	var err error
	opt := data.Options{SeqLen: cfg.SeqLen, Truncate: cfg.Truncate, EvalFraction: cfg.EvalFraction, Seed: cfg.Seed}
	r.ds, err = data.Load(cfg.Data, r.tok, opt)
	if err != nil {
		// The data package's errors start with its name, which --data
		// says already.
		return flagErr("data", "%s%s", strings.TrimPrefix(err.Error(), "data: "), r.lengthHint(opt))
	}
	r.log.Info("data", "source", r.ds.Source, "train", len(r.ds.Train), "eval", len(r.ds.Eval),
		"dropped_too_long", r.ds.Dropped, "truncated", r.ds.Truncated)
	return nil
}

// lengthHint says what would make the examples of --data fit after a
// load with opt failed: when loading them whole succeeds, the failure was
// their length, and the hint names the --seq-len that keeps the shortest,
// or a preset whose context holds it when this model's does not. It is ""
// when the failure was something else.
func (r *run) lengthHint(opt data.Options) string {
	opt.SeqLen, opt.Truncate = math.MaxInt32, false
	ds, err := data.Load(r.cfg.Data, r.tok, opt)
	if err != nil {
		return ""
	}
	shortest := math.MaxInt
	for _, ex := range slices.Concat(ds.Train, ds.Eval) {
		shortest = min(shortest, len(ex.Tokens))
	}
	need := shortest - 1 // --seq-len T holds an example of T+1 tokens
	if need <= r.mc.MaxSeqLen() {
		return fmt.Sprintf("; the shortest example has %d tokens: --seq-len %d or more (up to the model's context, %d) keeps it",
			shortest, need, r.mc.MaxSeqLen())
	}
	// The suggestion is a preset of the model's own family. Every
	// preset's tokenizer takes at most a token per byte, and tiny's
	// takes exactly one, so a context of need tokens is enough for any
	// of them.
	var best string
	var bestSpec model.Spec
	if fam, err := catalog.Lookup(r.mc.Family()); err == nil {
		for _, name := range fam.Presets() {
			c, err := fam.Preset(name)
			if err == nil && c.MaxSeqLen() >= need && (best == "" || c.NumParams() < bestSpec.NumParams()) {
				best, bestSpec = name, c
			}
		}
	}
	hint := fmt.Sprintf("; the shortest example has %d tokens, more than the model's context of %d", shortest, r.mc.MaxSeqLen())
	if best != "" {
		hint += fmt.Sprintf(": use a model with a longer context, such as --model %s (%d tokens) with --seq-len %d",
			best, bestSpec.MaxSeqLen(), min(bestSpec.MaxSeqLen(), max(512, need)))
	}
	return hint
}

// checkMemory plans the run's memory and refuses a plan above
// --device-mem, or above --host-mem (by default the machine's available
// memory), before anything is allocated.
func (r *run) checkMemory() error {
	cfg := r.cfg
	plan, err := memoryOf(r.mc, cfg, r.src, r.fromCheckpoint, r.ds, r.ranks())
	if err != nil {
		return err
	}
	r.memory = plan
	r.log.Info("memory plan", "mode", cfg.Mode, "device_bytes", plan.DeviceTotal(), "host_peak_bytes", plan.HostPeak(),
		"link_bytes_per_step", plan.LinkD2H+plan.LinkH2D, "detail", plan.String())
	if cfg.DeviceMem > 0 && plan.DeviceTotal() > cfg.DeviceMem {
		hint := "lower --batch or --seq-len, use --mode lsp (or zero), or a smaller model"
		if cfg.Mode == engine.LSP {
			hint = "lower --batch, --seq-len or --d, or use a smaller model"
		}
		if h, err := r.recomputeHint(); err != nil {
			return err
		} else if h != "" {
			hint = h + "; or " + hint
		}
		return flagErr("device-mem", "the run needs %d bytes of device memory (%s) but the budget is %d bytes; %s",
			plan.DeviceTotal(), deviceParts(plan), cfg.DeviceMem, hint)
	}
	return checkHostMemory(plan, cfg.HostMem)
}

// recomputeHint names the least --recompute setting above the run's
// whose plan fits --device-mem, or says what the most recomputation
// would need when none does ("" when the run already recomputes all it
// can).
func (r *run) recomputeHint() (string, error) {
	cfg := r.cfg
	var need int64
	for _, rc := range model.Recomputes[cfg.Recompute+1:] {
		cfg.Recompute = rc
		p, err := memoryOf(r.mc, cfg, r.src, r.fromCheckpoint, r.ds, r.ranks())
		if err != nil {
			return "", err
		}
		if need = p.DeviceTotal(); need <= cfg.DeviceMem {
			return fmt.Sprintf("--recompute %v fits (%d bytes: activations recomputed in the backward, the same results)", rc, need), nil
		}
	}
	if need == 0 {
		return "", nil
	}
	return fmt.Sprintf("even --recompute layer needs %d bytes", need), nil
}

// deviceParts writes the device side of a plan in MiB, part by part (the
// host side is not device memory and not checked against --device-mem).
func deviceParts(p Memory) string {
	parts := make([]string, len(p.Device))
	for i, x := range p.Device {
		parts[i] = fmt.Sprintf("%s %.2f", x.Name, float64(x.Bytes)/(1<<20))
	}
	return fmt.Sprintf("%.2f MiB: %s", float64(p.DeviceTotal())/(1<<20), strings.Join(parts, ", "))
}

// openEngine opens the backend (unless Options gives one) and builds the
// engine on it.
func (r *run) openEngine() error {
	cfg := r.cfg
	var err error
	r.be = r.opts.Backend
	if r.be == nil {
		if r.be, err = device.Open(device.Config{Kind: cfg.Device, MemBudget: cfg.DeviceMem, Threads: cfg.Threads,
			Seed: cfg.Seed, LinkBandwidth: cfg.LinkBandwidth}); err != nil {
			return flagErr("device", "%v", err)
		}
	}
	r.s = r.be.DefaultStream()
	if err := r.openDeviceComm(); err != nil {
		return err
	}
	if r.eng, err = newEngine(r.be, r.mc, cfg, r.fromCheckpoint, r.comm, r.devComm); err != nil {
		return err
	}
	r.model = eval.Model{Model: r.eng.Model, Spec: r.mc, B: cfg.Batch, T: cfg.SeqLen}
	return nil
}

// openDeviceComm joins the ranks' devices as --collectives says: with
// auto, NCCL where the backend has it and every rank can start it (the
// ranks agree: cuda.NewNCCL fails on all of them or none), else the host.
func (r *run) openDeviceComm() error {
	if r.comm == nil {
		return nil
	}
	if r.cfg.Collectives == CollectivesHost {
		r.log.Info("collectives", "sums", "on the host (MPI)", "why", "--collectives host")
		return nil
	}
	dc, err := device.NewComm(r.cfg.Device, r.be, r.comm)
	switch {
	case err == nil:
		r.devComm = dc
		r.log.Info("collectives", "sums", "on the device (NCCL)")
	case r.cfg.Collectives == CollectivesNCCL:
		return flagErr("collectives", "%v", err)
	default:
		r.log.Info("collectives", "sums", "on the host (MPI)", "why", err)
	}
	return nil
}

// limitGarbage bounds the Go heap's garbage (boundGarbage) once the
// engine's memory is allocated, before the initial weights or a
// checkpoint are loaded, whose values are garbage as soon as they are
// uploaded.
func (r *run) limitGarbage() error {
	r.restoreGC = boundGarbage()
	return nil
}

// logLSPCaps says which matrices get a smaller d or r than asked for (lsp).
func (r *run) logLSPCaps() error {
	if r.cfg.Mode != engine.LSP {
		return nil
	}
	for _, c := range lspCaps(r.mc, r.cfg.D, r.cfg.R) {
		r.log.Info("lsp: d and r capped for this matrix", "matrix", c.matrix, "shape", fmt.Sprintf("%dx%d", c.m, c.n),
			"d", c.d, "r", c.r, "requested_d", r.cfg.D, "requested_r", r.cfg.R)
	}
	return nil
}

// buildLoader builds the training data's loader and the learning-rate
// schedule, turning --epochs into steps, or taking DefaultSteps when
// neither --steps nor --epochs is set (Validate refuses both).
func (r *run) buildLoader() error {
	cfg := r.cfg
	var err error
	if r.loader, err = data.NewLoader(r.ds.Train, cfg.Batch, cfg.SeqLen, cfg.Seed); err != nil {
		return flagErr("data", "%v", err)
	}
	total := cfg.Steps
	switch {
	case total > 0:
	case cfg.Epochs > 0:
		perEpoch := max(1, r.loader.Len()/(cfg.Batch*cfg.GradAccum))
		total = max(1, int(math.Ceil(cfg.Epochs*float64(perEpoch))))
		r.log.Info("--epochs in steps", "epochs", cfg.Epochs, "steps_per_epoch", perEpoch, "steps", total)
	default:
		total = DefaultSteps
	}
	r.cfg.Steps = total
	r.sched = optim.Schedule{LR: cfg.LR, MinLR: cfg.MinLR, Warmup: cfg.Warmup, Total: total}
	return nil
}

// resumeOrInit prepares --out, then restores the checkpoint there
// (--resume) or sets the initial weights and optimizer state.
func (r *run) resumeOrInit() error {
	if err := r.prepareOut(); err != nil {
		return err
	}
	defer releaseHost()
	if r.cfg.Resume {
		return r.resume()
	}
	if err := setInitialWeights(r.be, r.s, r.model.Buffers().Params, r.mc, r.cfg, r.fromCheckpoint); err != nil {
		return err
	}
	return r.eng.Init()
}

// releaseHost collects the garbage of a phase that allocated a large
// transient on the Go heap (the initial weights, a loaded or saved
// checkpoint, the export) and returns its pages to the OS. Without it
// that garbage stays resident until the heap doubles its live size,
// which on the CPU backend (device memory is Go heap) is gigabytes, and
// the next phase's transient would come on top of it. The host plan
// (HostPeak) counts one phase's transient at a time, which this makes
// true.
func releaseHost() { debug.FreeOSMemory() }

// resume restores the checkpoint in --out after checking that it was
// saved with this run's identity, and moves the data to where it stopped.
func (r *run) resume() error {
	path := r.checkpointPath()
	ck, err := checkpoint.Load(path, r.mc, r.log)
	if err != nil {
		return err
	}
	defer ck.Close()
	if err := checkResume(ck.State, r.cfg, r.fromCheckpoint, path, r.log); err != nil {
		return err
	}
	if err := checkResumeRanks(ck.State, r.ranks(), path); err != nil {
		return err
	}
	if err := ck.Restore(r.be, r.s, r.model.Buffers().Params, r.eng); err != nil {
		return err
	}
	if err := r.loader.Seek(ck.Position); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	r.step, r.tokens, r.resumedAt = ck.Step, ck.Tokens, ck.Step
	r.log.Info("resumed", "checkpoint", path, "step", ck.Step)
	return nil
}

// openMetrics opens metrics.jsonl, cut back to the resumed step.
func (r *run) openMetrics() error {
	if r.rank0() {
		var err error
		if r.mw, err = metrics.Create(r.metricsPath(), r.resumedAt); err != nil {
			return diskHint(err)
		}
	}
	r.log.Info("model", append(append([]any{"model", r.cfg.Model, "family", r.mc.Family()}, r.mc.Describe()...),
		"dtype", r.cfg.DType, "device", r.be.Name())...)
	if r.cfg.Mode == engine.LSP {
		projectors := "random, kept for the whole run (--fit learns them)"
		if r.cfg.Fit {
			projectors = fmt.Sprintf("fitted: checked every %d steps on %d calibration rows", r.cfg.CheckEvery, r.cfg.CalibSamples)
		}
		r.log.Info("lsp", "d", r.cfg.D, "r", r.cfg.R, "projectors", projectors, "dense_params", r.cfg.denseParams(r.fromCheckpoint))
	}
	return nil
}

func (r *run) checkpointPath() string { return filepath.Join(r.cfg.Out, checkpoint.FileName) }
func (r *run) metricsPath() string    { return filepath.Join(r.cfg.Out, "metrics.jsonl") }

// loop trains the remaining steps, then finishes: checkpoint, and unless
// interrupted the final eval, export and plot.
func (r *run) loop(ctx context.Context) (*Result, error) {
	res := &Result{Out: r.cfg.Out, EvalLoss: math.NaN(), ExactMatch: math.NaN(), ResumedAt: r.resumedAt, Total: r.cfg.Steps,
		Checkpoint: r.checkpointPath(), Metrics: r.metricsPath()}
	if r.opts.Progress != nil && r.rank0() {
		r.prog = metrics.NewProgress(r.opts.Progress, r.cfg.Steps, r.log)
	}
	err := r.trainSteps(ctx, res)
	if r.prog != nil {
		r.prog.Done()
	}
	if err != nil {
		return res, err
	}
	return res, r.finish(res)
}

// trainSteps runs steps until --steps, a cancelled ctx or StopAfter, with
// the periodic evals and checkpoints, and fills in res's step counts and
// throughput.
func (r *run) trainSteps(ctx context.Context, res *Result) error {
	if r.opts.EvalAtStart && !r.cfg.Resume && r.step == 0 {
		if err := r.evaluate(res); err != nil {
			return err
		}
	}
	first := r.step
	defer func() {
		res.Steps, res.StepsRun = r.step, r.step-first
		if r.times.Train > 0 {
			res.TokensPerSec = float64(r.runTokens) / r.times.Train.Seconds()
		}
	}()
	if r.step >= r.cfg.Steps {
		// Resumed from a finished run: its final eval is in the metrics
		// already; another would duplicate that step.
		r.lastEval = r.step
	}
	for r.step < r.cfg.Steps {
		stop, err := r.agree(ctx.Err() != nil || (r.opts.StopAfter > 0 && r.step >= r.opts.StopAfter))
		if err != nil {
			return err
		}
		if stop {
			res.Interrupted = true
			break
		}
		if err := r.oneStep(res); err != nil {
			return err
		}
		if err := r.periodic(res); err != nil {
			return err
		}
	}
	return nil
}

// oneStep runs the next optimizer step and records it. The step's time
// (its data, a projector check when one is due, the engine's step, and
// any attempts skipped before it) is what every tokens/s figure divides
// by: the step's own in the metrics, the sum over this process's steps in
// the progress display and the summary.
//
// An attempt whose loss is not finite updated nothing (the engine skips
// it on the device); with --on-nonfinite skip it is recorded as skipped
// and the step is attempted again with the next batch, up to --max-skips
// times in a row, and otherwise the run stops. The retries happen here,
// before the loop looks at Ctrl-C or StopAfter again, so a checkpoint
// always follows a step that was taken: it never holds the position of a
// skipped batch without the step after it, and a run resumed from it
// meets the same batches (and skips) again.
func (r *run) oneStep(res *Result) error {
	lr := r.sched.At(r.step + 1)
	t0, tok0 := time.Now(), r.tokens
	for inARow := 1; ; inARow++ {
		tokA := r.tokens
		loss, err := r.trainStep(lr)
		if err == nil && r.eng.Skipped() {
			r.tokens = tokA // the skipped batch's tokens were read, not trained on
			if err = r.skipStep(loss, lr, inARow); err == nil {
				continue
			}
		}
		dt := time.Since(t0)
		r.times.Train += dt
		r.runTokens += r.tokens - tok0
		if err != nil {
			return err
		}
		// The engine's flag and the host's sum agree (a float64 sum of
		// finite fp32 losses cannot overflow); check anyway.
		if err := checkFinite(r.step+1, "loss", loss); err != nil {
			return err
		}
		r.step++
		res.TrainLoss = loss
		res.Losses = append(res.Losses, loss)
		if err := r.recordStep(loss, lr, float64(r.tokens-tok0)/dt.Seconds(), float64(r.runTokens)/r.times.Train.Seconds()); err != nil {
			return err
		}
		if r.opts.AfterStep != nil {
			return r.opts.AfterStep(StepTimes{Step: r.step, Total: dt.Seconds(), Engine: r.lastEngine, Check: r.lastCheck,
				Tokens: r.tokens - tok0})
		}
		return nil
	}
}

// skipStep handles an attempt at the next step whose loss was not finite
// and which the engine skipped: it stops the run (--on-nonfinite stop, or
// the attempt is one more than --max-skips in a row), or logs a warning and
// records the skip in the metrics.
func (r *run) skipStep(loss, lr float64, inARow int) error {
	step := r.step + 1
	if r.cfg.OnNonFinite != SkipNonFinite {
		return checkFinite(step, "loss", loss)
	}
	if inARow > r.cfg.MaxSkips {
		return fmt.Errorf("step %d: loss is %v for the %d%s attempt in a row, after --max-skips %d skipped: %w; "+
			"stopping without saving this step (the last checkpoint is kept); try a lower --lr",
			step, loss, inARow, ordinal(inARow), r.cfg.MaxSkips, ErrNonFinite)
	}
	r.warnf("skipped a step whose loss is not finite: nothing was updated; the step is taken again with the next batch",
		"step", step, "loss", loss, "in_a_row", inARow, "max_skips", r.cfg.MaxSkips)
	rec := metrics.Record{Step: step, LR: metrics.F(lr), Event: metrics.SkippedStepEvent,
		Skipped: &metrics.SkippedStep{Loss: fmt.Sprint(loss), InARow: inARow}}
	return diskHint(r.writeMetrics(rec))
}

// ordinal is the English suffix of n: 1st, 2nd, 3rd, 4th, 11th, 21st.
func ordinal(n int) string {
	if n%100 >= 11 && n%100 <= 13 {
		return "th"
	}
	switch n % 10 {
	case 1:
		return "st"
	case 2:
		return "nd"
	case 3:
		return "rd"
	}
	return "th"
}

// trainStep runs one optimizer step over GradAccum micro-batches (after a
// projector check when one is due) and returns the mean loss per target
// token; the engine says whether it skipped the step (a non-finite loss).
func (r *run) trainStep(lr float64) (float64, error) {
	r.lastCheck = 0
	if r.eng.CheckDue() {
		if err := r.checkProjectors(); err != nil {
			return 0, err
		}
	}
	// Every rank reads the whole global batch (ranks x --grad-accum
	// micro-batches) and trains on its own share, so the data position
	// is the same on every rank.
	batches := make([]data.Batch, r.ranks()*r.cfg.GradAccum)
	targets := 0
	for i := range batches {
		r.loader.Next(&batches[i])
		targets += batches[i].NumTargets
		r.tokens += int64(batches[i].B * batches[i].T)
	}
	if targets == 0 {
		return 0, fmt.Errorf("step %d: no target tokens in the batch", r.step+1)
	}
	mine := batches
	if r.comm != nil {
		k := r.comm.Rank() * r.cfg.GradAccum
		mine = batches[k : k+r.cfg.GradAccum]
	}
	var cs0, ds0 comm.Stats
	if r.comm != nil {
		cs0 = r.comm.Stats()
	}
	if r.devComm != nil {
		ds0 = r.devComm.Stats()
	}
	tr0, t0 := r.be.Traffic(), time.Now()
	sum, err := r.eng.Step(mine, lr) // with several ranks, summed over them
	if err != nil {
		return 0, err
	}
	if r.comm != nil {
		r.lastComm = r.comm.Stats().Sub(cs0).Sent()
		if r.devComm != nil {
			r.lastComm += r.devComm.Stats().Sub(ds0).Sent()
		}
		r.commBytes += r.lastComm
	}
	tr1 := r.be.Traffic()
	r.lastEngine = time.Since(t0).Seconds()
	r.stepSecs += r.lastEngine
	r.stepLink += tr1.D2H - tr0.D2H + tr1.H2D - tr0.H2D
	r.stepsTimed++
	return sum / float64(targets), nil
}

// recordStep writes the metrics of the step just done (with its own
// throughput, stepRate) and updates the progress display (with this
// process's, runRate). A finite loss can still come with non-finite
// gradients; the update has used them, so the run stops before anything
// of this step is saved. --on-nonfinite skip cannot help there: the
// gradients are found layer by layer, when deeper layers are updated
// already (DESIGN.md section 3).
func (r *run) recordStep(loss, lr, stepRate, runRate float64) error {
	norm, err := r.eng.GradNorm()
	if err != nil {
		return fmt.Errorf("step %d: gradient norm: %w", r.step, err)
	}
	if err := checkFinite(r.step, "gradient norm", norm); err != nil {
		if r.cfg.OnNonFinite == SkipNonFinite {
			err = fmt.Errorf("%w (--on-nonfinite skip skips a non-finite loss only: a non-finite gradient with a finite loss "+
				"shows layer by layer, after deeper layers were updated)", err)
		}
		return err
	}
	// Time is left 0 so the Writer fills it in, continuing across resumes.
	rec := metrics.Record{Step: r.step, TrainLoss: metrics.F(loss), TokensPerSec: metrics.F(stepRate),
		LR: metrics.F(lr), GradNorm: metrics.F(norm)}
	if r.comm != nil {
		rec.CommBytes = metrics.F(float64(r.lastComm))
	}
	if err := r.writeMetrics(rec); err != nil {
		return diskHint(err)
	}
	if r.prog != nil {
		r.prog.Update(r.step, loss, runRate)
	}
	return faults.Point("step", "")
}

// periodic evaluates and checkpoints when --eval-every and
// --checkpoint-every say so; the last step's are finish's.
func (r *run) periodic(res *Result) error {
	if r.step >= r.cfg.Steps {
		return nil
	}
	if r.cfg.EvalEvery > 0 && r.step%r.cfg.EvalEvery == 0 {
		if err := r.evaluate(res); err != nil {
			return err
		}
		r.lastEval = r.step
	}
	if r.cfg.CheckpointEvery > 0 && r.step%r.cfg.CheckpointEvery == 0 {
		return r.saveCheckpoint()
	}
	return nil
}

// finish evaluates the final weights (once, unless the run was
// interrupted) and checkpoints; unless interrupted it then exports the
// weights and plots the losses. The eval comes before the checkpoint, as
// in periodic, so that a run killed after its last checkpoint and resumed
// finds the final eval in its metrics already.
func (r *run) finish(res *Result) error {
	if !res.Interrupted && r.lastEval != r.step {
		if err := r.evaluate(res); err != nil {
			return err
		}
		r.lastEval = r.step
	}
	if err := r.saveCheckpoint(); err != nil {
		return err
	}
	return r.rank0Only(func() error { return r.export(res) })
}

// export writes the final weights as a Hugging Face directory and plots
// the losses (only the plot when the run was interrupted).
func (r *run) export(res *Result) error {
	t0 := time.Now()
	defer func() { r.times.Export += time.Since(t0) }()
	if res.Interrupted {
		r.log.Info("interrupted: checkpoint saved; continue with --resume", "step", r.step, "checkpoint", res.Checkpoint)
		return r.plot(res)
	}
	defer releaseHost() // the exported values
	vals, err := backend.Download(r.be, r.s, r.model.Buffers().Params)
	if err != nil {
		return err
	}
	res.Export = filepath.Join(r.cfg.Out, "hf")
	if err := exportModel(res.Export, r.mc, vals, r.src, r.tok); err != nil {
		return diskHint(err)
	}
	return r.plot(res)
}

// plot draws the loss curves of metrics.jsonl into loss.png, also for an
// interrupted run; a run interrupted before its first step has none.
func (r *run) plot(res *Result) error {
	recs, err := metrics.ReadFile(res.Metrics)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(recs, func(rec metrics.Record) bool { return rec.TrainLoss != nil || rec.EvalLoss != nil }) {
		return nil
	}
	res.Plot = filepath.Join(r.cfg.Out, "loss.png")
	return diskHint(metrics.PlotLoss(recs, res.Plot, fmt.Sprintf("%s on %s", r.cfg.Model, r.cfg.Data)))
}

// diskHint adds what to do to an error of a write that found the disk
// full; other errors (and nil) pass unchanged.
func diskHint(err error) error {
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	return fmt.Errorf("%w; the disk holding --out is full: free space, then continue with the same flags plus --resume "+
		"(the last complete checkpoint is kept)", err)
}

// checkFinite is nil when v, the step's what (a loss or a norm), is
// finite, and otherwise the error that stops the run without saving the
// step.
func checkFinite(step int, what string, v float64) error {
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		return nil
	}
	hint := "try a lower --lr"
	if what == "loss" {
		hint += ", or --on-nonfinite skip to skip such steps"
	}
	return fmt.Errorf("step %d: %s is %v: %w; stopping without saving this step (the last checkpoint is kept); %s",
		step, what, v, ErrNonFinite, hint)
}

// checkProjectors runs the lsp projector check and logs every matrix's
// result to the metrics; a fit that misses alpha is a warning.
func (r *run) checkProjectors() error {
	// The calibration rows come from their own shuffle of the training
	// rows, keyed by the step, so the checks neither move the training
	// data's position nor depend on where a run was resumed.
	calib, err := data.NewLoader(r.ds.Train, r.cfg.Batch, r.cfg.SeqLen, r.cfg.Seed^0xca1b^uint64(r.step)*0x9e3779b97f4a7c15)
	if err != nil {
		return flagErr("data", "%v", err)
	}
	batches := make([]data.Batch, r.eng.CalibBatches())
	for i := range batches {
		calib.Next(&batches[i])
	}
	t0 := time.Now()
	reps, err := r.eng.Check(batches)
	r.lastCheck = time.Since(t0).Seconds()
	r.checkSecs += r.lastCheck
	if err != nil {
		return err
	}
	// One line per check, not per matrix: a fit that misses --alpha or is
	// rejected by the held-out data is the normal case on gradients whose
	// directions move fast, and metrics.jsonl has every matrix.
	missed, accepted, rejected, rewarmed := 0, 0, 0, 0
	for _, p := range reps {
		missed += count(!p.Reached)
		accepted += count(p.Resampled)
		rejected += count(p.Rejected)
		rewarmed += count(p.Rewarm)
		rec := metrics.Record{Step: r.step, Event: metrics.ProjectorCheckEvent, Projector: &metrics.ProjectorCheck{
			Matrix: p.Matrix, RatioBefore: p.RatioBefore, RatioAfter: p.RatioAfter, Iters: p.Iters,
			Resampled: p.Resampled, Reached: p.Reached, Change: p.Change, Rewarm: p.Rewarm, Seconds: p.Seconds,
			Rejected: p.Rejected, CaptureBefore: p.CaptureBefore, CaptureAfter: p.CaptureAfter}}
		if err := r.writeMetrics(rec); err != nil {
			return err
		}
	}
	r.log.Info("projector check", "step", r.step, "matrices", len(reps), "refitted", accepted, "rejected", rejected,
		"rewarmed", rewarmed, "missed_alpha", missed,
		"seconds", fmt.Sprintf("%.2f", time.Since(t0).Seconds()))
	return nil
}

// measurements are the run's Measurements so far.
func (r *run) measurements() Measurements {
	m := Measurements{Memory: r.memory, CheckSeconds: r.checkSecs}
	if r.be != nil {
		m.DevicePeak = r.be.MemStats().HighWater
	}
	if r.stepsTimed > 0 {
		m.StepSeconds = r.stepSecs / float64(r.stepsTimed)
		m.LinkBytesPerStep = float64(r.stepLink) / float64(r.stepsTimed)
	}
	return m
}

// saveCheckpoint writes the run's state to --out, atomically.
func (r *run) saveCheckpoint() error {
	// Every rank holds the same weights; zero mode's host optimizer is
	// sharded among the ranks, so every rank first sends its shard to
	// rank 0 (a collective; nothing otherwise). Rank 0 saves the whole.
	release, err := r.eng.GatherState()
	if err != nil {
		return fmt.Errorf("step %d: %w", r.step, err)
	}
	defer release()
	return r.rank0Only(r.writeCheckpoint)
}

func (r *run) writeCheckpoint() error {
	t0 := time.Now()
	defer func() { r.times.Checkpoint += time.Since(t0) }()
	releaseHost()       // the steps' garbage, before the checkpoint's values come on top
	defer releaseHost() // the checkpoint's values
	st := checkpoint.State{Step: r.step, Position: r.loader.Position(), Model: r.mc, Tokens: r.tokens}
	saveSettings(&st, r.cfg.resumeIdentity(r.fromCheckpoint), r.cfg.resumeAllowed())
	saveRanks(&st, r.ranks())
	if err := checkpoint.Save(r.checkpointPath(), r.be, r.s, r.model.Buffers().Params, r.eng, st); err != nil {
		return diskHint(fmt.Errorf("step %d: %w", r.step, err))
	}
	return nil
}

// evaluate computes the eval loss and the exact match of greedy generation
// on held-out prompts, logs them and writes them to the metrics.
func (r *run) evaluate(res *Result) error {
	t0 := time.Now()
	defer func() { r.times.Eval += time.Since(t0) }()
	rec := metrics.Record{Step: r.step, Event: "eval"} // the Writer fills in Time
	if len(r.ds.Eval) > 0 {
		loss, err := eval.Loss(r.be, r.s, r.model, r.ds.Eval)
		if err != nil {
			return err
		}
		// Non-finite: the weights diverged in this step's update; the next
		// train step would fail the same way, so stop before saving them.
		if err := checkFinite(r.step, "eval loss", loss); err != nil {
			return err
		}
		res.EvalLoss = loss
		rec.EvalLoss = metrics.F(loss)
	}
	if n := min(r.cfg.EvalGenerate, len(r.ds.EvalRecords)); n > 0 {
		em, err := eval.ExactMatch(r.be, r.s, r.model, r.tok, r.ds.EvalRecords[:n])
		if err != nil {
			return err
		}
		res.ExactMatch = em
		rec.ExactMatch = metrics.F(em)
	}
	if err := faults.Point("eval", ""); err != nil {
		return err
	}
	if rec.EvalLoss == nil && rec.ExactMatch == nil {
		return nil
	}
	args := []any{"step", r.step}
	if rec.EvalLoss != nil {
		args = append(args, "eval_loss", fmt.Sprintf("%.4f", *rec.EvalLoss))
	}
	if rec.ExactMatch != nil {
		args = append(args, "exact_match", fmt.Sprintf("%.3f", *rec.ExactMatch))
	}
	r.logf("eval", args...)
	return diskHint(r.writeMetrics(rec))
}

// logf logs through the progress display when there is one, so the bar
// is not garbled.
func (r *run) logf(msg string, args ...any) {
	if r.prog != nil {
		r.prog.Log(msg, args...)
	} else {
		r.log.Info(msg, args...)
	}
}

// warnf is logf at the warning level.
func (r *run) warnf(msg string, args ...any) {
	if r.prog != nil {
		r.prog.Warn(msg, args...)
	} else {
		r.log.Warn(msg, args...)
	}
}

// count is 1 for true.
func count(b bool) int {
	if b {
		return 1
	}
	return 0
}
