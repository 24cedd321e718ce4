// Checkpoints: writing the run's state (weights, optimizer state, data
// position, settings) to --out atomically, and restoring it on --resume.
// What a resume must share with the run that saved the checkpoint is
// resume.go's; the file format is train/checkpoint's.
//
// Limits: rank 0 alone writes, after every rank has sent it its shard of
// zero mode's host optimizer state; one checkpoint is kept, the latest.

package train

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
)

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
	return r.world.rank0Only(r.writeCheckpoint)
}

// writeCheckpoint is saveCheckpoint's write, on rank 0 (or alone).
func (r *run) writeCheckpoint() error {
	t0 := time.Now()
	defer func() { r.times.Checkpoint += time.Since(t0) }()
	releaseHost()       // the steps' garbage, before the checkpoint's values come on top
	defer releaseHost() // the checkpoint's values
	st := checkpoint.State{Step: r.step, Position: r.loader.Position(), Model: r.mc, Tokens: r.tokens}
	saveSettings(&st, r.cfg.resumeIdentity(r.fromCheckpoint), r.cfg.resumeAllowed())
	saveRanks(&st, r.world.size())
	if err := checkpoint.Save(r.checkpointPath(), r.be, r.s, r.model.Buffers().Params, r.eng, st); err != nil {
		return diskHint(fmt.Errorf("step %d: %w", r.step, err))
	}
	return nil
}

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
	if err := checkResumeRanks(ck.State, r.world.size(), path); err != nil {
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

// checkpointPath is where the run's checkpoint is, the latest one only.
func (r *run) checkpointPath() string { return filepath.Join(r.cfg.Out, checkpoint.FileName) }
