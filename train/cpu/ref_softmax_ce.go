// CPU reference for the fused softmax + cross-entropy of
// kernels/softmax_ce.cu, with the launcher's name and argument order
// (lsp_cross_entropy_forward_backward). For each of N rows of logits z
// [N, V] with target t (int32 [N]):
//
//	losses[row] = logsumexp(z) - z[t]                        (fp32 [N])
//	z <- scale * (softmax(z) - onehot(t))    when scale != 0 (in place)
//
// Rows with a negative target are ignored: loss 0 and, when scale != 0, a
// zero row; with scale == 0 the logits are not written.
//
// The loops are C, package host's (host/ewise.c, host.CrossEntropy), for
// speed: a vectorisable double-precision exp, and each row's sum in 8
// interleaved double partial sums added by a fixed tree, so every SIMD
// path and any split of the rows (the op splits them over threads; the
// function here does all of them) give the same bits. The log-sum-exp is
// in double, rounded once; the gradient rounds scale*p, then subtracts
// scale at the target, as the kernel does (which computes in fp32).
//
// Limits: fp32 logits (callers holding bf16 widen them before and round
// after, as the kernel does); a target >= V is an error here, where the
// kernel, which cannot report it, gives a NaN loss.

package cpu

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/host"
)

// CrossEntropyForwardBackward writes the N losses and, when scale != 0,
// overwrites the logits with scale * (softmax - onehot). It checks every
// target first and writes nothing if one is V or more.
func CrossEntropyForwardBackward(losses, logits []float32, targets []int32, N, V int, scale float32) error {
	if N < 0 || V < 1 || len(losses) < N || len(logits) < N*V || len(targets) < N {
		return fmt.Errorf("cross entropy: N=%d V=%d with %d losses, %d logits, %d targets", N, V, len(losses), len(logits), len(targets))
	}
	if err := checkTargets(targets[:N], V); err != nil {
		return err
	}
	return host.CrossEntropy(losses[:N], logits[:N*V], targets[:N], V, scale, 0, N)
}

// checkTargets returns an error naming the first target of V or more
// (negative targets mark ignored rows).
func checkTargets(targets []int32, V int) error {
	for i, t := range targets {
		if int(t) >= V {
			return fmt.Errorf("target %d at row %d outside vocabulary of %d", t, i, V)
		}
	}
	return nil
}
