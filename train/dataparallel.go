// Data-parallel runs (Options.Comm with several ranks, under mpirun): every
// rank opens the same model and data, reads every global batch (ranks x
// --grad-accum micro-batches of --batch rows) and trains on its own share,
// rank r on micro-batches r*G to r*G+G-1 (G = --grad-accum); the engine
// sums the compressed gradients over ranks (train/engine's dp.go), so
// every rank holds the same weights and optimizer state after every step.
// Rank 0 alone writes --out (metrics, checkpoints, the export, the plot)
// and shows progress; the other ranks only train, and every rank
// evaluates (the same weights give the same figures) so that they stay in
// step. A resume reads the checkpoint on every rank (--out must be on a
// file system they share) and needs the world size it was saved with:
// the data position and the sums depend on it.

package train

import (
	"fmt"
	"strconv"
	"time"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/device"
)

// ranksSetting is the checkpoint setting that records the world size of
// a data-parallel run; a checkpoint without it was saved by one process.
const ranksSetting = "ranks"

// world is the ranks a run trains with and what they must agree on: when
// to stop, when rank 0 is done writing, when every rank is done. Its zero
// value (no communicator) is a run alone, for which every method is what
// one process would do.
type world struct {
	comm    comm.Communicator // several ranks; nil alone
	devComm device.Comm       // and their devices' (--collectives); nil: the host sums
	// timeout is comm's usual timeout of a collective (Options.CommTimeout),
	// which rank0Only restores after waiting under Rank0Wait.
	timeout time.Duration
}

// size is the number of processes that train together.
func (w *world) size() int {
	if w.comm == nil {
		return 1
	}
	return w.comm.Size()
}

// rank0 reports whether this process writes the run's outputs: rank 0,
// or the only process.
func (w *world) rank0() bool { return w.comm == nil || w.comm.Rank() == 0 }

// sent is the payload this rank has sent to the others so far, over
// both communicators (0 alone).
func (w *world) sent() int64 {
	if w.comm == nil {
		return 0
	}
	n := w.comm.Stats().Sent()
	if w.devComm != nil {
		n += w.devComm.Stats().Sent()
	}
	return n
}

// openDeviceComm joins the ranks' devices as --collectives says: with
// auto, NCCL where the backend has it and every rank can start it (the
// ranks agree: cuda.NewNCCL fails on all of them or none), else the host.
func (r *run) openDeviceComm() error {
	if r.world.comm == nil {
		return nil
	}
	if r.cfg.Collectives == CollectivesHost {
		r.log.Info("collectives", "sums", "on the host (MPI)", "why", "--collectives host")
		return nil
	}
	dc, err := device.NewComm(r.cfg.Device, r.be, r.world.comm)
	switch {
	case err == nil:
		r.world.devComm = dc
		r.log.Info("collectives", "sums", "on the device (NCCL)")
	case r.cfg.Collectives == CollectivesNCCL:
		return flagErr("collectives", "%v", err)
	default:
		r.log.Info("collectives", "sums", "on the host (MPI)", "why", err)
	}
	return nil
}

// agree is stop as every rank sees it before step next: true when any
// rank wants to stop (a signal reaches each rank at its own moment; the
// ranks must still leave the loop after the same step).
func (w *world) agree(next int, stop bool) (bool, error) {
	if w.comm == nil {
		return stop, nil
	}
	x := []float32{0}
	if stop {
		x[0] = 1
	}
	if err := w.comm.AllReduceSum(x); err != nil {
		return false, fmt.Errorf("step %d: agreeing on stopping with the other ranks: %w", next, err)
	}
	return x[0] != 0, nil
}

// barrier waits until every rank is done, so that no rank exits (and
// makes mpirun end the others) while rank 0 still writes its outputs.
func (w *world) barrier() error {
	if w.comm == nil {
		return nil
	}
	if err := w.comm.Barrier(); err != nil {
		return fmt.Errorf("waiting for the other ranks at the end: %w", err)
	}
	return nil
}

// Rank0Wait is how long the other ranks wait for rank 0 to write a
// checkpoint or the export (a large model's can take minutes) before they
// give it up as lost.
const Rank0Wait = 30 * time.Minute

// rank0Only runs write on rank 0 while the other ranks wait for it at a
// barrier, under Rank0Wait rather than the communicator's usual timeout;
// alone it just runs write. Rank 0 joins the barrier even when write
// fails, so the others learn of the failure from mpirun (rank 0 then
// exits non-zero), not from a timeout.
func (w *world) rank0Only(write func() error) error { return w.rank0Writes(write, nil) }

// rank0Writes is rank0Only where the other ranks take part in the write
// (the collectives that bring rank 0 what it writes): they run join,
// under Rank0Wait too, before the barrier.
func (w *world) rank0Writes(write, join func() error) error {
	if w.comm == nil {
		return write()
	}
	if s, ok := w.comm.(interface{ SetTimeout(time.Duration) }); ok {
		s.SetTimeout(Rank0Wait)
		defer s.SetTimeout(w.timeout)
	}
	var err error
	switch {
	case w.rank0():
		err = write()
	case join != nil:
		err = join()
	}
	if berr := w.comm.Barrier(); berr != nil && err == nil {
		err = fmt.Errorf("waiting for rank 0 to write its outputs: %w", berr)
	}
	return err
}

// saveRanks records a data-parallel run's world size in the checkpoint
// (nothing for one process, whose checkpoints stay as they were).
func saveRanks(st *checkpoint.State, ranks int) {
	if ranks > 1 {
		st.Settings[ranksSetting] = strconv.Itoa(ranks)
	}
}

// checkResumeRanks refuses to resume a checkpoint saved by another number
// of ranks.
func checkResumeRanks(st checkpoint.State, ranks int, path string) error {
	saved := 1
	if v, ok := st.Settings[ranksSetting]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("resume: %s records %q ranks, not a world size", path, v)
		}
		saved = n
	}
	if saved == ranks {
		return nil
	}
	how := func(n int) string {
		if n == 1 {
			return "one process (no mpirun)"
		}
		return fmt.Sprintf("%d ranks (mpirun -np %d)", n, n)
	}
	return fmt.Errorf("resume: %s was saved by a run of %s, and this run has %s: the data each step reads and the sums "+
		"over ranks depend on the world size; resume with %s, or start a new run (--overwrite, or another --out)",
		path, how(saved), how(ranks), how(saved))
}
