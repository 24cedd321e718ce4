// Checkpoints: writing the run's state (weights, optimizer state, data
// position, settings) to --out atomically, and restoring it on --resume.
// What a resume must share with the run that saved the checkpoint is
// resume.go's; the file format is train/checkpoint's.
//
// Limits: rank 0 alone writes, every rank sending it its shard of zero
// mode's host optimizer state as it writes; one checkpoint is kept, the
// latest.

package train

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// saveCheckpoint writes the run's state to --out, atomically. Every rank
// holds the same weights and rank 0 writes them; zero mode's host
// optimizer is sharded among the ranks, and each of its arrays is
// gathered group by group as rank 0 writes it, every rank taking part
// (joinCheckpoint).
func (r *run) saveCheckpoint() error {
	return r.world.rank0Writes(r.writeCheckpoint, r.joinCheckpoint)
}

// joinCheckpoint is a rank's part in rank 0's checkpoint write: the
// gathers of a sharded optimizer's arrays (nothing otherwise).
func (r *run) joinCheckpoint() error {
	if err := r.eng.Drain(); err != nil {
		return fmt.Errorf("step %d: %w", r.step, err)
	}
	_, finish, err := r.eng.StateArrays()
	if err == nil {
		err = finish()
	}
	if err != nil {
		return fmt.Errorf("step %d: checkpoint: %w", r.step, err)
	}
	return nil
}

// writeCheckpoint is saveCheckpoint's write, on rank 0 (or alone).
func (r *run) writeCheckpoint() error {
	t0 := time.Now()
	defer func() { r.times.Checkpoint += time.Since(t0) }()
	releaseHost() // the steps' garbage, before the checkpoint's buffers come on top
	defer phase("checkpoint write")()
	st := checkpoint.State{Step: r.step, Position: r.loader.Position(), Model: r.mc, Tokens: r.tokens}
	saveSettings(&st, r.cfg.resumeIdentity(r.fromCheckpoint), r.cfg.resumeAllowed())
	saveRanks(&st, r.world.size())
	if err := checkpoint.SaveFrom(r.checkpointPath(), r.mc.NumParams(), r.fetchParams, r.eng, st); err != nil {
		return diskHint(fmt.Errorf("step %d: %w", r.step, err))
	}
	return r.keepCheckpoint()
}

// resume restores the checkpoint in --out after checking that it was
// saved with this run's identity, and moves the data to where it stopped.
func (r *run) resume() error {
	path := r.checkpointPath()
	defer phase("checkpoint restore")()
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
	store := r.storeParams
	if base := r.eng.Base(); base != nil {
		// The base is not saved whole: it is quantized again from
		// --model, then checked against the checkpoint's values.
		if err := r.loadWeights(); err != nil {
			return err
		}
		store = func(off int, v []float32) error { return base.Verify(r.s, off, v) }
	}
	if err := ck.RestoreWith(r.mc.NumParams(), store, r.eng); err != nil {
		if ce := (*quant.ChangedError)(nil); errors.As(err, &ce) {
			return flagErr("model", "%s: the base weights changed since the run in %s started (--base-dtype quantizes them again on resume): %s", r.cfg.Model, r.cfg.Out, ce.Detail)
		}
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
