// Package mpitest launches a test binary under mpirun, as the
// data-parallel tests do: a test re-executes its own binary as the ranks
// of a job, which take a scenario from the environment instead of running
// the tests (train/comm/mpi, cuda/nccltest, train/engine, cmd/lsp-train).
package mpitest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Command is mpirun -np np running this test binary (os.Args[0]) with
// args, env added to the environment, one rank per process however many
// cores there are, in a process group of its own that a cancelled ctx
// kills whole. Without mpirun it skips t.
func Command(ctx context.Context, t testing.TB, np int, env []string, args ...string) *exec.Cmd {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)")
	}
	margs := []string{"--oversubscribe", "--bind-to", "none", "-np", strconv.Itoa(np), os.Args[0]}
	if os.Geteuid() == 0 {
		margs = append([]string{"--allow-run-as-root"}, margs...)
	}
	cmd := exec.CommandContext(ctx, mpirun, append(margs, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// Run runs Command to its end and returns the output (stdout and stderr
// together), mpirun's exit error and the time it took; it fails t when
// mpirun is still running after limit.
func Run(t testing.TB, np int, limit time.Duration, env []string, args ...string) (string, error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := Command(ctx, t, np, env, args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err := cmd.Run()
	el := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("mpirun -np %d %v still running after %v; output:\n%s", np, env, el, buf.String())
	}
	return buf.String(), err, el
}
