// A data-parallel run that loses a rank (its process killed or crashed,
// or silent past the communicator's timeout): every surviving rank exits
// non-zero with its own line naming the lost rank and what is on disk.
//
// Two ways lead there. A collective waiting for the lost rank fails (on
// this host comm/mpi sees the process end within a tenth of a second),
// train.Run returns the error and trainCmd reports it. Or mpirun's
// SIGTERM comes first (it ends the job when a rank dies, with SIGKILL a
// second later) while this rank computes: the signal handler asks the
// communicator (Lost) and, unless the main goroutine reports first,
// reports and exits itself.
//
// No checkpoint is written after a lost rank: the step in progress can
// no longer finish on every rank, and a checkpoint must hold a step that
// every rank completed. The last one on disk was written (to a temp file,
// renamed) after such a step, so it is kept, and the line says which.

package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/mpi"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// peerWatcher is what comm/mpi's communicator knows of the other ranks'
// processes.
type peerWatcher interface {
	Lost() error
	Waiting() (mpi.Wait, bool)
}

// exit ends the process from the signal handler (a variable: the tests
// note the status).
var exit = os.Exit

// lostReported is set by whichever of the main goroutine and the signal
// handler reports a lost rank, so that the line is printed once.
var lostReported atomic.Bool

// signalGrace is how long the signal handler leaves the main goroutine to
// report a lost rank (its collective fails at once) before it reports
// itself: well under the second between mpirun's SIGTERM and SIGKILL.
const signalGrace = 250 * time.Millisecond

// lostOnSignal is trainCmd's signal hook under mpirun: when a peer's
// process has ended, it reports the lost rank and exits 1 (unless the
// main goroutine does so first) instead of stopping gracefully, which the
// ranks can no longer do together. Otherwise, when the signal finds this
// rank waiting in a collective, it says for which ranks: if mpirun is
// ending the job for a rank on another host, that is the likely one.
// Once trained is set (train.Run has returned: its collectives are over,
// and a peer that exits after them is not lost), it does nothing.
func lostOnSignal(c comm.Communicator, ckpt string, stderr io.Writer, logger *slog.Logger, trained *atomic.Bool) func(os.Signal) {
	pw, ok := c.(peerWatcher)
	if !ok || c.Size() == 1 {
		return nil
	}
	return func(s os.Signal) {
		if trained.Load() {
			return
		}
		if err := pw.Lost(); err != nil {
			var lost *mpi.LostError
			if !errors.As(err, &lost) {
				return
			}
			time.Sleep(signalGrace)
			if !lostReported.CompareAndSwap(false, true) {
				time.Sleep(time.Hour) // the main goroutine reports and exits
			}
			name := s.String()
			if s, ok := s.(syscall.Signal); ok {
				name = signalName(s)
			}
			fmt.Fprintln(stderr, "lsp-train:", lostRankError(fmt.Errorf("on %s: %w", name, err), lost, nil, ckpt))
			exit(1)
		}
		if w, ok := pw.Waiting(); ok && w.For >= 100*time.Millisecond {
			logger.Warn("the signal came during a collective, waiting for other ranks (if mpirun is ending the job, one of them was likely lost)",
				"collective", w.Op, "waiting_for", mpi.RanksText(w.Ranks), "waited", w.For.Round(time.Millisecond))
		}
	}
}

// reportLost turns train.Run's error into the lost-rank report when a
// rank was lost; other errors pass unchanged. When the signal handler is
// reporting it already, it waits for the handler's exit.
func reportLost(err error, res *train.Result, ckpt string) error {
	var lost *mpi.LostError
	if !errors.As(err, &lost) {
		return err
	}
	if !lostReported.CompareAndSwap(false, true) {
		time.Sleep(time.Hour) // the signal handler reports and exits
	}
	return lostRankError(err, lost, res, ckpt)
}

// lostRankError says which rank was lost, where (the collective, after
// which step: res may be nil), and which checkpoint is kept, before err.
func lostRankError(err error, lost *mpi.LostError, res *train.Result, ckpt string) error {
	var b strings.Builder
	was := "was"
	if len(lost.Ranks) > 1 {
		was = "were"
	}
	fmt.Fprintf(&b, "rank %d of %d: %s %s lost", lost.Rank, lost.Size, mpi.RanksText(lost.Ranks), was)
	if res != nil {
		fmt.Fprintf(&b, " after step %d", res.Steps)
	}
	if lost.During != "" {
		fmt.Fprintf(&b, " (in %s)", lost.During)
	}
	b.WriteString("; stopping without a checkpoint (the ranks cannot finish the step in progress together): ")
	switch step, cerr := checkpointStep(ckpt); {
	case cerr == nil:
		fmt.Fprintf(&b, "the last checkpoint, of step %d (%s), is kept; continue from it with mpirun -np %d and the same flags plus --resume",
			step, ckpt, lost.Size)
	case errors.Is(cerr, os.ErrNotExist):
		fmt.Fprintf(&b, "no checkpoint was saved before it (%s)", ckpt)
	default:
		fmt.Fprintf(&b, "the checkpoint on disk cannot be read: %v", cerr)
	}
	return fmt.Errorf("%s: %w", b.String(), err)
}

// checkpointStep is the step of the checkpoint at path, read from its
// header (mapped, not read: a large checkpoint's tensors stay on disk).
func checkpointStep(path string) (int, error) {
	if _, err := os.Stat(path); err != nil {
		return 0, err
	}
	f, err := safetensors.OpenMapped(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := checkpoint.ReadState(f)
	if err != nil {
		return 0, err
	}
	return st.Step, nil
}

// checkpointFile is where the run in out keeps its checkpoint.
func checkpointFile(out string) string { return filepath.Join(out, checkpoint.FileName) }
