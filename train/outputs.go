// The run's output directory (--out): refusing another run's outputs,
// clearing what a killed run left, the final Hugging Face export and the
// loss plot, and the hint for a write that found the disk full.
//
// Limits: rank 0 alone writes --out; an interrupted run gets the plot but
// no export.

package train

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// checkOut refuses a non-empty --out unless --resume continues the run
// in it (and it holds a checkpoint) or --overwrite replaces its outputs,
// so that another run's checkpoint and metrics are never overwritten by
// mistake; a run without --out (Options.DefaultOut) replaces those of an
// earlier such run, which DefaultOutMarker marks, as if --overwrite.
func (r *run) checkOut() error {
	if r.cfg.Resume {
		return r.checkResumable()
	}
	if r.cfg.Overwrite || !r.world.rank0() {
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
	if r.opts.DefaultOut {
		_, err := os.Stat(filepath.Join(r.cfg.Out, DefaultOutMarker))
		if err == nil {
			r.cfg.Overwrite = true // an earlier run of the plain command: prepareOut replaces its outputs
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return flagErr("out", "%v", err)
		}
	}
	var names []string
	for _, e := range ents[:min(len(ents), 4)] {
		names = append(names, e.Name())
	}
	if len(ents) > 4 {
		names = append(names, "...")
	}
	whose := "it holds another run's outputs"
	if r.opts.DefaultOut {
		// Without the marker they may be anyone's: a run given --out
		// explicitly, or files of the user's own.
		whose = fmt.Sprintf("no run without --out wrote it (it has no %s), so it is not replaced unasked", DefaultOutMarker)
	}
	return flagErr("out", "%s is not empty (%s): %s; continue that run with --resume, "+
		"replace its outputs with --overwrite, or choose another --out", r.cfg.Out, strings.Join(names, ", "), whose)
}

// DefaultOutMarker is the file a run without --out leaves in out/: the
// next such run replaces the outputs of a directory holding it, and
// refuses one without (another run's, or the user's own files).
const DefaultOutMarker = ".lsp-train-default-out"

// markOut writes DefaultOutMarker into --out for a run without --out, and
// removes it for any other, whose outputs must not be replaced silently.
func (r *run) markOut() error {
	p := filepath.Join(r.cfg.Out, DefaultOutMarker)
	if !r.opts.DefaultOut {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return flagErr("out", "%v", err)
		}
		return nil
	}
	msg := "This directory holds the outputs of an lsp-train run given no --out; the next such run replaces them.\n"
	if err := os.WriteFile(p, []byte(msg), 0o644); err != nil {
		return flagErr("out", "%v", diskHint(err))
	}
	return nil
}

// checkResumable refuses --resume when --out holds no checkpoint, before
// the model and data are read, naming the file looked for and both ways
// on rather than the open's "no such file".
func (r *run) checkResumable() error {
	path := r.checkpointPath()
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return flagErr("resume", "no checkpoint to continue: %s does not exist; give the --out of the run to continue "+
			"(the directory holding its %s), or leave --resume out to start a new run", path, checkpoint.FileName)
	}
	if err != nil {
		return flagErr("resume", "%v", err)
	}
	return nil
}

// previousOutputs are the files and directories of a run's outputs that
// --overwrite removes before a new run starts in the same --out.
var previousOutputs = []string{checkpoint.FileName, "metrics.jsonl", "loss.png", "hf", "checkpoints", "hf-step-*", "tb"}

// prepareOut creates --out, removes what a killed run's atomic writes
// left there, and with --overwrite (and no --resume) the outputs of the
// run before, so that a kill before this run's first checkpoint cannot
// leave another run's checkpoint to resume.
func (r *run) prepareOut() error {
	if !r.world.rank0() {
		return nil // rank 0 alone writes --out
	}
	if err := os.MkdirAll(r.cfg.Out, 0o755); err != nil {
		return flagErr("out", "%v", err)
	}
	removed, err := atomicfile.Clean(r.cfg.Out)
	if err != nil {
		return flagErr("out", "%v", err)
	}
	if more, err := atomicfile.Clean(keptDir(r.cfg.Out)); err == nil {
		removed = append(removed, more...)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return flagErr("out", "%v", err)
	}
	if len(removed) > 0 {
		r.log.Info("removed the leftovers of an interrupted write", "out", r.cfg.Out, "names", removed)
	}
	if r.cfg.Overwrite && !r.cfg.Resume {
		if err := r.removePrevious(); err != nil {
			return err
		}
	}
	return r.markOut()
}

// removePrevious removes the outputs of the run before (--overwrite, or
// an earlier run without --out), logging what it removes.
func (r *run) removePrevious() error {
	if r.opts.DefaultOut {
		// Overwrite was set by checkOut, not given: say so in plain words.
		r.log.Info(fmt.Sprintf("%s holds the outputs of an earlier run with the default --out: replacing them (give --out DIR to keep them)", r.cfg.Out))
	}
	for _, name := range previousOutputs {
		ps, _ := filepath.Glob(filepath.Join(r.cfg.Out, name)) // the patterns are well formed
		for _, p := range ps {
			if err := os.RemoveAll(p); err != nil {
				return flagErr("out", "removing an earlier run's outputs: %v", err)
			}
			if !r.opts.DefaultOut {
				r.log.Info("--overwrite: removed an earlier run's output", "path", p)
			}
		}
	}
	return nil
}

// export writes the final weights as a Hugging Face directory.
func (r *run) export(res *Result) error {
	t0 := time.Now()
	defer func() { r.times.Export += time.Since(t0) }()
	res.Export = filepath.Join(r.cfg.Out, "hf")
	if err := r.exportTo(res.Export); err != nil {
		return err
	}
	if r.usesAdapters() {
		res.Adapter = adapterDir(res.Export)
	}
	return nil
}

// plot draws the loss curves of metrics.jsonl into loss.png, also for an
// interrupted run; a run interrupted before its first step has none.
func (r *run) plot(res *Result) error {
	t0 := time.Now()
	defer func() { r.times.Export += time.Since(t0) }()
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
