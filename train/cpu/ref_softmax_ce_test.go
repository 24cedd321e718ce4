// The float64 reference of softmax + cross-entropy, whose gradient central
// finite differences check, and the check that the reference function of
// ref_softmax_ce.go, which does every row on one goroutine, gives the op's
// bits, which splits the rows over threads.

package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// crossEntropy64 returns per-row losses -log softmax(z)[target] (0 where the
// target is negative) and scale * d(sum of losses)/dz.
func crossEntropy64(z []float64, targets []int32, N, V int, scale float64) (losses, dz []float64) {
	losses, dz = make([]float64, N), make([]float64, N*V)
	for r := range N {
		if targets[r] < 0 {
			continue
		}
		row := z[r*V : (r+1)*V]
		var sum float64
		for _, v := range row {
			sum += math.Exp(v)
		}
		losses[r] = math.Log(sum) - row[targets[r]]
		for i, v := range row {
			dz[r*V+i] = scale * math.Exp(v) / sum
		}
		dz[r*V+int(targets[r])] -= scale
	}
	return losses, dz
}

// TestCrossEntropyReference64 checks the float64 cross-entropy gradient
// against central differences of its losses.
func TestCrossEntropyReference64(t *testing.T) {
	const N, V = 10, 11
	z := f64s(randVals(newRand(99), N*V, 3))
	targets := []int32{1, -1, 10, 0, 3, 3, -1, 7, 2, 9}
	_, dz := crossEntropy64(z, targets, N, V, 0.25)
	fdCheck(t, "cross entropy", func(v []float64) float64 {
		l, _ := crossEntropy64(v, targets, N, V, 0)
		var s float64
		for _, x := range l {
			s += 0.25 * x
		}
		return s
	}, z, dz, 1e-6)
}

// TestCrossEntropyReferenceIsTheOp: CrossEntropyForwardBackward gives the
// bits of the backend's op on 3 threads (12 rows split 3 ways), with and
// without the gradient, and refuses a target beyond the vocabulary before
// writing anything.
func TestCrossEntropyReferenceIsTheOp(t *testing.T) {
	const N, V = 12, 37
	targets := []int32{1, -1, 36, 0, 3, 3, -1, 7, 2, 9, 30, 5}
	for _, scale := range []float32{1.0 / 12, 0} {
		t.Run(fmt.Sprintf("scale=%v", scale), func(t *testing.T) {
			be := newBE(t, Config{Threads: 3})
			s := be.DefaultStream()
			z := randVals(newRand(41), N*V, 4)
			logits, losses := tensorOf(t, be, "logits", backend.F32, z), alloc(t, be, "losses", N, backend.F32)
			ok(t, be.CrossEntropyForwardBackward(s, losses, logits, intsOf(t, be, "targets", targets), N, V, scale))

			l, zz := make([]float32, N), append([]float32(nil), z...)
			ok(t, CrossEntropyForwardBackward(l, zz, targets, N, V, scale))
			same(t, "losses", l, get(t, be, losses))
			same(t, "logits", zz, get(t, be, logits))
		})
	}
	bad := append([]int32(nil), targets...)
	bad[4] = V
	z, l := randVals(newRand(42), N*V, 4), randVals(newRand(43), N, 1)
	z0, l0 := append([]float32(nil), z...), append([]float32(nil), l...)
	if err := CrossEntropyForwardBackward(l, z, bad, N, V, 1); err == nil {
		t.Fatal("a target of V was accepted")
	}
	same(t, "logits after a bad target", z, z0)
	same(t, "losses after a bad target", l, l0)
}
