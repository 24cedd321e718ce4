//go:build lsp_sim

package simtest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
)

// TestLaunchErrorsAreTheirOwn: many goroutines launch at once, each
// alternating failures that carry its own numbers in the simulator's
// message with launches that must succeed, and each checks that every
// error (or success) it gets is its own.
//
// It guards the generated face's shims (kernels/launch_gen.go,
// selftest_gen.go): the CUDA last error and the simulator's message are per
// OS thread, and a goroutine may move to another thread between two cgo
// calls. Reading the message in a second call (the old Check) gave one
// launch another's message; not clearing the thread's last error before a
// launch let a launcher return an error an earlier call left on that
// thread (cudaFuncSetAttribute's failure stays there, as in CUDA: one CI
// run in five failed TestSoftmaxCe/N7_V1007_bf16_scale0 that way).
func TestLaunchErrorsAreTheirOwn(t *testing.T) {
	const goroutines, rounds, n = 12, 40, 37
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		x := Rand(uint64(g), n, 4)
		in, out := FromFloat32(t, x), Alloc(t, 2*n)
		want := BF16Bits(x)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- launchRounds(g, rounds, in, out, want)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// launchRounds is one goroutine of TestLaunchErrorsAreTheirOwn; it returns
// the first wrong result.
func launchRounds(g, rounds int, in, out *Buffer, want []uint16) error {
	n := len(want)
	for r := range rounds {
		// A launch configuration error; the message names the grid.
		gy := 65536 + g*rounds + r
		err := stConfig(1, gy, 1, 32, 1, 1, 0, 0, 0)
		if e := asLaunchError(err); e == nil || e.Name != "cudaErrorInvalidConfiguration" ||
			!strings.Contains(e.Detail, fmt.Sprintf("grid (1,%d,1)", gy)) {
			return fmt.Errorf("goroutine %d round %d: grid y %d gave %v, want its own invalid configuration", g, r, gy, err)
		}
		// cudaFuncSetAttribute refused: its error stays as this thread's
		// last error, and its message names the size.
		attr := 227<<10 + 1 + g*rounds + r
		err = stConfig(1, 1, 1, 32, 1, 1, 0, attr, 0)
		if e := asLaunchError(err); e == nil || e.Name != "cudaErrorInvalidValue" ||
			!strings.Contains(e.Detail, fmt.Sprintf("MaxDynamicSharedMemorySize %d ", attr)) {
			return fmt.Errorf("goroutine %d round %d: attribute %d gave %v, want its own invalid value", g, r, attr, err)
		}
		// Launches that must succeed, whatever the thread saw before.
		if err := stConfig(2, 1, 1, 32, 1, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("goroutine %d round %d: a good configuration failed: %v", g, r, err)
		}
		clear(out.Uint16())
		if err := kernels.CastF32ToBF16(out.Dev(), in.Dev(), int64(n), 0); err != nil {
			return fmt.Errorf("goroutine %d round %d: a good cast failed: %v", g, r, err)
		}
		for i, h := range out.Uint16() {
			if h != want[i] {
				return fmt.Errorf("goroutine %d round %d: cast element %d = %#04x, want %#04x", g, r, i, h, want[i])
			}
		}
		// The launcher refuses its arguments itself: no simulator message,
		// in particular not another launch's.
		err = kernels.CastF32ToBF16(out.Dev(), in.Dev(), int64(-1-g), 0)
		if e := asLaunchError(err); e == nil || e.Name != "cudaErrorInvalidValue" || e.Detail != "" {
			return fmt.Errorf("goroutine %d round %d: a negative size gave %v, want invalid value and no message", g, r, err)
		}
	}
	return nil
}

// asLaunchError returns err as a *kernels.Error, or nil.
func asLaunchError(err error) *kernels.Error {
	var e *kernels.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}
