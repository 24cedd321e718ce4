package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/mpi"
)

// lostComm is rank 0 of 2 whose peer's process has ended, as comm/mpi's
// Lost reports it (the real one is tested under mpirun in train/comm/mpi:
// TestKilledRank, TestKilledRankIdle).
type lostComm struct{ comm.Communicator }

func (lostComm) Size() int { return 2 }
func (lostComm) Rank() int { return 0 }
func (lostComm) Lost() error {
	return fmt.Errorf("lost: %w", &mpi.LostError{Rank: 0, Size: 2, Ranks: []int{1}, During: "AllReduceSum #7 of 3 elements", Ended: true})
}
func (lostComm) Waiting() (mpi.Wait, bool) { return mpi.Wait{}, false }

// lostSignalEnv makes TestLostRankOnSignal's child the rank that gets
// SIGTERM while it computes.
const lostSignalEnv = "LSP_TRAIN_LOST_SIGNAL_CHILD"

// TestLostRankOnSignal: mpirun's SIGTERM reaches a rank that computes
// (no collective to fail) after a peer died: the signal handler itself
// must print the lost rank and the checkpoint kept, and exit 1, well
// within the second before mpirun's SIGKILL.
func TestLostRankOnSignal(t *testing.T) {
	if ck := os.Getenv(lostSignalEnv); ck != "" {
		logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
		_, _, done := interruptible(logger, "interrupt", lostOnSignal(lostComm{}, ck, os.Stderr, logger, new(atomic.Bool)))
		defer done()
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		time.Sleep(10 * time.Second) // a long step
		fmt.Println("FAIL: still running 10 s after SIGTERM")
		os.Exit(0)
	}
	ck, err := filepath.Abs("../../train/testdata/checkpoint-v2/lsp/checkpoint.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	step, err := checkpointStep(ck)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ckpt, kept string
	}{
		{ck, fmt.Sprintf(`the last checkpoint, of step %d \(%s\), is kept; continue from it with mpirun -np 2 and the same flags plus --resume`,
			step, regexp.QuoteMeta(ck))},
		{"/nonexistent/checkpoint.safetensors", `no checkpoint was saved before it \(/nonexistent/checkpoint.safetensors\)`},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLostRankOnSignal$")
		cmd.Env = append(os.Environ(), lostSignalEnv+"="+c.ckpt)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t0 := time.Now()
		err := cmd.Run()
		el := time.Since(t0)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("exit: %v, want status 1; output:\n%s", err, out.String())
		}
		if el > 900*time.Millisecond {
			t.Errorf("took %v after SIGTERM, want well under mpirun's second before SIGKILL", el)
		}
		re := regexp.MustCompile(`(?m)^lsp-train: rank 0 of 2: rank 1 was lost \(in AllReduceSum #7 of 3 elements\); ` +
			`stopping without a checkpoint \(the ranks cannot finish the step in progress together\): ` + c.kept +
			`: on SIGTERM: lost: $`)
		if !re.MatchString(out.String()) {
			t.Errorf("no line matching %s; output:\n%s", re, out.String())
		}
	}
}
