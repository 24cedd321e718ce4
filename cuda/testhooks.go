//go:build cuda || cudasim

// Hooks for this package's tests that need cgo, which test files cannot
// have: a gate that holds a stream at a point until the test opens it (a
// host function, cudaLaunchHostFunc, that waits for a flag and calls no
// CUDA), so that "not completed yet" is a state a test can rely on rather
// than a race; and a kernel that fails while it runs (faultLaunch, one per
// build), to provoke a sticky error.

package cuda

/*
#include <stdint.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#define LSPCU_GATES 4096
static int lspcu_gates[LSPCU_GATES];
static int lspcu_next_gate;

static void CUDART_CB lspcu_gate_wait(void* flag) {
	while (!__atomic_load_n((int*)flag, __ATOMIC_ACQUIRE)) usleep(50);
}

// lspcu_gate queues a closed gate on stream s and returns its number, or
// -1 when all are used, or -2 - the cudaError_t of the launch.
static int lspcu_gate(uintptr_t s) {
	int g = __atomic_fetch_add(&lspcu_next_gate, 1, __ATOMIC_RELAXED);
	if (g >= LSPCU_GATES) return -1;
	int e = (int)cudaLaunchHostFunc((cudaStream_t)s, lspcu_gate_wait, &lspcu_gates[g]);
	return e != 0 ? -2 - e : g;
}

static void lspcu_gate_open(int g) { __atomic_store_n(&lspcu_gates[g], 1, __ATOMIC_RELEASE); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// gate holds stream s at the current point until open is called (once or
// more; later calls do nothing). A test must open every gate it queues, or
// the stream never drains.
func (b *Backend) gate(s backend.Stream) (open func(), err error) {
	st, err := b.stream(s)
	if err != nil {
		return nil, err
	}
	var g int
	err = b.w.do(func() error {
		g = int(C.lspcu_gate(C.uintptr_t(st.h)))
		switch {
		case g == -1:
			return errors.New("cuda: all test gates of this process are used")
		case g < -1:
			return rtErr("cudaLaunchHostFunc", C.int(-2-g))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { C.lspcu_gate_open(C.int(g)) }) }, nil
}

// fault enqueues on s a kernel that fails while it runs.
func (b *Backend) fault(s backend.Stream) error {
	return b.launch(s, "fault", func(st kernels.Stream) error {
		if err := faultLaunch(st); err != nil {
			return fmt.Errorf("enqueueing the failing kernel: %w", err)
		}
		return nil
	})
}
