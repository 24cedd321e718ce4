// The training run: Run, what it is given and what it returns, and the
// state one run holds. The run's jobs each have a file of their own:
//
//	setup.go         resolving --model and --data, building the engine, the first weights
//	memory.go        the memory plan, its check against the budgets, the Go heap's garbage
//	loop.go          the steps, skipped steps, the periodic evals and checkpoints, the end
//	measure.go       what the run measures of its own steps (Measurements, StepTimes)
//	projectors.go    lsp's per-matrix caps and projector checks
//	evaluate.go      the eval loss and exact match
//	checkpoints.go   writing the run's state and restoring it (resume.go: what a resume must match)
//	report.go        metrics.jsonl, the progress display and the log lines of the steps
//	outputs.go       --out: refusing another run's, clearing it, the export and the loss plot
//	dataparallel.go  the ranks of a data-parallel run and what they agree on
//
// Limits: one run per process at a time holds the backend it opens; the
// step measurements (Measurements) cover this process's steps only, not
// those before a resume.

package train

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/lora"
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
	// EvalInterrupted: the context stopped the final evaluation, after
	// the checkpoint and the export of the last step (Interrupted too).
	EvalInterrupted bool
	TrainLoss       float64
	EvalLoss        float64 // NaN when there is no eval set
	ExactMatch      float64 // NaN when there are no eval records
	// TokensPerSec is the one throughput figure of a run: tokens of this
	// process's steps over their wall time (Times.Train). The progress
	// display shows it as the steps go; metrics.jsonl has each step's
	// own tokens over its own time.
	TokensPerSec float64
	Elapsed      time.Duration // wall time of the whole run in this process, every phase
	Times        Times         // Elapsed by phase
	Checkpoint   string
	Export       string // Hugging Face directory with the final weights ("" when interrupted)
	Adapter      string // lora mode: the PEFT adapter directory beside Export ("" in other modes or when interrupted)
	Metrics      string
	Plot         string // the loss plot ("" when there was no loss to plot)
	// Rendering says how the training conversations were rendered
	// (data.Dataset.Rendering); "" when --data is not conversations.
	Rendering string
	Losses    []float64 // train loss of every step of this process, in order
	// Ranks is the number of processes that trained together (1 alone).
	Ranks int
	// CommBytesPerStep is the mean payload this rank sent to other ranks
	// per optimizer step (comm.Stats; 0 alone).
	CommBytesPerStep float64
	// Comm is what each step all-reduced (with several ranks).
	Comm engine.CommStep
	// Memory is this process's measured peak memory beside its plan.
	Memory MemoryUse
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
	// DefaultOut says that --out is the command's default, given neither
	// --out nor --overwrite: the run replaces the outputs there only when
	// DefaultOutMarker says an earlier such run wrote them, and marks its
	// own (outputs.go).
	DefaultOut bool
}

// run holds the state of one training run.
type run struct {
	cfg  Config
	opts Options
	log  *slog.Logger

	// The jobs that keep state of their own, apart from the run's.
	world  world     // the ranks trained with (dataparallel.go); alone without a communicator
	report reporter  // metrics.jsonl, the progress display and the steps' log lines (report.go)
	meter  stepMeter // this process's steps measured (measure.go)

	// Set by setup, in the order of its steps.
	mc             model.Spec // the model's architecture
	fromCheckpoint bool       // --model is a checkpoint directory, not a preset
	src            string     // that directory ("" for a preset)
	tok            tokenizer.Tokenizer
	adapter        *lora.Adapter // --adapter (lora mode), read before the engine is built
	ds             *data.Dataset
	memory         Memory
	be             backend.Backend
	s              backend.Stream
	eng            *engine.Engine
	model          eval.Model // the engine's model
	loader         *data.Loader
	sched          optim.Schedule
	resumedAt      int      // the checkpoint's step, -1 when the run starts fresh
	evals          evalPlan // what each evaluation reads (evaluate.go)
	restoreGC      func()   // undoes limitGarbage

	// The loop's state.
	step      int   // optimizer steps completed, resumed ones included
	tokens    int64 // tokens trained on, resumed ones included
	lastEval  int   // step of the latest eval record, -1 when none is known
	times     Times // this process's wall time by phase
	runTokens int64 // tokens of this process's steps
}

// Run trains as cfg says until the steps are done or ctx is cancelled; on
// cancellation it drains, checkpoints and returns with Interrupted set.
func Run(ctx context.Context, cfg Config, opts Options) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	r := &run{cfg: cfg, opts: opts, log: opts.Logger, resumedAt: -1, lastEval: -1, world: world{timeout: opts.CommTimeout}}
	if opts.Comm != nil && opts.Comm.Size() > 1 {
		r.world.comm = opts.Comm
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.report.log = r.log
	defer r.close()
	if err := r.setup(); err != nil {
		return nil, err
	}
	r.times.Setup = time.Since(start)
	res, err := r.loop(ctx)
	if err == nil {
		err = r.world.barrier()
	}
	res.Elapsed, res.Times = time.Since(start), r.times
	res.Ranks = r.world.size()
	if r.eng != nil {
		res.Comm = r.eng.CommPerStep()
	}
	res.CommBytesPerStep = r.meter.commPerStep()
	res.Memory = r.memoryUse()
	if opts.Measurements != nil {
		*opts.Measurements = r.measurements()
	}
	return res, err
}

// close releases what the run acquired, as far as set-up got; the
// backend only when the run opened it.
func (r *run) close() {
	if r.restoreGC != nil {
		r.restoreGC()
	}
	r.report.close()
	if r.eng != nil {
		r.eng.Free() // also stops the host worker threads
	}
	if r.world.devComm != nil {
		if err := r.world.devComm.Close(); err != nil {
			r.log.Warn("closing the device communicator", "err", err)
		}
	}
	if r.be != nil && r.opts.Backend == nil {
		r.be.Close()
	}
}
