// Package faults injects test-only faults at named write points: the
// process kills itself there with SIGKILL, or the write fails there with
// ENOSPC, so that tests can prove a crash or a full disk at each point
// loses nothing; or the process sends itself SIGINT or SIGTERM there, as
// a user's Ctrl-C would, so that tests can interrupt a precise moment.
//
// This is a test hook, not a feature: nothing sets it in normal use. It
// is armed by an environment variable read once at start-up, by a child
// process that a test starts (LSP_KILL_AT, LSP_FAIL_AT, LSP_SIGINT_AT,
// LSP_SIGTERM_AT), or in-process by
// a test through Arm. Unarmed, Point is one atomic load and a nil check.
// Numerical faults (a NaN in one micro-batch's loss or gradients,
// LSP_NAN_AT, ArmNaN) are nan.go's.
//
// A spec is POINT[@FILE][:N]: the N-th passing (default 1) of POINT, only
// counting passings whose file is FILE when @FILE is given. A kill
// happens at that passing; a failure happens at that passing and every
// later one (a full disk stays full).
//
// The points, in the order one write passes them:
//
//	atomicfile.WriteFile (FILE is the target's base name, e.g. checkpoint.safetensors):
//	  temp-partial   the first bytes reached the temp file (it is partly written)
//	  temp-written   the temp file holds every byte, not yet fsynced
//	  temp-fsynced   the temp file is fsynced and closed
//	  renamed        the temp file was renamed over the target
//	  dir-fsynced    the directory was fsynced: the write is durable
//	atomicfile.WriteDir (FILE is the directory's base name, e.g. hf):
//	  dir-written    the temp directory is complete and fsynced
//	  dir-renamed    the temp directory replaced the old one, which is not yet removed
//	metrics.Writer (FILE is metrics.jsonl):
//	  metrics-partial  half of a record's line was appended
//	  metrics-appended the whole line was appended
//	the training run (FILE is empty):
//	  step           a step's metrics record was written
//	  eval           an evaluation was computed, its record not yet written
//	  eval-batch     an evaluation finished a batch (of the loss or of generation)
package faults

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The environment variables that arm a fault in a process at start-up.
const (
	KillEnv    = "LSP_KILL_AT"    // SIGKILL the process at the spec's passing
	FailEnv    = "LSP_FAIL_AT"    // fail with ENOSPC from the spec's passing on
	SigintEnv  = "LSP_SIGINT_AT"  // send the process SIGINT at the spec's passing
	SigtermEnv = "LSP_SIGTERM_AT" // send the process SIGTERM at the spec's passing
)

// Kind is what happens at an armed point.
type Kind int

// Kinds of fault.
const (
	Kill    Kind = iota // the process sends itself SIGKILL
	Fail                // the write returns an error wrapping syscall.ENOSPC
	Sigint              // the process sends itself SIGINT and goes on
	Sigterm             // the process sends itself SIGTERM and goes on
)

// fault is an armed spec and its count of passings so far.
type fault struct {
	kind  Kind
	point string
	file  string // "" matches every file
	n     int
	mu    sync.Mutex
	seen  int
}

var armed atomic.Pointer[fault]

func init() {
	for _, e := range []struct {
		env  string
		kind Kind
	}{{KillEnv, Kill}, {FailEnv, Fail}, {SigintEnv, Sigint}, {SigtermEnv, Sigterm}} {
		spec := os.Getenv(e.env)
		if spec == "" {
			continue
		}
		f, err := parse(e.kind, spec)
		if err != nil {
			// A test armed it wrongly; failing loudly beats testing nothing.
			fmt.Fprintf(os.Stderr, "faults: %s=%q: %v\n", e.env, spec, err)
			os.Exit(2)
		}
		armed.Store(f)
	}
}

// parse reads POINT[@FILE][:N].
func parse(kind Kind, spec string) (*fault, error) {
	rest, n, err := cutCount(spec)
	if err != nil {
		return nil, err
	}
	f := &fault{kind: kind, n: n}
	f.point, f.file, _ = strings.Cut(rest, "@")
	if f.point == "" {
		return nil, fmt.Errorf("no point named (want POINT[@FILE][:N])")
	}
	return f, nil
}

// cutCount splits a spec's optional trailing ":N", the number of passings
// it is due for (1 when absent), from the rest.
func cutCount(spec string) (rest string, n int, err error) {
	i := strings.LastIndexByte(spec, ':')
	if i < 0 {
		return spec, 1, nil
	}
	if n, err = strconv.Atoi(spec[i+1:]); err != nil || n < 1 {
		return "", 0, errors.New("the count after ':' must be a positive integer")
	}
	return spec[:i], n, nil
}

// arm stores what parse makes of spec in slot, and returns the function
// that puts back what was there: Arm and ArmNaN for tests.
func arm[T any](slot *atomic.Pointer[T], spec string, parse func(string) (*T, error)) (disarm func(), err error) {
	v, err := parse(spec)
	if err != nil {
		return nil, fmt.Errorf("faults: %q: %w", spec, err)
	}
	old := slot.Swap(v)
	return func() { slot.Store(old) }, nil
}

// Arm arms spec in this process (tests only) and returns the function
// that disarms it. It replaces any fault armed before.
func Arm(kind Kind, spec string) (disarm func(), err error) {
	return arm(&armed, spec, func(spec string) (*fault, error) { return parse(kind, spec) })
}

// Point marks the write point name for the file with base name file. It
// returns nil unless a fault armed for it is due: then it kills the
// process, or returns an error wrapping syscall.ENOSPC for the caller to
// treat as the write's own error.
func Point(name, file string) error {
	f := armed.Load()
	if f == nil || f.point != name || (f.file != "" && f.file != file) {
		return nil
	}
	f.mu.Lock()
	f.seen++
	due := f.seen >= f.n
	if f.kind != Fail {
		due = f.seen == f.n // once
	}
	f.mu.Unlock()
	if !due {
		return nil
	}
	switch f.kind {
	case Kill:
		// SIGKILL, not an exit: no deferred function, flush or signal
		// handler runs, as when the machine is preempted.
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	case Sigint, Sigterm:
		sig := syscall.SIGINT
		if f.kind == Sigterm {
			sig = syscall.SIGTERM
		}
		syscall.Kill(os.Getpid(), sig)
		// Time for the handler to see it, so that the test knows the
		// point the process was at when it did.
		time.Sleep(200 * time.Millisecond)
		return nil
	}
	return fmt.Errorf("fault injected at %s of %s: %w", name, file, syscall.ENOSPC)
}

// Armed says whether a fault is armed, for callers that only take a
// slower path (such as splitting a write in two) while one is.
func Armed() bool { return armed.Load() != nil }
