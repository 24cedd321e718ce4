// Command lsp-train fine-tunes language models of the families that
// train/catalog lists: GPT-2 and LLaMA, from a preset, a Hugging Face
// directory or (LLaMA) a llama2.c model file. With no flags it trains the
// tiny preset on a built-in task on the CPU and says where its outputs
// are; `lsp-train sample` generates text from a trained model, and
// `lsp-train compare` fine-tunes in every update mode and prints a table.
//
//	lsp-train [flags]                 train (see -h; also lsp-train help [SUBCOMMAND])
//	lsp-train --version               the version and the Go release that built it
//	lsp-train sample -model DIR -prompt TEXT [flags]
//	lsp-train compare [flags]         native, zero and lsp side by side
//	lsp-train plan [flags]            will it fit, and how fast, on a given GPU
//	lsp-train profile [flags]         where a step's time goes, on the backend at hand
//
// Exit status: 0 when the work is done (and for -h), 1 on an error (a bad
// flag included), and 128 + the signal's number when Ctrl-C (SIGINT: 130)
// or SIGTERM (143) stopped the work after saving what it could.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/mpi"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// subcommand is a command named by the first argument; anything else is
// the train command's flags. The train command's -h lists every
// subcommand with its flags, from this table.
type subcommand struct {
	summary string
	// flags returns the subcommand's flag set with its defaults, for the
	// usage; the subcommand itself builds its own.
	flags func() *flag.FlagSet
	run   func(args []string, stdout io.Writer, stderr *os.File) error
}

// subcommandNames lists the subcommands in the order -h shows them.
var subcommandNames = []string{"sample", "compare", "plan", "profile"}

var subcommands = map[string]subcommand{
	"sample":  {"generate text from a trained model", newSampleFlags, sampleCmd},
	"compare": {"fine-tune tiny in every update mode and print one table", newCompareFlags, compareCmd},
	"plan":    {"predict memory and step time of a model on a GPU we may not have", newPlanFlags, planCmd},
	"profile": {"time a few steps op by op: by phase, op family and stream", newProfileFlags, profileCmd},
}

// versionText is what --version prints: the module's version (or the
// commit it was built from, when built from a checkout), and the Go
// release that built it.
func versionText() string {
	v := "(unknown version)"
	info, ok := debug.ReadBuildInfo()
	if ok {
		v = info.Main.Version
		var rev, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = ", modified"
				}
			}
		}
		if rev != "" {
			v += fmt.Sprintf(" (commit %s%s)", rev[:min(12, len(rev))], modified)
		}
	}
	return fmt.Sprintf("lsp-train %s, %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// exitCoder is an error that sets the exit status.
type exitCoder interface{ ExitCode() int }

// run runs the command args name and returns the exit status: 0 also for
// -h, whose usage parseFlags has printed already.
func run(args []string, stdout io.Writer, stderr *os.File) int {
	name, cmd := "lsp-train", trainCmd
	var err error
	if len(args) > 0 {
		switch args[0] {
		case "--version", "-version", "version":
			fmt.Fprintln(stdout, versionText())
			return 0
		case "help":
			// lsp-train help [SUBCOMMAND]: that command's -h.
			args = append(args[1:], "-h")
		}
	}
	if len(args) > 0 {
		if sc, ok := subcommands[args[0]]; ok {
			name, cmd, args = "lsp-train "+args[0], sc.run, args[1:]
			if n, ok := comm.LaunchedByMPI(); ok {
				// Each rank would run it alone, on the same files.
				cmd = func([]string, io.Writer, *os.File) error {
					return fmt.Errorf("launched by mpirun (%s=%d): only training runs on several ranks; run %s without mpirun",
						comm.WorldEnv, n, name)
				}
			}
		} else if bc, ok := bundleCommands[args[0]]; ok {
			name, cmd, args = "lsp-train "+args[0], bc, args[1:]
		}
	}
	err = cmd(args, stdout, stderr)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, name+":", err)
	var ec exitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

// interrupted is the error of work stopped by a signal after it saved
// what it could; the exit status is 128 + the signal's number, as a
// shell reports a process the signal killed (130 for SIGINT, 143 for
// SIGTERM), so that scripts can tell it from finished work.
type interrupted struct {
	sig syscall.Signal
	err error // what was saved and how to go on
}

func (e *interrupted) Error() string {
	return fmt.Sprintf("interrupted by %s: %v (exit status %d)", signalName(e.sig), e.err, e.ExitCode())
}

func (e *interrupted) Unwrap() error { return e.err }

func (e *interrupted) ExitCode() int { return 128 + int(e.sig) }

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT (Ctrl-C)"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

func trainCmd(args []string, stdout io.Writer, stderr *os.File) error {
	cfg := train.Defaults()
	fs := flag.NewFlagSet("lsp-train", flag.ContinueOnError)
	configFile := fs.String("config", "", "read flag values from the JSON `FILE` (an object such as {\"steps\": 200, \"lr\": 1e-4}); flags given on the command line win")
	bindTrainFlags(fs, &cfg)
	if err := parseFlags(fs, args, func(w io.Writer) { trainUsage(w, fs) }, stderr); err != nil {
		return err
	}
	if *configFile != "" {
		if err := applyConfigFile(fs, *configFile); err != nil {
			return err
		}
	}
	defaultDType(fs, &cfg)
	defaultMinLR(fs, &cfg)
	if err := checkSteps(fs, cfg); err != nil {
		return err
	}
	if err := checkEvalData(fs, &cfg); err != nil {
		return err
	}
	if err := checkFitFlags(fs, cfg); err != nil {
		return err
	}
	// Under mpirun: the job's communicator (an error in a build without
	// -tags mpi); alone, one rank.
	c, err := mpi.Init(mpi.Config{Timeout: mpi.DefaultTimeout})
	if err != nil {
		return err
	}
	rank, ranks := c.Rank(), c.Size()
	var logger *slog.Logger
	var progress *os.File
	if term.IsTerminal(int(stderr.Fd())) {
		progress = stderr
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	} else {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
		progress = stderr // plain log lines when not a terminal
	}
	opts := train.Options{Logger: logger, Progress: progress, DefaultOut: defaultOut(fs)}
	if ranks > 1 {
		// --device cuda: each rank on its own GPU of its machine.
		if cfg.Device, err = device.PerRank(cfg.Device, localRank()); err != nil {
			return flagerr.New("device", "%v", err)
		}
		opts.Comm, opts.CommTimeout = c, mpi.DefaultTimeout
		if cfg.Threads == 0 {
			// All cores for each rank would oversubscribe a machine
			// that runs several: share them among this machine's ranks.
			cfg.Threads = max(1, runtime.NumCPU()/localRanks())
		}
		logger = logger.With("rank", rank)
		if rank != 0 {
			// Rank 0 shows the run; the others say only what goes wrong.
			logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("rank", rank)
			progress = nil
		}
		opts.Logger, opts.Progress = logger, progress
		logger.Info("data parallel", "ranks", ranks, "global_batch_rows", ranks*cfg.GradAccum*cfg.Batch, "threads", cfg.Threads, "device", cfg.Device)
	}
	ckpt := checkpointFile(cfg.Out)
	var trained atomic.Bool
	ctx, sig, done := interruptible(logger, "interrupt: stopping after the current step or evaluation batch, with the last step saved (Ctrl-C again to quit at once, without saving what is not saved yet)",
		lostOnSignal(c, ckpt, stderr, logger, &trained))
	defer done()
	res, err := train.Run(ctx, cfg, opts)
	trained.Store(true)
	if err != nil {
		// Not closed: MPI_Finalize could wait for ranks still training;
		// the non-zero exit makes mpirun end them.
		return reportLost(err, res, ckpt)
	}
	if rank == 0 {
		// Before Close: once another rank exits (with 130 when
		// interrupted), mpirun may end this one.
		report(stdout, cfg, res)
	}
	if err := c.Close(); err != nil {
		return err
	}
	if res.Interrupted {
		s := sig()
		if s == 0 {
			s = syscall.SIGINT // stopped by the context without a signal: cannot happen from the command line
		}
		if res.EvalInterrupted {
			return &interrupted{sig: s, err: fmt.Errorf("during the final evaluation; the checkpoint and the Hugging Face export of step %d are saved; "+
				"the same flags plus --resume run the final evaluation", res.Steps)}
		}
		return &interrupted{sig: s, err: fmt.Errorf("checkpoint saved at step %d; continue with the same flags plus --resume", res.Steps)}
	}
	return nil
}

// report prints the run's summary: the steps of this process (and where
// a resumed run started), its losses, the time of each phase, and where
// the outputs are.
func report(w io.Writer, cfg train.Config, res *train.Result) {
	if res.Interrupted {
		during := ""
		if res.EvalInterrupted {
			during = " (during the final evaluation)"
		}
		fmt.Fprintf(w, "\nInterrupted at step %d of %d%s: %s.\n", res.Steps, res.Total, during, stepsText(res))
		reportTimes(w, res)
		reportMemory(w, res.Memory)
		fmt.Fprintf(w, "Checkpoint: %s\n", res.Checkpoint)
		if res.Export != "" {
			fmt.Fprintf(w, "Hugging Face export: %s\n", res.Export)
		}
		if res.Plot != "" {
			fmt.Fprintf(w, "Loss plot:  %s\n", res.Plot)
		}
		fmt.Fprintf(w, "Continue with the same flags plus --resume.\n")
		return
	}
	fmt.Fprintf(w, "\nTrained %s on %s: %s.\n", cfg.Model, data.Name(cfg.Data), stepsText(res))
	reportTimes(w, res)
	reportMemory(w, res.Memory)
	if res.Ranks > 1 {
		reportComm(w, cfg, res)
	}
	if res.StepsRun > 0 {
		fmt.Fprintf(w, "  final train loss  %.4f\n", res.TrainLoss)
	}
	if res.EvalLoss == res.EvalLoss {
		fmt.Fprintf(w, "  eval loss         %.4f (perplexity %.4g)\n", res.EvalLoss, math.Exp(res.EvalLoss))
	}
	if res.ExactMatch == res.ExactMatch {
		fmt.Fprintf(w, "  eval exact match  %.1f%% (greedy generation on held-out prompts)\n", 100*res.ExactMatch)
	}
	fmt.Fprintf(w, "Outputs in %s:\n", res.Out)
	fmt.Fprintf(w, "  %-40s Hugging Face checkpoint (transformers: AutoModelForCausalLM.from_pretrained)\n", res.Export)
	if res.Adapter != "" {
		fmt.Fprintf(w, "  %-40s the LoRA adapter alone (peft: PeftModel.from_pretrained(base, dir); lsp-train sample -adapter dir)\n", res.Adapter)
	}
	fmt.Fprintf(w, "  %-40s checkpoint for --resume\n", res.Checkpoint)
	fmt.Fprintf(w, "  %-40s metrics, one JSON object per line\n", res.Metrics)
	fmt.Fprintf(w, "  %-40s the same for TensorBoard (tensorboard --logdir %[1]s)\n", filepath.Join(res.Out, "tb"))
	if res.Plot != "" {
		fmt.Fprintf(w, "  %-40s loss curves\n", res.Plot)
	}
	switch {
	case strings.HasPrefix(data.Name(cfg.Data), "builtin:sort"):
		fmt.Fprintf(w, "Try: ./bin/lsp-train sample -model %s -prompt 'sort hello='\n", res.Export)
	case res.Rendering != "" && cfg.ChatTemplate != "":
		fmt.Fprintf(w, "Try: ./bin/lsp-train sample -model %s -chat -chat-template %s -prompt 'Name three colours.'\n", res.Export, cfg.ChatTemplate)
	case res.Rendering != "":
		fmt.Fprintf(w, "Try: ./bin/lsp-train sample -model %s -chat -prompt 'Name three colours.'\n", res.Export)
	case strings.HasSuffix(cfg.Data, ".json"), strings.HasSuffix(cfg.Data, ".jsonl"):
		fmt.Fprintf(w, "Try: ./bin/lsp-train sample -model %s -alpaca -prompt 'Name three colours.'\n", res.Export)
	}
}

// stepsText says which steps this process ran: "600 steps", or for a
// resumed run "525 steps in this run (76 to 600; resumed at step 75)".
func stepsText(res *train.Result) string {
	n := fmt.Sprintf("%d steps", res.StepsRun)
	if res.StepsRun == 1 {
		n = "1 step"
	}
	switch {
	case res.ResumedAt < 0:
		return n
	case res.StepsRun == 0:
		return fmt.Sprintf("no steps in this run (resumed at step %d, the last)", res.ResumedAt)
	}
	return fmt.Sprintf("%s in this run (%d to %d; resumed at step %d)", n, res.ResumedAt+1, res.Steps, res.ResumedAt)
}

// reportTimes prints the wall time of each phase: the steps and their
// throughput (the same figure as the progress display's), then the rest.
func reportTimes(w io.Writer, res *train.Result) {
	t := res.Times
	if res.StepsRun > 0 {
		fmt.Fprintf(w, "  training          %s, %.0f tokens/s (tokens of these steps over their time)\n",
			duration(t.Train), res.TokensPerSec)
	}
	var other []string
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{"setup", t.Setup}, {"evaluation", t.Eval}, {"checkpoints", t.Checkpoint}, {"export and plot", t.Export}} {
		if p.d > 0 {
			other = append(other, p.name+" "+duration(p.d))
		}
	}
	fmt.Fprintf(w, "  other phases      %s\n", strings.Join(other, ", "))
	fmt.Fprintf(w, "  wall time         %s\n", duration(res.Elapsed))
}

// reportMemory prints the measured peak device and host memory of this
// process beside the plan the run was checked against, so that a user
// sees how close the plan was and what headroom is left.
func reportMemory(w io.Writer, m train.MemoryUse) {
	budget := ""
	if m.DeviceBudget > 0 {
		budget = ", budget " + bytesText(m.DeviceBudget)
	}
	fmt.Fprintf(w, "  device memory     peak %s measured (allocated by the backend), %s planned%s\n",
		bytesText(m.DevicePeak), bytesText(m.DevicePlanned), budget)
	if m.HostPeak <= 0 {
		fmt.Fprintf(w, "  host memory       %s planned (the resident peak is measured on Linux only)\n", bytesText(m.HostPlanned))
		return
	}
	onHost := ""
	if m.DeviceOnHost {
		onHost = ", the cpu backend's device memory included"
	}
	fmt.Fprintf(w, "  host memory       peak %s resident (the process's VmHWM%s), %s planned over the process's own at start-up\n",
		bytesText(m.HostPeak), onHost, bytesText(m.HostPlanned))
}

// bytesText writes a byte count in GiB from 1 GiB on, in MiB below.
func bytesText(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// duration rounds d to what a person reads: milliseconds below a second,
// tenths below a minute, seconds above.
func duration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// interruptible returns a context cancelled by the first Ctrl-C (or
// SIGTERM), which logs msg after calling onSignal (when not nil) with it;
// sig returns that signal (0 before one came). A second signal has its
// default effect and ends the process at once. Call done when the work
// has finished.
func interruptible(logger *slog.Logger, msg string, onSignal func(os.Signal)) (ctx context.Context, sig func() syscall.Signal, done func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var got atomic.Int32
	finished := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			signal.Stop(ch) // the default action again: a second signal kills at once
			if s, ok := s.(syscall.Signal); ok {
				got.Store(int32(s)) // before cancel, so a cancelled run finds it
			}
			if onSignal != nil {
				onSignal(s)
			}
			logger.Info(msg)
			cancel()
		case <-finished:
		}
	}()
	return ctx, func() syscall.Signal { return syscall.Signal(got.Load()) }, func() {
		close(finished)
		signal.Stop(ch)
		cancel()
	}
}

// reportComm prints what a data-parallel run moved between ranks: the
// bytes per step, and per block matrix the elements its step all-reduced
// beside the m n of native mode's dense gradient.
func reportComm(w io.Writer, cfg train.Config, res *train.Result) {
	sharded := ""
	if res.Comm.Sharded > 0 {
		// zero mode's sharded host optimizer
		sharded = fmt.Sprintf("; %d gradients reduce-scattered and weights all-gathered", res.Comm.Sharded)
	}
	fmt.Fprintf(w, "  data parallel     %d ranks, %.0f bytes per step sent by rank 0 to the others (%d elements all-reduced per step%s)\n",
		res.Ranks, res.CommBytesPerStep, res.Comm.Elems, sharded)
	for _, m := range res.Comm.Matrices {
		fmt.Fprintf(w, "    %-10s %5dx%-5d %9d elements per block (%s); native all-reduces %d (%.3f)\n",
			m.Name, m.M, m.N, m.Elems, cfg.Mode, m.M*m.N, float64(m.Elems)/float64(m.M*m.N))
	}
}

// localRank is this rank's number among those mpirun started on this
// machine (OMPI_COMM_WORLD_LOCAL_RANK), -1 when it does not say.
func localRank() int {
	n, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_LOCAL_RANK"))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// localRanks is the number of ranks mpirun started on this machine
// (OMPI_COMM_WORLD_LOCAL_SIZE), 1 when it does not say.
func localRanks() int {
	n, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}
