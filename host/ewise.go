// ewise.go: the CPU backend's cross-entropy and gelu (train/cpu) on the
// SIMD paths; ewise.h states the arithmetic and why it is the same bits on
// every path and for any split of the work.

package host

/*
#include "ewise.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// CrossEntropy does rows [lo, hi) of logits [N, V] (N = len(losses)) on
// the calling goroutine: loss = logsumexp(z) - z[target] in double,
// rounded once; when scale != 0 the row becomes scale * (softmax(z) -
// onehot(target)). A negative target gives loss 0 and, when scale != 0, a
// zero row. Targets must be below V.
func CrossEntropy(losses, logits []float32, targets []int32, V int, scale float32, lo, hi int) error {
	N := len(losses)
	if V <= 0 || len(logits) < N*V || len(targets) < N || lo < 0 || hi > N {
		return fmt.Errorf("host: cross entropy: rows [%d, %d) of %d, V %d, logits %d, targets %d", lo, hi, N, V, len(logits), len(targets))
	}
	for r := lo; r < hi; r++ {
		if int(targets[r]) >= V {
			return fmt.Errorf("host: cross entropy: target %d at row %d outside vocabulary of %d", targets[r], r, V)
		}
	}
	if lo >= hi {
		return nil
	}
	if C.lsp_host_xent(C.int(ActiveSIMD()), ptr(losses), ptr(logits), (*C.int32_t)(unsafe.Pointer(&targets[0])),
		C.long(V), C.float(scale), C.long(lo), C.long(hi)) != 0 {
		return fmt.Errorf("host: cross entropy: no memory for a row's exponentials")
	}
	return nil
}

// GeluForward sets out = gelu_new(x) = x * sigmoid(2u), u = sqrt(2/pi) (x
// + 0.044715 x^3), on the calling goroutine.
func GeluForward(out, x []float32) error {
	if len(out) != len(x) {
		return fmt.Errorf("host: gelu forward: len(out) %d, len(x) %d", len(out), len(x))
	}
	if len(x) > 0 {
		C.lsp_host_gelu_forward(C.int(ActiveSIMD()), ptr(out), ptr(x), C.size_t(len(x)))
	}
	return nil
}

// GeluBackward sets dinp = dout * gelu_new'(x) on the calling goroutine;
// dinp may be dout itself.
func GeluBackward(dinp, x, dout []float32) error {
	if len(dinp) != len(x) || len(dout) != len(x) {
		return fmt.Errorf("host: gelu backward: len(dinp) %d, len(x) %d, len(dout) %d", len(dinp), len(x), len(dout))
	}
	if len(x) > 0 {
		C.lsp_host_gelu_backward(C.int(ActiveSIMD()), ptr(dinp), ptr(x), ptr(dout), C.size_t(len(x)))
	}
	return nil
}
