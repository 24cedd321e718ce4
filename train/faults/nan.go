// Numerical faults: a NaN injected into one micro-batch of one optimizer
// step, so that tests can prove what a non-finite loss or gradient does to
// a run (--on-nonfinite) in every mode, without having to find weights and
// data that diverge on cue.
//
// Like the write faults this is a test hook, not a feature: it is armed
// by LSP_NAN_AT, read once at start-up (a child process a test starts), or
// in-process by ArmNaN, and unarmed it costs one atomic load per
// micro-batch of a step. The engine asks NaNAt while it builds a step's
// graph, so the injection is the same in the sequential and the pipelined
// schedule.
//
// A spec is a comma-separated list of KIND@STEP[/MICRO][:N]:
//
//	loss  the micro-batch's loss becomes NaN (its first token's), its
//	      gradients stay finite: only the loss can tell that the step is bad
//	grad  the micro-batch's gradients become NaN (its loss scale is NaN),
//	      its loss stays finite: the bad step shows only in the gradients
//	both  the loss and the gradients, as when a forward pass overflows
//
// at optimizer step STEP (1-based, the step being attempted), micro-batch
// MICRO (0-based, default 0), for the first N passings (default 1). A step
// skipped for a non-finite loss is attempted again under the same number
// with the next batch, so loss@3:4 makes four attempts in a row at step 3
// non-finite.

package faults

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// NaNEnv is the environment variable that arms NaN injections at start-up.
const NaNEnv = "LSP_NAN_AT"

// NaNKind is what an injection makes non-finite.
type NaNKind int

// Kinds of NaN injection.
const (
	NoNaN   NaNKind = iota // nothing injected
	NaNLoss                // the loss (gradients stay finite)
	NaNGrad                // the gradients (the loss stays finite)
	NaNBoth                // the loss and the gradients
)

func (k NaNKind) String() string {
	switch k {
	case NaNLoss:
		return "loss"
	case NaNGrad:
		return "grad"
	case NaNBoth:
		return "both"
	}
	return "none"
}

// nanFault is one armed entry and its passings so far.
type nanFault struct {
	kind        NaNKind
	step, micro int
	n, seen     int
}

// nanFaults are the armed entries; mu guards their counts.
type nanFaults struct {
	mu      sync.Mutex
	entries []*nanFault
}

var armedNaN atomic.Pointer[nanFaults]

func init() {
	spec := os.Getenv(NaNEnv)
	if spec == "" {
		return
	}
	fs, err := parseNaN(spec)
	if err != nil {
		// A test armed it wrongly; failing loudly beats testing nothing.
		fmt.Fprintf(os.Stderr, "faults: %s=%q: %v\n", NaNEnv, spec, err)
		os.Exit(2)
	}
	armedNaN.Store(fs)
}

// parseNaN reads a comma-separated list of KIND@STEP[/MICRO][:N].
func parseNaN(spec string) (*nanFaults, error) {
	fs := &nanFaults{}
	for _, e := range strings.Split(spec, ",") {
		f := &nanFault{}
		kind, at, ok := strings.Cut(e, "@")
		switch kind {
		case "loss":
			f.kind = NaNLoss
		case "grad":
			f.kind = NaNGrad
		case "both":
			f.kind = NaNBoth
		default:
			return nil, fmt.Errorf("%q: the kind must be loss, grad or both (want KIND@STEP[/MICRO][:N])", e)
		}
		if !ok {
			return nil, fmt.Errorf("%q: no step (want KIND@STEP[/MICRO][:N])", e)
		}
		at, n, err := cutCount(at)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", e, err)
		}
		f.n = n
		step, micro, hasMicro := strings.Cut(at, "/")
		if f.step, err = strconv.Atoi(step); err != nil || f.step < 1 {
			return nil, fmt.Errorf("%q: the step must be a positive integer", e)
		}
		if hasMicro {
			if f.micro, err = strconv.Atoi(micro); err != nil || f.micro < 0 {
				return nil, fmt.Errorf("%q: the micro-batch after '/' must be an integer >= 0", e)
			}
		}
		fs.entries = append(fs.entries, f)
	}
	return fs, nil
}

// ArmNaN arms spec in this process (tests only) and returns the function
// that disarms it. It replaces any NaN injection armed before; the write
// faults (Arm) are separate.
func ArmNaN(spec string) (disarm func(), err error) {
	return arm(&armedNaN, spec, parseNaN)
}

// NaNAt returns the injection due at micro-batch micro of step step and
// counts the passing against it; NoNaN when none is armed there or its
// passings are used up. When entries name the same place, the first one
// not used up is due (so loss@3,grad@3 is a NaN loss, then a NaN
// gradient at the next attempt).
func NaNAt(step, micro int) NaNKind {
	fs := armedNaN.Load()
	if fs == nil {
		return NoNaN
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range fs.entries {
		if f.step == step && f.micro == micro && f.seen < f.n {
			f.seen++
			return f.kind
		}
	}
	return NoNaN
}
